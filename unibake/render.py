"""Stage 2: render a :class:`ReleasePlan` into a :class:`BuildContext` (pure; golden-tested).

The Dockerfile, entrypoint and self-check come from the Jinja2 templates in
``dockerfiles/templates/``. Every value from YAML reaches them through an escaping filter:
``dq`` for a double-quoted Dockerfile word, ``sh`` for a POSIX shell word, ``json`` for exec form.
Control characters never get this far (the schema refuses them), so no value can end a line.

Layers, least to most often changed: base, engine, shared kernels, per-profile sidecars, tune
caches, overlays, environment + launcher + metadata, the in-image checks, labels.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import jinja2

from .errors import InputError
from .inputs import InputFile
from .plan import INSTALL_ROOT, Kernel, ReleasePlan

TEMPLATES = Path(__file__).resolve().parent.parent / "dockerfiles" / "templates"


@dataclass(frozen=True, kw_only=True)
class ContextFile:
    """One file of the build context: from disk (``source``) or generated (``data``)."""

    name: str  # path inside the context
    mode: int
    sha256: str
    source: Path | None = None
    data: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    """The rendered Dockerfile, the files the build sees, and what ends up where in the image."""

    tag: str
    selection: str  # "all" or the profile names joined by "-"
    dockerfile: str
    entrypoint: str
    self_check: str
    files: tuple[ContextFile, ...]
    baked: tuple[tuple[str, str], ...]  # (path under INSTALL_ROOT, sha256), known before the build

    @property
    def rendered(self) -> dict[str, str]:
        """The reviewable outputs, by file name (as kept under ``dockerfiles/rendered/``)."""
        return {"Dockerfile": self.dockerfile, "entrypoint.sh": self.entrypoint,
                "self-check.sh": self.self_check}


def dq(value: object) -> str:
    """A double-quoted Dockerfile word (ENV, LABEL): backslash, quote and ``$`` escaped."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def sh(value: object) -> str:
    """A single POSIX shell word."""
    return shlex.quote(str(value))


RUNTIME_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def sh_runtime(value: object) -> str:
    """A shell word in which ``${NAME}`` is expanded when the container starts; all else is literal."""
    text = str(value)
    parts, last = [], 0
    for m in RUNTIME_VAR_RE.finditer(text):
        if m.start() > last:
            parts.append(shlex.quote(text[last:m.start()]))
        parts.append(f'"${{{m.group(1)}}}"')
        last = m.end()
    if last < len(text) or not parts:
        parts.append(shlex.quote(text[last:]))
    return "".join(parts)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(dq=dq, sh=sh, sh_runtime=sh_runtime, json=json.dumps, dirname=lambda v: str(v).rsplit("/", 1)[0])
    return env


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def selection_name(plan: ReleasePlan) -> str:
    return "all" if plan.is_unified else "-".join(plan.profile_names)


def _kernel_path(kernel: Kernel, profile: str | None) -> str:
    base = f"profiles/{profile}/kernels" if profile else "kernels"
    return f"{base}/{kernel.name}/{kernel.library}"


