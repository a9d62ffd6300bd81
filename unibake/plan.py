"""Stage 1: load + validate + merge the YAMLs into a :class:`ReleasePlan`.

The plan is everything later stages need and nothing they must look up again: the profiles that
were selected, every source hashed, the lock checked, the image tag decided.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .inputs import LOCK_FILE, InputFile, Source, check_lock, read_lock, read_source
from .metadata import Component
from .platforms import KNOWN as PLATFORMS, DEFAULT as DEFAULT_PLATFORM, Platform, host, parse as parse_platforms
from .profiles import MergedProfile, load_profiles
from .sanitise import enforce, scan_values
from .schema import RESERVED_ENV, RESERVED_ENV_PREFIX, RESERVED_LABEL_PREFIXES, VERSION_RE, default_of

INSTALL_ROOT = "/opt/unibake"


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """A native kernel compiled from C sources into ``lib<name>.so``."""

    name: str
    version: str
    source: Source
    cflags: tuple[str, ...]

    @property
    def library(self) -> str:
        return f"lib{self.name}.so"


@dataclass(frozen=True, kw_only=True)
class Overlay:
    source: Source
    target: str  # relative to the engine folder


@dataclass(frozen=True, kw_only=True)
class TuneCaches:
    source: Source
    expect: int | None

    @property
    def json_files(self) -> tuple[InputFile, ...]:
        return tuple(f for f in self.source.files
                     if "/" not in self.source.relative(f) and f.path.endswith(".json"))


@dataclass(frozen=True, kw_only=True)
class Smoke:
    expect_reply: str | None
    prompt: str
    timeout: int


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One tensor-parallel layout of the unified image."""

    name: str
    file: str
    gpus: int
    vendor: str
    env: dict[str, str]
    args: tuple[str, ...]
    sidecars: tuple[Kernel, ...]
    tune: TuneCaches | None
    smoke: Smoke

    def kernels(self, shared: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        """The kernels this profile loads: the shared ones, a sidecar replacing its namesake."""
        own = {k.name: k for k in self.sidecars}
        return tuple(own.pop(k.name, k) for k in shared) + tuple(own.values())


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    name: str
    version: str
    source: Source
    command: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Launch:
    port: int
    model_name: str
    mounts: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    run: str


@dataclass(frozen=True, kw_only=True)
class ReleasePlan:
    """The validated, merged and hashed description of one image to build."""

    product: str
    version: str
    tag: str  # full reference: product:version[-profile...]
    default_profile: str
    profiles: tuple[Profile, ...]
    known_profiles: tuple[str, ...]
    base_image: str
    builder_image: str | None
    engine: EngineSpec
    kernels: tuple[Kernel, ...]
    overlays: tuple[Overlay, ...]
    labels: dict[str, str]
    checks: tuple[Check, ...]
    launch: Launch
    project_root: Path
    config_dir: Path
    config_files: tuple[str, ...]  # relative to project_root
    inputs: tuple[InputFile, ...]
    sanitise_allow: tuple[str, ...] = ()
    platform: Platform = PLATFORMS[DEFAULT_PLATFORM]  # the one this plan builds for

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    @property
    def is_unified(self) -> bool:
        return self.profile_names == self.known_profiles

    @property
    def env_common(self) -> dict[str, str]:
        """Variables with the same value in every selected profile: baked as image ENV."""
        first, *rest = [p.env for p in self.profiles]
        return {k: v for k, v in first.items() if all(r.get(k) == v for r in rest)}

    @property
    def components(self) -> tuple[Component, ...]:
        out = [Component(kind="engine", name=self.engine.name, version=self.engine.version,
                         digest=self.engine.source.digest)]
        out += [Component(kind="kernel", name=k.name, version=k.version, digest=k.source.digest)
                for k in self.kernels]
        out += [Component(kind="overlay", name=str(i), version=o.target, digest=o.source.digest)
                for i, o in enumerate(self.overlays)]
        for p in self.profiles:
            out += [Component(kind="sidecar", name=k.name, version=k.version, digest=k.source.digest,
                              profile=p.name) for k in p.sidecars]
            if p.tune:
                out.append(Component(kind="tune_caches", name=p.name, version=str(len(p.tune.json_files)),
                                     digest=p.tune.source.digest, profile=p.name))
        return tuple(out)

    def profile(self, name: str) -> Profile:
        return next(p for p in self.profiles if p.name == name)


def display_path(path: Path, cwd: Path) -> str:
    try:
        return str(path.resolve().relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


def select_profiles(requested: list[str], known: list[str]) -> list[str]:
    """``all`` (or nothing) means every profile; otherwise the named ones, each known."""
    if not requested or requested == ["all"]:
        return sorted(known)
    if "all" in requested:
        raise InputError("--profile all cannot be combined with other profile names")
    for name in requested:
        if name not in known:
            raise InputError(f"unknown profile '{name}' (--profile); known: {', '.join(sorted(known))}")
    return sorted(set(requested))


def product_platforms(config_dir: Path, cwd: Path | None = None) -> tuple[Platform, ...]:
    """The platforms product.yaml's ``platform`` names, in order; the host's when it names none."""
    product_doc, _ = load_profiles(config_dir.resolve(), (cwd or Path.cwd()).resolve())
    return _platforms_of(product_doc)


def _platforms_of(product_doc) -> tuple[Platform, ...]:
    value = product_doc.data.get("platform")
    return parse_platforms(value, product_doc.where(("platform",))) if value is not None else (host(),)


def make_plan(config_dir: Path, *, profiles: list[str] | None = None, version: str | None = None,
              cwd: Path | None = None, verify_lock: bool = True, allow: tuple[str, ...] = (),
              platform: Platform | None = None) -> ReleasePlan:
    """Load, validate and merge the YAMLs in ``config_dir``; hash every input; check the lock; scan
    every value that will be baked for secrets, before anything is rendered or built.

    ``platform``: the one to build for (default: product.yaml's, the first when it names several; else
    the host's); a platform other than linux/amd64 adds its architecture to the tag."""
    cwd = cwd or Path.cwd()
    config_dir = config_dir.resolve()
    root = config_dir.parent
    product_doc, merged = load_profiles(config_dir, cwd.resolve())
    data = product_doc.data
    platform = platform or _platforms_of(product_doc)[0]
    selected = select_profiles(list(profiles or []), list(merged))
    if version is not None and not VERSION_RE.fullmatch(version):
        raise InputError(f"--version {version!r} is not a valid version: letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit")
    version = version or data["version"]

    def where(path: tuple) -> str:
        return product_doc.where(path)

    engine_data = data["engine"]
    if not engine_data["command"]:
        raise InputError(f"{where(('engine', 'command'))}: engine.command must name a program")
    engine = EngineSpec(name=engine_data["name"], version=engine_data["version"],
                        source=read_source(root, engine_data["source"], where(("engine", "source")),
                                           want="dir"),
                        command=tuple(engine_data["command"]))
    kernels = tuple(_kernel(root, k, lambda p, i=i: where(("kernels", i) + p))
                    for i, k in enumerate(data.get("kernels", [])))
    _unique([k.name for k in kernels], where(("kernels",)), "kernel")
    overlays = tuple(Overlay(source=read_source(root, o["source"], where(("overlays", i, "source")),
                                                want="file"), target=o["target"])
                     for i, o in enumerate(data.get("overlays", [])))
    chosen = [_profile(root, merged[name]) for name in selected]

    default = data["default_profile"]
    if default not in selected:
        default = selected[0]
    needs_builder = kernels or any(p.sidecars for p in chosen)
    builder_data = data.get("builder", {})
    builder = builder_data.get("platforms", {}).get(platform.name, builder_data.get("image"))
    if needs_builder and not builder:
        raise InputError(f"{product_doc.display}: kernels are compiled in a builder stage; set builder.image "
                         "to an image with a C compiler")
    base = data["base"]
    base_key = ("base", "platforms", platform.name) if platform.name in base.get("platforms", {}) else ("base", "image")
    base_image = base["platforms"][platform.name] if len(base_key) == 3 else base["image"]
    if base.get("require_digest") and "@sha256:" not in base_image:
        raise InputError(f"{where(base_key)}: {'.'.join(base_key)} {base_image!r} is given by tag, but "
                         "base.require_digest is set: pin it as name@sha256:<digest>")
    for key in data.get("labels", {}):
        if key.startswith(RESERVED_LABEL_PREFIXES):
            raise InputError(f"{where(('labels', key))}: label '{key}' is set by unibake; choose another key")
    for key in data.get("env", {}):
        _check_env_key(key, where(("env", key)))
    allow_yaml = tuple(data.get("sanitise", {}).get("allow", []))
    for i, pattern in enumerate(allow_yaml):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(f"{where(('sanitise', 'allow', i))}: sanitise.allow[{i}] is not a regular "
                             f"expression: {exc}") from None
    _scan_values(data, where, [merged[name] for name in selected], allow + allow_yaml)
    launch = data.get("launch", {})
    tag_suffix = "" if selected == sorted(merged) else "-" + "-".join(selected)
    tag = f"{data['product']}:{version}{tag_suffix}{platform.suffix}"
    if len(tag.split(":", 1)[1]) > 128:
        raise InputError(f"the tag {tag!r} is longer than 128 characters; select fewer profiles")

    inputs = list(engine.source.files)
    for k in kernels:
        inputs += k.source.files
    for o in overlays:
        inputs += o.source.files
    for p in chosen:
        for k in p.sidecars:
            inputs += k.source.files
        if p.tune:
            inputs += p.tune.source.files
    if verify_lock:
        lock_path = config_dir / LOCK_FILE
        lock_display = display_path(lock_path, cwd)
        if not lock_path.exists():
            raise InputError(f"{lock_display}: the inputs lock is missing; create it with: python build.py lock")
        sources = [engine.source.path] + [k.source.path for k in kernels] + [o.source.path for o in overlays]
        sources += [k.source.path for p in chosen for k in p.sidecars] + [p.tune.source.path for p in chosen if p.tune]
        check_lock(inputs, read_lock(lock_path, lock_display), lock_display, tuple(sources))

    return ReleasePlan(
        product=data["product"], version=version, tag=tag, default_profile=default,
        profiles=tuple(chosen), known_profiles=tuple(sorted(merged)),
        base_image=base_image, builder_image=builder if needs_builder else None,
        engine=engine, kernels=kernels, overlays=overlays, labels=dict(data.get("labels", {})),
        checks=tuple(Check(name=c["name"], run=c["run"]) for c in data.get("checks", [])),
        launch=Launch(port=launch.get("port", default_of("launch", "port")),
                      model_name=launch.get("model_name", data["product"]),
                      mounts=dict(launch.get("mounts", {}))),
        project_root=root, config_dir=config_dir,
        config_files=tuple(sorted({(cwd / f).resolve().relative_to(root).as_posix()
                                   for m in merged.values() for f in m.chain})),
        inputs=tuple(sorted({f.path: f for f in inputs}.values(), key=lambda f: f.path)),
        sanitise_allow=allow_yaml, platform=platform,
    )


def _scan_values(data: dict, where, chosen: list[MergedProfile], allow: tuple[str, ...]) -> None:
    """Env, labels, args, checks and run-time names are baked into the image: a secret there is
    refused now, naming the YAML key, before anything is rendered or built."""
    values = [(f"{where(('env', k))}: env.{k}", k, v) for k, v in data.get("env", {}).items()]
    values += [(f"{where(('labels', k))}: labels.{k}", "", v) for k, v in data.get("labels", {}).items()]
    values += [(f"{where(('checks', i, 'run'))}: checks[{i}].run", "", c.get("run", ""))
               for i, c in enumerate(data.get("checks", []))]
    values += [(f"{where(('launch', 'model_name'))}: launch.model_name", "", data.get("launch", {}).get("model_name", ""))]
    for m in chosen:
        values += [(f"{m.where(('env', k))}: env.{k}", k, v) for k, v in m.data.get("env", {}).items()]
        values += [(f"{m.where(('args', i))}: args[{i}]", "", a) for i, a in enumerate(m.data.get("args", []))]
    enforce(scan_values(v for v in values if isinstance(v[2], str)), allow, "the profiles")


def _kernel(root: Path, data: dict, where) -> Kernel:
    source = read_source(root, data["source"], where(("source",)), want="dir")
    if not any(f.path.endswith(".c") for f in source.files):
        raise InputError(f"{where(('source',))}: kernel source '{data['source']}' holds no .c file")
    return Kernel(name=data["name"], version=data["version"], source=source,
                  cflags=tuple(data.get("cflags", [])))


def _check_env_key(key: str, where: str) -> None:
    if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIX):
        raise InputError(f"{where}: env key '{key}' is set by the image itself (PORT and MODEL_NAME come "
                         "from launch:); choose another name")


def _unique(names: list[str], where: str, what: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise InputError(f"{where}: {what} '{n}' is listed twice")
        seen.add(n)


def _profile(root: Path, m: MergedProfile) -> Profile:
    d = m.data
    sidecars = tuple(_kernel(root, k, lambda p, i=i: m.where(("sidecars", i) + p))
                     for i, k in enumerate(d.get("sidecars", [])))
    _unique([k.name for k in sidecars], m.where(("sidecars",)), "sidecar")
    tune = None
    if "tune_caches" in d:
        t = d["tune_caches"]
        if "source" not in t:
            raise InputError(f"{m.where(('tune_caches',))}: tune_caches.source is required for profile "
                             f"'{m.name}'")
        tune = TuneCaches(source=read_source(root, t["source"], m.where(("tune_caches", "source")),
                                             want="dir"), expect=t.get("expect"))
        found = len(tune.json_files)
        if tune.expect is not None and found != tune.expect:
            raise InputError(f"{m.where(('tune_caches', 'expect'))}: profile '{m.name}' expects "
                             f"{tune.expect} tune-cache JSON files in '{t['source']}', found {found}")
    for key in d.get("env", {}):
        _check_env_key(key, m.where(("env", key)))
    smoke = d.get("smoke", {})
    return Profile(name=m.name, file=m.file, gpus=d["gpus"],
                   vendor=d.get("devices", {}).get("vendor", default_of("devices", "vendor")),
                   env=dict(d.get("env", {})), args=tuple(d.get("args", [])), sidecars=sidecars, tune=tune,
                   smoke=Smoke(expect_reply=smoke.get("expect_reply"),
                               prompt=smoke.get("prompt", default_of("smoke", "prompt")),
                               timeout=smoke.get("timeout", default_of("smoke", "timeout"))))