def render(plan: ReleasePlan) -> BuildContext:
    """The Dockerfile, entrypoint, self-check and context files of ``plan``. Pure."""
    files: dict[str, ContextFile] = {}
    baked: dict[str, str] = {}

    def add_input(name: str, f: InputFile, image_path: str | None) -> None:
        files[name] = ContextFile(name=name, mode=f.mode, sha256=f.sha256, source=f.absolute)
        if image_path:
            baked[image_path] = f.sha256

    for f in plan.engine.source.files:
        rel = plan.engine.source.relative(f)
        add_input(f"ctx/engine/{rel}", f, f"engine/{rel}")
    for k in plan.kernels:
        for f in k.source.files:
            add_input(f"ctx/kernels/{k.name}/{k.source.relative(f)}", f, None)
    for p in plan.profiles:
        for k in p.sidecars:
            for f in k.source.files:
                add_input(f"ctx/sidecars/{p.name}/{k.name}/{k.source.relative(f)}", f, None)
        if p.tune:
            for f in p.tune.source.files:
                rel = p.tune.source.relative(f)
                add_input(f"ctx/profiles/{p.name}/tune/{rel}", f, f"profiles/{p.name}/tune/{rel}")
    for o in plan.overlays:
        add_input(f"ctx/overlays/{o.target}", o.source.files[0], f"engine/{o.target}")

    shared_env = plan.env_common
    profiles = []
    for p in plan.profiles:
        kernels = p.kernels(plan.kernels)
        own = {k.name for k in p.sidecars}
        paths = [_kernel_path(k, p.name if k.name in own else None) for k in kernels]
        profiles.append({
            "name": p.name, "gpus": p.gpus, "args": list(p.args),
            "env": {k: v for k, v in p.env.items() if k not in shared_env},
            "kernels": [f"{INSTALL_ROOT}/{x}" for x in paths],
            "kernel_dirs": [f"{INSTALL_ROOT}/{x.rsplit('/', 1)[0]}" for x in paths],
            "tune_dir": f"{INSTALL_ROOT}/profiles/{p.name}/tune" if p.tune else "",
            "tune_expect": "" if not p.tune or p.tune.expect is None else p.tune.expect,
        })
    engine_py = any(path.startswith("engine/") and path.endswith(".py") for path in baked)
    has_kernels = bool(plan.kernels) or any(p.sidecars for p in plan.profiles)
    builds = [{"kernel": k, "out": _kernel_path(k, None), "src": f"/src/kernels/{k.name}"}
              for k in plan.kernels]
    builds += [{"kernel": k, "out": _kernel_path(k, p.name), "src": f"/src/sidecars/{p.name}/{k.name}"}
               for p in plan.profiles for k in p.sidecars]
    for b in builds:
        k = b["kernel"]
        b["c_files"] = [f"{b['src']}/{k.source.relative(f)}" for f in k.source.files if f.path.endswith(".c")]

    env = _environment()
    values = dict(plan=plan, root=INSTALL_ROOT, profiles=profiles, shared_env=shared_env,
                  has_kernels=has_kernels, builds=builds, engine_py=engine_py,
                  has_sidecars=any(p.sidecars for p in plan.profiles),
                  has_tune=any(p.tune for p in plan.profiles), components=plan.components,
                  names=",".join(plan.profile_names))
    entrypoint = env.get_template("entrypoint.sh.j2").render(**values)
    self_check = env.get_template("self-check.sh.j2").render(**values)
    for name, text in (("entrypoint.sh", entrypoint), ("self-check.sh", self_check)):
        data = text.encode()
        files[f"ctx/meta/{name}"] = ContextFile(name=f"ctx/meta/{name}", mode=0o755, sha256=_sha(data), data=data)
        baked[f"meta/{name}"] = _sha(data)
    release = json.dumps({
        "product": plan.product, "version": plan.version, "tag": plan.tag,
        "default_profile": plan.default_profile,
        "profiles": {p.name: {"gpus": p.gpus, "vendor": p.vendor, "kernels": pr["kernels"],
                              "tune_caches": len(p.tune.json_files) if p.tune else 0,
                              "smoke": {"expect_reply": p.smoke.expect_reply, "prompt": p.smoke.prompt,
                                        "timeout": p.smoke.timeout},
                              "sidecars": [{"name": k.name, "version": k.version} for k in p.sidecars],
                              "args": list(p.args)}
                     for p, pr in zip(plan.profiles, profiles)},
        "components": [c.__dict__ for c in plan.components],
        "launch": {"port": plan.launch.port, "model_name": plan.launch.model_name, "mounts": plan.launch.mounts},
    }, indent=2, sort_keys=True).encode() + b"\n"
    files["ctx/meta/release.json"] = ContextFile(name="ctx/meta/release.json", mode=0o644, sha256=_sha(release),
                                                 data=release)
    baked["meta/release.json"] = _sha(release)
    manifest = "".join(f"{digest}  {path}\n" for path, digest in sorted(baked.items())).encode()
    files["ctx/meta/files.sha256"] = ContextFile(name="ctx/meta/files.sha256", mode=0o644, sha256=_sha(manifest),
                                                 data=manifest)
    dockerfile = env.get_template("Dockerfile.j2").render(**values)
    files["Dockerfile"] = ContextFile(name="Dockerfile", mode=0o644, sha256=_sha(dockerfile.encode()),
                                      data=dockerfile.encode())
    return BuildContext(tag=plan.tag, selection=selection_name(plan), dockerfile=dockerfile,
                        entrypoint=entrypoint, self_check=self_check,
                        files=tuple(files[n] for n in sorted(files)), baked=tuple(sorted(baked.items())))


def context_texts(context: BuildContext, limit: int = 32 << 20):
    """(name, bytes) of every context file up to ``limit`` bytes, for the sanitisation gate."""
    for f in context.files:
        if f.data is not None:
            yield f.name, f.data
        elif f.source is not None and f.source.stat().st_size <= limit:
            yield f.name, f.source.read_bytes()


def write_context_tar(context: BuildContext, fileobj: BinaryIO, *, mtime: int) -> None:
    """The build context as a reproducible tar: sorted, root-owned, one fixed mtime."""
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for f in context.files:
            parts = f.name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
                    tar.addfile(info)
            info = tarfile.TarInfo(f.name)
            info.mode, info.mtime = f.mode, mtime
            if f.data is not None:
                info.size = len(f.data)
                tar.addfile(info, io.BytesIO(f.data))
            else:
                assert f.source is not None
                with open(f.source, "rb") as fh:
                    info.size = fh.seek(0, 2)
                    fh.seek(0)
                    reader = _HashingReader(fh)
                    tar.addfile(info, reader)
                if reader.hexdigest() != f.sha256:
                    raise InputError(f"{f.source}: changed while the build context was written; "
                                     "run the build again")


class _HashingReader:
    """A file wrapper that hashes what it hands out, to catch an input edited mid-build."""

    def __init__(self, fh: BinaryIO):
        self._fh, self._h = fh, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        self._h.update(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def write_rendered(context: BuildContext, root: Path) -> Path:
    """Write the reviewable outputs to ``dockerfiles/rendered/<selection>/``; returns the folder."""
    out = root / "dockerfiles" / "rendered" / context.selection
    out.mkdir(parents=True, exist_ok=True)
    for name, text in context.rendered.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)
    return out
