"""Stage 1: load + validate + merge the YAMLs into a :class:`ReleasePlan`.

The plan is everything later stages need and nothing they must look up again: the profiles that
were selected, every source hashed, the lock checked, the image tag decided.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import posixpath
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .envfile import EnvFile, fingerprint
from .errors import InputError
from .files import open_regular, read_small_text
from .inputs import (LOCK_FILE, SKIPPED_DIRS, InputFile, Source, check_lock, file_and_folder, read_external,
                     read_lock, read_source)
from .metadata import Component
from .notes import MAX_TEXT, Notes, read_notes
from .patches import Patch, PatchedFile, apply_patches, read_patch
from .prebuilt import SO_RE, Prebuilt, check_libraries, kind_of, read_prebuilt
from .platforms import (KNOWN as PLATFORMS, DEFAULT as DEFAULT_PLATFORM, Platform, host, key_for,
                        parse as parse_platforms)
from .profiles import MergedProfile, dotted, load_profiles
from .regexsafe import check_regex
from .sanitise import Finding, check_allow, command_words, enforce, scan_bytes, scan_release_texts, scan_values
from .templates import RUNTIME_VAR_RE, mount_var
from .schema import (IMAGE_ID_RE, PATH_RE, RESERVED_ENV, RESERVED_ENV_PREFIX, RESERVED_LABEL_PREFIXES, RESERVED_LABELS,
                     TOPOLOGY_ENV, VERSION_RE, default_of, shm_bytes)

INSTALL_ROOT = "/opt/unibake"
# what the entrypoint sets before it starts the engine (templates/entrypoint.sh.j2), besides the profile's env
ENTRYPOINT_ENV = frozenset({"PROFILE", "UNIBAKE_ROOT", "UNIBAKE_PYTHON_DIRS", "UNIBAKE_GPUS", "UNIBAKE_KERNELS",
                            "UNIBAKE_KERNEL_DIRS", "UNIBAKE_TUNE_DIR", "UNIBAKE_TUNE_EXPECT", "PYTHONPATH"})
SHELL_EXPANSION_RE = re.compile(r"\$[A-Za-z_{(]")  # what a shell would expand and the entrypoint does not


@dataclass(frozen=True, kw_only=True)
class KernelBuild:
    """How a kernel is built when not with ``cc``: in ``image``, by a shell command or a make target."""

    image: str  # the builder image (FROM): a reference, or an image ID
    run: str | None
    make: str | None


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """A native kernel: compiled in a builder stage (from C with ``cc`` by default, or as ``build``
    says), or prebuilt and taken as it is; its ``outputs`` are the ``.so`` files a profile loads."""

    name: str
    version: str
    source: Source | None  # the sources it is compiled from; None when prebuilt
    cflags: tuple[str, ...]
    outputs: tuple[str, ...]  # relative to the kernel's folder
    builder: str | None = None  # the image it is compiled in (None: prebuilt)
    build: KernelBuild | None = None  # None: cc on the C sources
    prebuilt: Prebuilt | None = None

    @property
    def library(self) -> str:
        return self.outputs[0]

    @property
    def digest(self) -> str:
        return self.prebuilt.file.sha256 if self.prebuilt else self.source.digest  # type: ignore[union-attr]

    @property
    def files(self) -> tuple[InputFile, ...]:
        return (self.prebuilt.file,) if self.prebuilt else self.source.files  # type: ignore[union-attr]

    @property
    def is_wheel(self) -> bool:
        return self.prebuilt is not None and self.prebuilt.kind == "zip"


@dataclass(frozen=True, kw_only=True)
class Overlay:
    source: Source
    target: str  # relative to the engine folder ("." is the folder itself)
    name: str
    md5: bool = False

    def files(self) -> tuple[tuple[str, InputFile], ...]:
        """(path relative to the engine folder, file) of everything it copies."""
        base = "" if self.target in (".", "./") else self.target.rstrip("/")
        if not self.source.is_dir:
            return ((base, self.source.files[0]),)
        return tuple(("/".join(filter(None, (base, self.source.relative(f)))), f) for f in self.source.files)


@dataclass(frozen=True, kw_only=True)
class TuneCaches:
    source: Source
    expect: int | None

    @property
    def json_files(self) -> tuple[InputFile, ...]:
        return tuple(f for f in self.source.files
                     if "/" not in self.source.relative(f) and f.path.endswith(".json"))


@dataclass(frozen=True, kw_only=True)
class SmokePrompt:
    prompt: str
    expect: str | None
    match: str  # exact | contains | regex


@dataclass(frozen=True, kw_only=True)
class Smoke:
    prompts: tuple[SmokePrompt, ...]
    timeout: int
    skip: str | None = None  # why the gate is skipped (smoke.skip), or None: it runs


@dataclass(frozen=True, kw_only=True)
class Devices:
    vendor: str
    extra: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Topology:
    nodes: int
    network: str  # host | bridge
    ipc: str  # host | private | shareable
    shm_size: str | None
    rdma: bool
    master_port: int


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One tensor-parallel layout of the unified image."""

    name: str
    file: str
    gpus: int
    devices: Devices
    topology: Topology
    env: dict[str, str]
    env_files: tuple[EnvFile, ...]
    args: tuple[str, ...]
    sidecars: tuple[Kernel, ...]
    tune: TuneCaches | None
    smoke: Smoke
    env_where: dict[str, str] = field(default_factory=dict, compare=False, repr=False)  # each key's FILE:LINE

    @property
    def vendor(self) -> str:
        return self.devices.vendor

    @property
    def env_sha256(self) -> str:
        return fingerprint(self.env)

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
    base_image: str  # what FROM names: the reference, or the image ID it is pinned by
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
    base_name: str = ""  # base.image as written, when FROM names an image ID
    patches: tuple[Patch, ...] = ()
    patched: dict[str, PatchedFile] = field(default_factory=dict)  # engine-relative path: what the patches made
    notes: Notes = field(default_factory=Notes)
    platform: Platform = PLATFORMS[DEFAULT_PLATFORM]  # the one this plan builds for
    # config_files and inputs.lock as they were planned from (path from project_root -> bytes): what the
    # provenance hashes and the kit holds, not the files as an edit during the build left them
    config_bytes: dict[str, bytes] = field(default_factory=dict, repr=False)
    # the sources the profiles not selected bake (tune caches, sidecars), as written: not read for this plan
    other_sources: tuple[str, ...] = ()

    def config_data(self, rel: str) -> bytes:
        """A profile file or the lock (``rel`` from the project root) as it was planned from."""
        return self.config_bytes[rel] if rel in self.config_bytes else (self.project_root / rel).read_bytes()

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    @property
    def toolchain_images(self) -> tuple[str, ...]:
        """The images a kernel or sidecar is compiled in (its ``build.image``) other than
        ``builder_image``: materials of the release like the base and the builder."""
        used = {k.builder for k in self.kernels} | {k.builder for p in self.profiles for k in p.sidecars}
        return tuple(sorted(used - {None, self.builder_image}))

    @property
    def from_images(self) -> tuple[tuple[str, str], ...]:
        """(role, reference) of every image the Dockerfile's FROM lines name: the images the kernels
        compiled here are compiled in, and the base."""
        compiled = [k for k in self.kernels if k.prebuilt is None]
        compiled += [k for p in self.profiles for k in p.sidecars if k.prebuilt is None]
        builders = dict.fromkeys(k.builder for k in compiled if k.builder)
        return tuple(("builder image" if image == self.builder_image else "toolchain image", image)
                     for image in builders) + (("base image", self.base_image),)

    @property
    def is_unified(self) -> bool:
        return self.profile_names == self.known_profiles

    @property
    def env_common(self) -> dict[str, str]:
        """Variables with the same value in every selected profile: baked as image ENV."""
        first, *rest = [p.env for p in self.profiles]
        return {k: v for k, v in first.items() if all(r.get(k) == v for r in rest)}

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the build will do that the sources may not expect: one line per source."""
        return self.source_warnings + self.unset_warnings()

    def input_folders(self) -> list[tuple[str, Path]]:
        """The folders whose every file is an input (each named as a message says it, and its real path):
        every folder source, the engine's, the tune caches', ..., of every profile. (The profiles folder
        is not one: only its top-level YAML files and its lock are read.)"""
        folders = []
        for src in _sources(self.engine, self.kernels, self.overlays, self.profiles):
            if src.is_dir:
                folders.append((f"'{src.path}', a folder the image bakes", (self.project_root / src.path).resolve()))
        for rel in self.other_sources:  # another selection's image bakes them
            try:
                real = (self.project_root / rel).resolve()
            except (OSError, RuntimeError):  # (a loop: that selection's plan says so)
                continue
            if real.is_dir():
                folders.append((f"'{rel}', a folder the image of another profile selection bakes", real))
        return folders

    def input_folder_holding(self, path: Path) -> str | None:
        """The folder of :meth:`input_folders` that ``path`` is or lies in (as a message names it), or None:
        a file written there is an input of the next build."""
        real = path.resolve()
        return next((what for what, folder in self.input_folders() if real == folder or folder in real.parents),
                    None)

    @property
    def source_warnings(self) -> tuple[str, ...]:
        """The warnings but the unset ``${NAME}`` ones, which the build says knowing the base's ENV."""
        out = []
        for src in {s.path: s for s in _sources(self.engine, self.kernels, self.overlays, self.profiles)}.values():
            if src.empty_folders:  # git keeps none either: a fresh checkout would build the same image
                n = len(src.empty_folders)
                shown = ", ".join(f"'{f}'" for f in src.empty_folders[:3]) + (f" and {n - 3} more" if n > 3 else "")
                out.append(f"{src.path}: {_count(n, 'empty folder')} ({shown}) not in the image, which gets files "
                           "only; put a file in one the engine needs")
        # docker run --env-file keeps a value as written after the '=' (KEY="x" is the 3 characters "x", A=1 # note
        # is "1 # note"), and so does the image's ENV: a file written for a shell or docker compose (which strip
        # quotes and comments) gave the engine the quotes, the comment or a trailing space
        for e in {e.source.path: e for p in self.profiles for e in p.env_files}.values():
            kept = [(k, what) for k, v in e.values.items() if (what := _kept_by_docker(v))]
            if kept:
                (key, what), more = kept[0], len(kept) - 1
                others = f" (and {_count(more, 'more key')} of this file)" if more else ""
                out.append(f"{e.display}:{e.lines[key]}: {key}={e.values[key][:60]} keeps {what}{others}, as "
                           "docker run --env-file does (a shell or docker compose would strip it): the engine "
                           "gets it as part of the value; remove it unless the engine needs it")
        # an env value is baked as written (the entrypoint's export of a quoted word, the image's ENV escaped): a
        # $NAME, ${NAME} or $(...) in it reaches the engine as these characters, where a shell, a compose file and
        # the args (for ${NAME}) would expand it
        expanded: dict[tuple[str, str], str] = {}
        for p in self.profiles:
            for key, value in p.env.items():
                if not SHELL_EXPANSION_RE.search(value):
                    continue
                expanded.setdefault((p.env_where.get(key, p.file), key), value)
        for (where, key), value in expanded.items():
            out.append(f"{where}: env {key}={value[:60]} is passed as it is written: env values are never expanded "
                       "($NAME, ${NAME} and $(...) reach the engine as these characters); write the value itself")
        # a prompt its own check passes (contains or a regex, the expected text in the prompt: "Reply with exactly:
        # X_OK", match contains X_OK): an engine that echoes the prompt, or an error that quotes it, passes the gate
        echoed: dict[tuple[str, str, str], str] = {}
        for p in self.profiles:
            for n, check in enumerate(p.smoke.prompts, 1):
                if check.expect is not None and _passes_itself(check):
                    echoed.setdefault((check.prompt, check.match, check.expect),
                                      f"{p.file}: smoke prompt {n}" if len(p.smoke.prompts) > 1 else f"{p.file}: smoke")
        for (prompt, match, expect), where in echoed.items():
            out.append(f"{where}: the prompt itself passes its check (match: {match} {expect[:60]!r}): an engine that "
                       "echoes the prompt, or an error message that quotes it, would pass the gate; " +
                       ("ask for a reply the prompt does not hold" if match == "exact" else
                        "use match: exact, or an expected text the prompt does not hold"))
        # two kernels a profile loads that give one library file name: LD_LIBRARY_PATH lists their folders in
        # order, so a library linked against it, or an engine's dlopen of it by name, gets the first one alone
        # (a sidecar of a shared kernel's name replaces it instead, as meant)
        clashes: dict[tuple[str, str, str], list[str]] = {}
        for p in self.profiles:
            first: dict[str, str] = {}
            for k in p.kernels(self.kernels):
                for lib in dict.fromkeys(posixpath.basename(o) for o in k.outputs):
                    if first.setdefault(lib, k.name) != k.name:
                        clashes.setdefault((lib, first[lib], k.name), []).append(p.name)
        for (lib, one, other), names in clashes.items():
            out.append(f"kernels '{one}' and '{other}' both give {lib} (profile {', '.join(names)}): LD_LIBRARY_PATH "
                       f"lists {one}'s folder first, so a library or engine that loads {lib} by name gets {one}'s "
                       f"alone; give each library its own name, or drop one kernel")
        # the engine starts in the base image's working directory, its bare names looked up on PATH: an engine
        # file named as the source folder shows it (serve.sh, ./serve.sh) was not found at every smoke gate
        # (python3 serve.py, sh serve.sh: a script's name is relative to it too)
        engine_files = {self.engine.source.relative(f) for f in self.engine.source.files}
        engine_files |= {path for o in self.overlays for path, _ in o.files()}
        for word in dict.fromkeys(self.engine.command):
            relative = posixpath.normpath(word) if word[:1] not in ("/", "-", "") and "$" not in word else ""
            if relative in engine_files:
                out.append(f"engine.command: {word!r} is the engine folder's {relative}, but the engine starts in the "
                           "base image's working directory (a bare program name is looked up on its PATH), not in "
                           f"{INSTALL_ROOT}/engine: write {INSTALL_ROOT}/engine/{relative}")
        # only ${NAME} is expanded when the container starts: $NAME and ${NAME:-default} reach the engine as
        # they are written, which a command copied from a shell script does not expect
        words = {w: "engine.command" for w in self.engine.command}
        for w in dict.fromkeys(w for p in self.profiles for w in p.args):
            if w not in words:
                words[w] = "args of " + ", ".join(p.name for p in self.profiles if w in p.args)
        # IPC not the host's and no shm_size: docker's /dev/shm of 64 MiB, which NCCL/RCCL and an engine's worker
        # processes outgrow on several GPUs ('Bus error', 'failed to extend /dev/shm'), first on the GPU machine
        for p in self.profiles:
            if p.topology.ipc != "host" and p.topology.shm_size is None and (p.gpus > 1 or p.topology.nodes > 1):
                each = f" on each of {p.topology.nodes} nodes" if p.topology.nodes > 1 else ""
                out.append(f"{p.file}: profile {p.name} runs {_count(p.gpus, 'GPU')}{each} with ipc: "
                           f"{p.topology.ipc} and no shm_size, so its /dev/shm is docker's 64 MiB, which NCCL/RCCL "
                           "and the engine's worker processes outgrow: set topology.shm_size (like 16g), or ipc: host")
        # more GPUs named than the profile has (UUIDs: a number past its count is refused): its container is given
        # only its own (run.sh: those of GPUS), and CUDA and ROCm stop at the first named GPU a container lacks;
        # with GPUS=all it has them all, and an engine takes the first it needs: warned, not refused
        for p in self.profiles:
            for key in sorted(VISIBLE_DEVICES_ENV & set(p.env)):
                named = visible_devices_named(p.env[key])
                if len(named) > p.gpus:
                    out.append(f"{p.file}: env {key}={p.env[key][:80]} names {len(named)} GPUs, more than the "
                               f"{p.gpus} of profile {p.name}: its container is given only its {p.gpus} (run.sh's "
                               "GPUS), and CUDA and ROCm stop at the first named GPU the container lacks, hiding "
                               "those after it; name the profile's GPUs alone")
        # a served model name written out that is not launch.model_name: the smoke gate asks for MODEL_NAME, and
        # vLLM answers a request for a model it does not serve with 404
        served: dict[tuple[bool, tuple[str, ...]], list[str]] = {}
        for p in self.profiles:
            seq = list(self.engine.command) + list(p.args)
            at = max((i for i, w in enumerate(seq) if w.split("=", 1)[0] == "--served-model-name"), default=None)
            if at is None:
                continue
            names = tuple(seq[at].split("=", 1)[1:] if "=" in seq[at]
                          else itertools.takewhile(lambda w: not w.startswith("-"), seq[at + 1:]))
            if names and "$" not in "".join(names) and self.launch.model_name not in names:
                served.setdefault((at < len(self.engine.command), names), []).append(p.name)
        for (in_command, names), profiles in served.items():
            what = "engine.command" if in_command else f"args of {', '.join(profiles)}"
            out.append(f"{what}: --served-model-name {' '.join(names)[:80]} does not name launch.model_name "
                       f"{self.launch.model_name!r}, the model the smoke gate and clients ask for (MODEL_NAME): an "
                       "engine that checks it answers 404; write --served-model-name ${MODEL_NAME}, or set "
                       "launch.model_name")
        # a --port given as a number (the plan refuses one that is not launch.port): PORT given at run time
        # would publish a port the engine does not listen on
        for p in self.profiles:
            served = _literal_port({"engine": {"command": self.engine.command}, "args": p.args},
                                   lambda path: "engine.command" if path[0] == "engine" else f"args of {p.name}")
            if served is not None and not any(w.startswith(f"{served[0]}: --port") for w in out):
                out.append(f"{served[0]}: --port {served[1]} is written as a number, so a PORT given at run time "
                           "(run.sh's PORT, docker run -e PORT=...) would not move the engine: write --port ${PORT}")
        for word, what in words.items():
            if SHELL_EXPANSION_RE.search(RUNTIME_VAR_RE.sub("", word)):
                out.append(f"{what}: {word[:80]!r} is passed as it is written but for its ${{NAME}} parts: only "
                           "${NAME} is expanded when the container starts (not $NAME, ${NAME:-default} or $(...))")
        return tuple(out)

    def unset_warnings(self, base_env: Collection[str] | None = None, base: str = "") -> tuple[str, ...]:
        """A ``${NAME}`` of ``engine.command`` or ``args`` that neither unibake, nor the profile's env, nor
        (when known: ``base_env``, the names the base image's ENV sets) the base image sets."""
        out = []
        # a ${NAME} neither the image nor the entrypoint sets stops the start (set -u): said here, not first
        # at the smoke gate
        unset: dict[tuple[str, str, str], list[str]] = {}
        mounts = {f"UNIBAKE_MOUNT_{mount_var(n)}" for n in self.launch.mounts}
        for p in self.profiles:
            # (the entrypoint's /bin/sh sets SHELL_ENV; docker sets NVIDIA_VISIBLE_DEVICES from run.sh's --gpus)
            known = ENTRYPOINT_ENV | RESERVED_ENV | SHELL_ENV | mounts | set(p.env)
            known |= set(TOPOLOGY_ENV) if p.topology.nodes > 1 else set()
            known |= {"NVIDIA_VISIBLE_DEVICES"} if p.vendor == "nvidia" else set()
            for what, word in [("engine.command", w) for w in self.engine.command] + [("args", w) for w in p.args]:
                for name in dict.fromkeys(RUNTIME_VAR_RE.findall(word)):
                    key = (what, name, _run_sh_refuses(name, p.vendor))
                    if name not in known and p.name not in unset.setdefault(key, []):
                        unset[key].append(p.name)
        for (what, name, refused), names in unset.items():
            if base_env is not None and name in base_env:
                continue
            if refused:  # run.sh refuses -e of it (as the plan refuses it in a profile's env): "give it at run
                # time" could not be followed
                out.append(f"{what}: ${{{name}}} of profile {', '.join(names)} {refused}")
            elif base_env is None:
                out.append(f"{what}: ${{{name}}} is set neither by unibake nor by the env of profile {', '.join(names)}: "
                           f"unless the base image sets it, it must be given at run time (docker run -e {name}=...), "
                           "or the engine does not start")
            else:
                by_base = f", nor by the base image {base}" if base else ""
                out.append(f"{what}: ${{{name}}} is set neither by unibake, nor by the env of profile "
                           f"{', '.join(names)}{by_base}: it must be given at run time (docker run -e {name}=...), "
                           "or the engine does not start")
        return tuple(out)

    @property
    def components(self) -> tuple[Component, ...]:
        out = [Component(kind="engine", name=self.engine.name, version=self.engine.version,
                         digest=self.engine.source.digest)]
        out += [Component(kind="kernel", name=k.name, version=k.version, digest=k.digest) for k in self.kernels]
        out += [Component(kind="patch", name=x.name, version=_count(len(x.files), "file"), digest=x.file.sha256)
                for x in self.patches]
        out += [Component(kind="overlay", name=o.name, version=_count(len(o.source.files), "file"),
                          digest=o.source.digest) for o in self.overlays]
        env_files = {e.source.path: e for p in self.profiles for e in p.env_files}
        users = {path: [p.name for p in self.profiles if any(e.source.path == path for e in p.env_files)]
                 for path in env_files}
        # an env file every profile reads is the image's; one that only some read is each of theirs (the
        # notes said "all" of a file two profiles of three read)
        out += [Component(kind="env_file", name=e.source.path, version=_count(len(e.values), "key"),
                          digest=e.source.files[0].sha256, profile=user)
                for path, e in sorted(env_files.items())
                for user in ([""] if len(users[path]) == len(self.profiles) else users[path])]
        for p in self.profiles:
            out += [Component(kind="sidecar", name=k.name, version=k.version, digest=k.digest,
                              profile=p.name) for k in p.sidecars]
            if p.tune:
                out.append(Component(kind="tune_caches", name=p.name, version=str(len(p.tune.json_files)),
                                     digest=p.tune.source.digest, profile=p.name))
        return tuple(out)

    def profile(self, name: str) -> Profile:
        return next(p for p in self.profiles if p.name == name)


def _kept_by_docker(value: str) -> str:
    """What of an env file's value a shell or docker compose would strip but docker keeps ("" when nothing)."""
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        return "its quotes"
    if " #" in value:
        return f"the comment {value[value.index(' #') + 1:][:40]!r}"
    if value.endswith(" "):
        return "its trailing space"
    return ""


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def display_path(path: Path, cwd: Path) -> str:
    """``path`` relative to ``cwd`` when under it; its last part as named (a lock that is a symlink is
    shown as the lock, not as the file it leads to, and one that loops is shown at all)."""
    if path.name not in ("", ".", ".."):
        path = path.parent.resolve() / path.name
    else:
        path = path.resolve()
    try:
        return str(path.relative_to(cwd.resolve()))
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
            parts = [n.strip() for n in name.split(",")]  # as --platform takes them
            hint = (f"; --profile takes one name: repeat it ({' '.join('--profile ' + n for n in parts)})"
                    if len(parts) > 1 and all(n in known for n in parts) else "")
            raise InputError(f"unknown profile '{name}' (--profile); known: {', '.join(sorted(known))}{hint}")
    return sorted(set(requested))


def _same_suffix(selected: list[str], known: list[str]) -> list[str] | None:
    """Another selection of ``known`` profiles whose names joined by '-' spell the same tag suffix as
    ``selected``'s ('a' + 'b-c' and 'a-b' + 'c'), or None. Every profile is no suffix: never another."""
    parts = "-".join(selected).split("-")
    names = set(known)

    # Each way to spell parts[at:] with names after ``last`` (a selection is sorted, each name once), at most three,
    # built from the end (no recursion: a long selection passed the stack): two spellings are refused (``selected``
    # and ``known``), so three hold one that is not, whatever came before. (Tried every way, profiles a, a-a,
    # a-a-a, ... took exponential time: 20 of them, 75 s.)
    longest = max(name.count("-") + 1 for name in names)
    count = len(parts)
    starting: list[list[tuple[int, str]]] = [[] for _ in range(count)]  # the names that begin at each part
    ending: list[set[str]] = [set() for _ in range(count + 1)]  # and those that end before it
    for at in range(count):
        for end in range(at + 1, min(count, at + longest) + 1):
            name = "-".join(parts[at:end])
            if name in names:
                starting[at].append((end, name))
                ending[end].add(name)
    ending[0].add("")
    ways: list[dict[str, list[tuple[str, ...]]]] = [{} for _ in range(count + 1)]
    ways[count] = {last: [()] for last in ending[count]}
    for at in range(count - 1, -1, -1):
        for last in ending[at]:
            found: list[tuple[str, ...]] = []
            for end, name in starting[at]:
                if name > last:
                    found += [(name, *rest) for rest in ways[end].get(name, [])][:3 - len(found)]
                if len(found) == 3:
                    break
            ways[at][last] = found
    return next((list(way) for way in ways[0].get("", []) if list(way) not in (selected, known)), None)


def product_platforms(config_dir: Path, cwd: Path | None = None, *, declared: bool = False) -> tuple[Platform, ...]:
    """The platforms product.yaml's ``platform`` names, in order; the host's when it names none (none
    with ``declared``)."""
    product_doc, _ = load_profiles(config_dir.resolve(), (cwd or Path.cwd()).resolve())
    if declared and product_doc.data.get("platform") is None:
        return ()
    return _platforms_of(product_doc)


def _platforms_of(product_doc) -> tuple[Platform, ...]:
    value = product_doc.data.get("platform")
    return parse_platforms(value, product_doc.where(("platform",))) if value is not None else (host(),)


def make_plan(config_dir: Path, *, profiles: list[str] | None = None, version: str | None = None,
              cwd: Path | None = None, verify_lock: bool = True, require_lock: bool = True,
              allow: tuple[str, ...] = (), platform: Platform | None = None,
              on_product: Callable[[dict], None] = lambda data: None, identity: tuple[str, ...] = (),
              context_limit: int | None = None) -> ReleasePlan:
    """Load, validate and merge the YAMLs in ``config_dir``; hash every input; check the lock; scan
    every value that will be baked for secrets, before anything is rendered or built.

    ``require_lock=False`` (``--stage render``): a missing lock is no error; one that exists is checked.
    ``platform``: the one to build for (default: product.yaml's, the first when it names several; else
    the host's); a platform other than linux/amd64 adds its architecture to the tag. ``on_product``
    sees product.yaml's values once loaded, before any profile is selected (and may refuse them).
    ``identity``: the builder's home folders and user name, which no baked value may hold. ``context_limit``:
    a file of the build context of this many bytes or more is refused by its size, before it is hashed."""
    cwd = cwd or Path.cwd()
    config_dir = config_dir.resolve()
    root = config_dir.parent
    product_doc, merged = load_profiles(config_dir, cwd.resolve())
    data = product_doc.data
    on_product(data)
    platform = platform or _platforms_of(product_doc)[0]
    selected = select_profiles(list(profiles or []), list(merged))
    if version is not None and not VERSION_RE.fullmatch(version):
        raise InputError(f"--version {version!r} is not a valid version: letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit, at most 64 characters (it is the image's tag)")
    given_version = version is not None
    version = version or data["version"]

    def where(path: tuple) -> str:
        return product_doc.where(path)

    engine_data = data["engine"]
    if not engine_data["command"]:
        raise InputError(f"{where(('engine', 'command'))}: engine.command must name a program")
    if not engine_data["command"][0].strip():  # the container failed to start, found only at the smoke gate
        raise InputError(f"{where(('engine', 'command', 0))}: engine.command[0] is {engine_data['command'][0]!r}: "
                         "the first word is the program to run; name it")
    if engine_data["command"][0].startswith("-"):  # the entrypoint's `exec` takes it as its own option
        raise InputError(f"{where(('engine', 'command', 0))}: engine.command[0] is {engine_data['command'][0]!r}: the "
                         "first word is the program to run, and the entrypoint's exec would read this one as an "
                         "option of its own (bash and busybox refuse it, or run something else); name the program, "
                         "like /bin/sh or ./serve.sh")
    engine = EngineSpec(name=engine_data["name"], version=engine_data["version"],
                        source=read_source(root, engine_data["source"], where(("engine", "source")),
                                           want="dir", limit=context_limit),
                        command=tuple(engine_data["command"]))
    patches = tuple(read_patch(root, x, lambda p, i=i: where(("patches", i) + p))
                    for i, x in enumerate(data.get("patches", [])))
    _unique([x.name for x in patches], where(("patches",)), "patch file name (each names a label of the image)")
    patched = apply_patches(engine.source, patches)
    builder_data = data.get("builder", {})
    # a platforms entry names that platform's builder; builder.id pins builder.image
    builder_key = key_for(builder_data.get("platforms", {}), platform, where(("builder", "platforms")))
    builder = builder_data["platforms"][builder_key] if builder_key else \
        builder_data.get("id") or builder_data.get("image")
    kernels = tuple(_kernel(root, k, lambda p, i=i: where(("kernels", i) + p), builder, platform, context_limit)
                    for i, k in enumerate(data.get("kernels", [])))
    _unique([k.name for k in kernels], where(("kernels",)), "kernel")
    engine_files = frozenset(engine.source.relative(f) for f in engine.source.files)
    overlays = tuple(_overlay(root, o, lambda p, i=i: where(("overlays", i) + p), engine_files, context_limit)
                     for i, o in enumerate(data.get("overlays", [])))
    _unique([o.name for o in overlays], where(("overlays",)), "overlay name")
    # self-check says a failure by the check's name: two of one name could not be told apart
    _unique([c["name"] for c in data.get("checks", [])], where(("checks",)), "check name")
    for i, c in enumerate(data.get("checks", [])):
        if not c["run"].strip():
            # sh -c '' exits 0: a check that runs nothing (an unset CI variable templated in) passed every self-check
            raise InputError(f"{where(('checks', i, 'run'))}: check '{c['name']}' runs nothing (its run is "
                             f"{'empty' if not c['run'] else 'blank'}), so it would pass every self-check; give the "
                             "command that checks, or remove the check")
    # one overlay's file where another's (or the engine's, or a patch's new file's) folder goes: the build's
    # COPY cannot make both (a patch's file under an engine file's path made that file a folder: the engine's
    # file was lost, and only the in-image check said so, naming no patch)
    owners = {rel: "the engine" for rel in engine_files if rel not in patched or patched[rel].data is not None}
    for rel, pf in patched.items():
        if pf.data is not None and rel not in engine_files:
            x = next(x for x in reversed(patches) if rel in x.files)
            owners[rel] = f"the patch {x.name} ({x.where})"
    for i, o in enumerate(overlays):
        owners.update({rel: f"overlay '{o.name}' ({where(('overlays', i))})" for rel, _ in o.files()})
    clash = file_and_folder(owners)
    if clash:
        file, inner = clash
        raise InputError(f"{owners[inner]} puts engine/{inner}, so engine/{file} must be a folder, but "
                         f"{owners[file]} puts a file there; change one of their targets")
    # an overlay's file where a patch changed the engine's: the image would hold the overlay's bytes, not the patch's
    for i, o in enumerate(overlays):
        for rel, _ in o.files():
            for x in patches:
                if rel in x.files:
                    raise InputError(f"{where(('overlays', i))}: overlay '{o.name}' replaces engine/{rel}, which the "
                                     f"patch {x.name} ({x.where}) changes, so the image would not have the patch; "
                                     "patch the overlay's file instead, or drop one of them")
    chosen = [_profile(root, merged[name], builder, platform, context_limit) for name in selected]

    default = data["default_profile"]
    if default not in selected:
        default = selected[0]
    uses_builder = builder is not None and any(k.builder == builder for k in kernels) or \
        any(k.builder == builder for p in chosen for k in p.sidecars)
    base = data["base"]
    # a platforms entry names that platform's base; base.id pins base.image (the other platforms' bases)
    named = key_for(base.get("platforms", {}), platform, where(("base", "platforms")))
    base_key = ("base", "platforms", named) if named else ("base", "image")
    base_name = base["platforms"][named] if named else base["image"]
    base_image = base_name if len(base_key) == 3 else base.get("id") or base_name
    # a platform's local base is pinned by its image ID in its own entry: base.id pins base.image only
    pinned = "@sha256:" in base_name or base_image != base_name or IMAGE_ID_RE.fullmatch(base_name) is not None
    if base.get("require_digest") and not pinned:
        local = (f"as {'.'.join(base_key)}: sha256:<image ID> (a local image; base.id pins base.image only)"
                 if len(base_key) == 3 else "with base.id: sha256:<image ID> (a local image)")
        raise InputError(f"{where(base_key)}: {'.'.join(base_key)} {base_name!r} is given by tag, but "
                         f"base.require_digest is set: pin it as name@sha256:<digest> (a registry image) or {local}")
    for key in data.get("labels", {}):
        if key.startswith(RESERVED_LABEL_PREFIXES) or key in RESERVED_LABELS:
            raise InputError(f"{where(('labels', key))}: label '{key}' is set by unibake; choose another key")
    for key in data.get("env", {}):
        _check_env_key(key, where(("env", key)))
    allow_yaml = tuple(data.get("sanitise", {}).get("allow", []))
    for i, pattern in enumerate(allow_yaml):
        check_allow(pattern, f"{where(('sanitise', 'allow', i))}: sanitise.allow[{i}]")
    _scan_values(data, where, [merged[name] for name in selected], allow + allow_yaml, identity)
    launch = data.get("launch", {})
    _check_mounts(launch.get("mounts", {}), lambda name: where(("launch", "mounts", name)))
    if not launch.get("model_name", data["product"]).strip():
        # baked as the image's MODEL_NAME: the engine served a model of no name (--served-model-name ${MODEL_NAME}),
        # run.sh's default was none, and the smoke gate asked for a model named "" after the build
        model_name = launch["model_name"]
        raise InputError(f"{where(('launch', 'model_name'))}: key 'launch.model_name' is "
                         f"{'empty' if not model_name else 'blank'}: it names the model the engine serves and the "
                         "smoke gate and clients ask for (MODEL_NAME); name it, or leave the key out (its default is "
                         f"the product name, {data['product']})")
    tag_suffix = "" if selected == sorted(merged) else "-" + "-".join(selected)
    other = _same_suffix(selected, sorted(merged)) if tag_suffix else None
    if other is not None:
        shared = f"{data['product']}:{version}{tag_suffix}{platform.suffix}"
        single, several = (other, selected) if len(other) == 1 else (selected, other)
        if len(single) == 1:
            raise InputError(f"{merged[single[0]].file}: the profile '{single[0]}' would share the tag {shared} with "
                             f"the profiles {', '.join(several)} built together; rename it")
        raise InputError(f"--profile {' --profile '.join(selected)} would share the tag {shared} (and its release "
                         f"folder) with --profile {' --profile '.join(other)}; rename one of these profiles")
    # the tag is VERSION[-PROFILES][-ARCH]: a version that ends as a selection or a platform does would
    # share its tag and release folder with another build (1.3.1-tp1 for every profile, and 1.3.1 for tp1)
    for ending in sorted(merged) + sorted(p.architecture for p in PLATFORMS.values() if p.suffix):
        if version.endswith(f"-{ending}"):
            source = f"--version {version}" if given_version else where(("version",))
            raise InputError(f"{source}: a version ending in '-{ending}' would share its tag with the "
                             f"{'profile' if ending in merged else 'platform'} {ending}'s release of "
                             f"{version.removesuffix('-' + ending)}; choose another version")
    tag = f"{data['product']}:{version}{tag_suffix}{platform.suffix}"
    if len(tag.split(":", 1)[1]) > 128:
        raise InputError(f"the tag {tag!r} is longer than 128 characters; select fewer profiles")
    notes = read_notes(root, data.get("notes", {}), lambda p: where(("notes",) + p))
    _scan_notes(root, data.get("notes", {}), notes, allow + allow_yaml, identity)

    inputs = list(engine.source.files) + [x.file for x in patches]
    for k in kernels:
        inputs += k.files
    for o in overlays:
        inputs += o.source.files
    for p in chosen:
        for k in p.sidecars:
            inputs += k.files
        if p.tune:
            inputs += p.tune.source.files
        inputs += [e.source.files[0] for e in p.env_files]
    # the lock cannot hold its own sha256: baked (the profiles folder as an overlay, a link to it in the engine),
    # each lock changed it again
    lock_real = Path(os.path.realpath(config_dir / LOCK_FILE))  # a lock that is a looping link is named below
    if any(f.absolute == lock_real for f in inputs):
        holder = next((s.path for s in _sources(engine, kernels, overlays, chosen)
                       if any(f.absolute == lock_real for f in s.files)), LOCK_FILE)
        raise InputError(f"{display_path(config_dir / LOCK_FILE, cwd)}: the source '{holder}' bakes the inputs lock "
                         "into the image, but the lock cannot pin its own sha256 (each build.py lock would change it "
                         "again); bake the files beside it one by one instead")
    held_lock: bytes | None = None
    if verify_lock:
        lock_path = config_dir / LOCK_FILE
        lock_display = display_path(lock_path, cwd)
        config_display = display_path(config_dir, cwd)
        # the command as it must be typed here: without --config it would lock ./profiles instead
        lock_command = "python build.py lock" + ("" if config_display == "profiles" else
                                                  f" --config {shlex.quote(config_display)}")
        # lexists: a lock that is a broken or looping link is named by read_lock, not taken for none
        if os.path.lexists(lock_path) or require_lock:
            if not os.path.lexists(lock_path):
                raise InputError(f"{lock_display}: the inputs lock is missing; create it with: {lock_command}")
            sources = [s.path for s in _sources(engine, kernels, overlays, chosen)]
            sources += [f.path for f in inputs if f.path.startswith("/")]
            lock = read_lock(lock_path, lock_display)
            check_lock(inputs, lock, lock_display, tuple(sources), lock_command)
            if lock.raw is not None:
                held_lock = lock.raw

    # the files as they were parsed and checked, not read again: an edit while the inputs were hashed (minutes,
    # for a big engine) was recorded in the provenance and the kit as the files the image was planned from
    parsed = {(cwd / f).resolve().relative_to(root).as_posix(): m.raw[f] for m in merged.values() for f in m.chain}
    config_files = tuple(sorted(parsed))
    held = dict(parsed)
    if held_lock is not None:
        held[(config_dir / LOCK_FILE).relative_to(root).as_posix()] = held_lock
    # the release's kit carries these files whole, comments and keys no value scan reads included
    found = [f for rel, data in held.items()
             for f in (_scan_yaml(rel, data, allow_yaml) if rel in parsed else scan_bytes(data, rel, addresses=True))]
    enforce(found, allow + allow_yaml, "the profile files (the release's reconstruct kit carries every profile file of "
            "the product as it is, comments too)")
    plan = ReleasePlan(
        product=data["product"], version=version, tag=tag, default_profile=default,
        profiles=tuple(chosen), known_profiles=tuple(sorted(merged)),
        base_image=base_image, builder_image=builder if uses_builder else None,
        engine=engine, kernels=kernels, overlays=overlays, labels=dict(data.get("labels", {})),
        checks=tuple(Check(name=c["name"], run=c["run"]) for c in data.get("checks", [])),
        launch=Launch(port=launch.get("port", default_of("launch", "port")),
                      model_name=launch.get("model_name", data["product"]),
                      mounts=dict(launch.get("mounts", {}))),
        project_root=root, config_dir=config_dir,
        config_files=config_files, config_bytes=held,
        inputs=tuple(sorted({f.path: f for f in inputs}.values(), key=lambda f: f.path)),
        sanitise_allow=allow_yaml, base_name=base_name, patches=patches, patched=patched, notes=notes,
        platform=platform,
        other_sources=tuple(sorted({rel for name in merged if name not in selected
                                    for rel in _profile_sources(merged[name].data)})),
    )
    _check_component_labels(plan.components)
    _check_engine_program(plan, where(("engine", "command", 0)))
    # a FROM line takes a builder stage's name before an image's: base.image 'kernels' was built FROM the
    # compiler stage, silently
    stages = ["kernels"] + [f"kernels{n}" for n in range(2, len(plan.from_images))]  # as render._stages names them
    for i, (role, image) in enumerate(plan.from_images):
        if image in stages[:i]:  # a stage above this FROM
            at = where(base_key) if role == "base image" else where(("kernels",))
            raise InputError(f"{at}: the {role} '{image}' has the name of a builder stage of the Dockerfile above "
                             "its FROM line, which takes the stage before any image; name it with its tag "
                             f"({image}:latest)")
    return plan


def _check_engine_program(plan: ReleasePlan, at: str) -> None:
    """``engine.command[0]`` given as an engine file's path in the image (``/opt/unibake/engine/serve.sh``): that
    file, as the patches and overlays leave it, must be there and executable. A script baked without its
    executable bit was built, exported and round-tripped, then failed every smoke gate (``Permission denied``,
    exit 126); a misspelt name the same way (exit 127)."""
    word = plan.engine.command[0]
    prefix = f"{INSTALL_ROOT}/engine/"
    if not word.startswith(prefix) or "$" in word:
        return
    rel = posixpath.normpath(word[len(prefix):])
    if rel.startswith(".."):
        return
    engine = plan.engine.source
    files = {engine.relative(f): (f.mode, f.path) for f in engine.files}
    for path, patched in plan.patched.items():
        if patched.data is None:
            files.pop(path, None)
        else:
            files[path] = (patched.mode, f"{engine.path.rstrip('/')}/{path} as patched")
    for o in plan.overlays:
        files.update({path: (f.mode, f.path) for path, f in o.files()})
    if rel not in files:
        raise InputError(f"{at}: engine.command[0] '{word}' is no file of the image's engine folder (what "
                         f"{engine.path}, its patches and overlays put in {INSTALL_ROOT}/engine); check the name")
    mode, origin = files[rel]
    if not mode & 0o100:
        raise InputError(f"{at}: engine.command[0] '{word}' is not executable: {origin} is baked with mode "
                         f"{mode:o}; chmod +x it, then run python build.py lock (or start it with its interpreter: "
                         f"[/bin/sh, {word}, ...])")


def _profile_sources(data: dict) -> list[str]:
    """The sources a profile's YAML names inside the project (its tune caches', its sidecars'), unread."""
    named = [data.get("tune_caches", {}).get("source")] + [k.get("source") for k in data.get("sidecars", [])]
    return [rel for rel in named if isinstance(rel, str) and rel and not rel.startswith("/")]


def _sources(engine, kernels, overlays, profiles) -> list[Source]:
    """The folders and files baked from the product: the engine, kernels, overlays, sidecars, tune caches."""
    out = [engine.source] + [k.source for k in kernels if k.source] + [o.source for o in overlays]
    out += [k.source for p in profiles for k in p.sidecars if k.source]
    return out + [p.tune.source for p in profiles if p.tune]


def _check_component_labels(components: tuple[Component, ...]) -> None:
    """Each component is one image label; its key joins profile and name with '.', which both may hold
    ('tp1' + 'x.y' and 'tp1.x' + 'y'), so two could share one key and one would be lost. Released
    images and verifiers read the keys as they are: the collision is refused, the format kept."""
    seen: dict[str, Component] = {}
    for c in components:
        key = c.label[0]
        if key in seen:
            raise InputError(f"{_described(seen[key])} and {_described(c)} would both be recorded in the image "
                             f"label {key}, so one would be lost; rename one of them")
        seen[key] = c


def _described(c: Component) -> str:
    return f"the {c.kind.replace('_', ' ')} '{c.name}'" + (f" of the profile '{c.profile}'" if c.profile else "")


def _scan_values(data: dict, where, chosen: list[MergedProfile], allow: tuple[str, ...],
                 identity: tuple[str, ...]) -> None:
    """Env, labels, args, checks, the engine's command, the smoke gate's prompts and replies, build commands and
    run-time names are baked into the image: a secret there is refused now, naming the YAML key, before anything is
    rendered or built."""
    values = [(f"{where(('env', k))}: env.{k}", k, v) for k, v in data.get("env", {}).items()]
    # a label's key names its value as an env key does (labels.api_token: ...)
    values += [(f"{where(('labels', k))}: labels.{k}", k, v) for k, v in data.get("labels", {}).items()]
    values += [(f"{where(('checks', i, 'run'))}: checks[{i}].run", "", c.get("run", ""))
               for i, c in enumerate(data.get("checks", []))]
    values += [(f"{where(('launch', 'model_name'))}: launch.model_name", "", data.get("launch", {}).get("model_name", ""))]
    # (found by probing: these were caught only in the rendered files, named as Dockerfile:38 or entrypoint.sh:20)
    values += command_words(data.get("engine", {}).get("command", []),
                     lambda i: f"{where(('engine', 'command', i))}: engine.command[{i}]")
    values += [(f"{where(('launch', 'mounts', k))}: launch.mounts.{k}", "", v)
               for k, v in data.get("launch", {}).get("mounts", {}).items()]
    for at, smoke in [(m.where, m.data.get("smoke", {})) for m in chosen]:  # (product.yaml's merged into each)
        values += [(f"{at(('smoke', k))}: smoke.{k}", "", smoke.get(k, "")) for k in ("prompt", "expect_reply")]
        for j, p in enumerate(smoke.get("prompts", [])):
            values += [(f"{at(('smoke', 'prompts', j, k))}: smoke.prompts[{j}].{k}", "", p.get(k, ""))
                       for k in ("prompt", "expect")]
    for m in chosen:
        values += [(f"{m.where(('env', k))}: env.{k}", k, v) for k, v in m.data.get("env", {}).items()]
        values += command_words(m.data.get("args", []), lambda i, m=m: f"{m.where(('args', i))}: args[{i}]")
    # a prebuilt file outside the project is a material of the provenance by its absolute path: one in a
    # home folder (/home/..., /root/..., or the builder's own: HOME=/srv/ci) failed the release's last
    # scan, after the build and the gates
    kernels = [(where, "kernels", i, k) for i, k in enumerate(data.get("kernels", []))]
    kernels += [(m.where, "sidecars", i, k) for m in chosen for i, k in enumerate(m.data.get("sidecars", []))]
    for at, key, i, k in kernels:
        files = [((key, i, "prebuilt"), f"{key}[{i}].prebuilt", k.get("prebuilt"))]
        files += [((key, i, "platforms", p), f"{key}[{i}].platforms.{p}", f) for p, f in k.get("platforms", {}).items()]
        values += [(f"{at(path)}: {name}", "", f) for path, name, f in files if f]
        run = k.get("build", {}).get("run")
        if run:
            values.append((f"{at((key, i, 'build', 'run'))}: {key}[{i}].build.run", "", run))
    # each value once: one that profiles share from product.yaml (its smoke) is one finding, not one a profile
    enforce(scan_values(dict.fromkeys(v for v in values if isinstance(v[2], str)), identity), allow, "the profiles")


def _scan_yaml(rel: str, data: bytes, allow_patterns: tuple[str, ...]) -> list[Finding]:
    """A profile file as the reconstruct kit carries it: every scalar (a key or a value, as parsed: no quote, brace
    or comma of the YAML is part of a finding, so an allow pattern written for the value scan's finding fits it
    here too; the ``sanitise.allow`` patterns themselves are not scanned) and, with the scalars blanked out, what
    lies between them: the comments. Each finding named by the file and line."""
    text = data.decode("utf-8", "surrogateescape")
    try:  # (PyYAML's scanner drops comments, but gives each token's place: the rest is comments and syntax)
        tokens = [t for t in yaml.scan(text, Loader=yaml.SafeLoader) if isinstance(t, yaml.ScalarToken)]
    except yaml.YAMLError:  # (parsed already: never here; scanned whole, as any file)
        return scan_bytes(data, rel, addresses=True)
    rest, found = list(text), []
    for token in tokens:
        start, end = token.start_mark.index, token.end_mark.index
        rest[start:end] = [c if c == "\n" else " " for c in text[start:end]]
        if token.value in allow_patterns:
            continue
        for f in scan_bytes(token.value.encode("utf-8", "surrogateescape"), rel, addresses=True):
            line = token.start_mark.line + int(f.where.rsplit(":", 1)[1])
            found.append(Finding(where=f"{rel}:{line}", kind=f.kind, value=f.value))
    found += scan_bytes("".join(rest).encode("utf-8", "surrogateescape"), rel, addresses=True)
    return found


def _scan_notes(root: Path, data: dict, notes: Notes, allow: tuple[str, ...], identity: tuple[str, ...]) -> None:
    """The notes' files go into the release's texts, whose scan (at publish, after the build, the export
    and the gates) named RELEASE_NOTES.md: scanned now, by their repository file and line, with the same rules
    (the builder's home and name too: found only at publish, they failed the release after every stage)."""
    texts: dict[str, str | bytes] = {data[key]: read_small_text(root / data[key], InputError, limit=MAX_TEXT)
                                     for key in ("changelog", "known_limits") if key in data}
    texts.update({a.file.path: a.read() for a in notes.attachments})
    enforce(scan_release_texts(texts, identity), allow, "the notes' files")


def _kernel(root: Path, data: dict, where, default_builder: str | None, platform: Platform,
            limit: int | None = None) -> Kernel:
    """A kernel or sidecar of the YAML: compiled (from ``source``) or prebuilt, never both; a prebuilt
    one takes ``platforms``' file for ``platform`` when it names one (a vendor ships one per CPU)."""
    name = data["name"]
    if "source" in data and "prebuilt" in data or not {"source", "prebuilt", "platforms"} & set(data):
        raise InputError(f"{where(())}: kernel '{name}' needs either source: (built here) or prebuilt: (taken as "
                         "it is; platforms: names another file for a platform)")
    if "platforms" in data and "source" in data:
        raise InputError(f"{where(('platforms',))}: kernel '{name}' is built here, for the platform it is built "
                         "on; platforms names prebuilt files of other platforms")
    outputs = tuple(data.get("outputs", []))
    if "outputs" in data and not outputs:  # (it was taken as the default: a key that says nothing is a slip)
        raise InputError(f"{where(('outputs',))}: kernel '{name}' lists no outputs; name the libraries it gives, "
                         "or leave outputs out for the default (the library the build names, or the prebuilt's)")
    for i, out in enumerate(outputs):
        if not SO_RE.search(out) or out.endswith("/"):
            raise InputError(f"{where(('outputs', i))}: output {out!r} of kernel '{name}' is not a shared library "
                             "(.so or .so.N)")
        if out in outputs[:i]:  # (it was loaded, counted and listed twice)
            raise InputError(f"{where(('outputs', i))}: output {out!r} of kernel '{name}' is listed twice; "
                             "list each library once")
    if "source" not in data:  # prebuilt: the file of platforms: for this platform, else prebuilt:
        for key in ("build", "cflags"):
            if key in data:
                raise InputError(f"{where((key,))}: kernel '{name}' is prebuilt; {key} applies to kernels built here")
        named = key_for(data.get("platforms", {}), platform, where(("platforms",)))
        if named is None and "prebuilt" not in data:
            # (a kernel only one platform's stack has is not left out of another's image without a word)
            has = f"names {', '.join(data['platforms'])} only" if data["platforms"] else "is empty"
            raise InputError(f"{where(('platforms',))}: kernel '{name}' has no file for {platform.name}: its "
                             f"platforms {has}; add platforms.{platform.name}, or prebuilt: (the file of every "
                             "platform platforms does not name)")
        key = ("platforms", named) if named else ("prebuilt",)
        rel = data["platforms"][named] if named else data["prebuilt"]
        # a prebuilt archive is not in the build context (its members are, each checked by its size)
        single = limit if kind_of(rel) == "so" else None
        source = read_external(rel, where(key), single) if rel.startswith("/") else \
            read_source(root, rel, where(key), want="file", limit=single)
        prebuilt = read_prebuilt(source.files[0], where(key), platform.machine)
        found = {m.path for m in prebuilt.members}
        for i, out in enumerate(outputs):
            if out not in found:
                raise InputError(f"{where(('outputs', i))}: {out} is not in {rel}; it holds "
                                 f"{', '.join(prebuilt.libraries) or 'no .so'}")
        outputs = outputs or prebuilt.libraries
        if not outputs:
            raise InputError(f"{where(key)}: {rel} holds no .so for kernel '{name}' to load")
        for out in outputs:  # every library it holds, by default: named in ':'-separated lists the shell splits
            if not PATH_RE.fullmatch(out):
                raise InputError(f"{where(key)}: {rel} holds the library {out!r}, which the image's ':'-separated "
                                 "library lists cannot name (letters, digits, '.', '_', '+' and '-' only); give "
                                 "outputs: naming the libraries to load")
        check_libraries(prebuilt, outputs, where(key), platform.machine)
        return Kernel(name=name, version=data["version"], source=None, cflags=(), outputs=outputs,
                      prebuilt=prebuilt)
    source = read_source(root, data["source"], where(("source",)), want="dir", limit=limit)
    spec = data.get("build")
    build = None
    if spec is not None:
        if ("run" in spec) == ("make" in spec):
            raise InputError(f"{where(('build',))}: kernel '{name}' is built by build.run (a command) or "
                             "build.make (a Makefile target): give exactly one")
        if "run" in spec and not spec["run"].strip():
            # sh -c '' exits 0: a build that runs nothing (an unset CI variable templated in), as checks[].run is
            raise InputError(f"{where(('build', 'run'))}: kernel '{name}' is built by a command that runs nothing (its "
                             f"build.run is {'empty' if not spec['run'] else 'blank'}); give the command that writes "
                             "its outputs into $OUT, or leave build out to compile its .c files with cc")
        if "make" in spec and not any(Path(f.path).name in ("Makefile", "makefile", "GNUmakefile")
                                      for f in source.files if "/" not in source.relative(f)):
            raise InputError(f"{where(('build', 'make'))}: kernel '{name}' is built by make, but "
                             f"'{data['source']}' holds no Makefile")
        build = KernelBuild(image=spec.get("id") or spec.get("image") or default_builder or "",
                            run=spec.get("run"), make=spec.get("make"))
    elif not any(f.path.endswith(".c") for f in source.files):
        raise InputError(f"{where(('source',))}: kernel source '{data['source']}' holds no .c file; kernels in "
                         "other languages say how they are built (build.run or build.make)")
    elif len(outputs) > 1:  # cc writes the first; the build failed on the second, 'was not built'
        raise InputError(f"{where(('outputs',))}: kernel '{name}' is built by cc into one library, but outputs names "
                         f"{len(outputs)} ({', '.join(outputs)}); name one, or build them with build.run or build.make")
    image = build.image if build else default_builder
    if not image:
        raise InputError(f"{where(())}: kernel '{name}' is compiled in a builder stage; set builder.image in "
                         "product.yaml (or build.image) to an image with its compiler")
    return Kernel(name=name, version=data["version"], source=source, cflags=tuple(data.get("cflags", [])),
                  outputs=outputs or (f"lib{name}.so",), builder=image, build=build)


def _overlay(root: Path, data: dict, where, engine_files: frozenset[str], limit: int | None = None) -> Overlay:
    source = read_source(root, data["source"], where(("source",)), limit=limit)
    target = data["target"]
    if target in (".", "./") and not source.is_dir:
        raise InputError(f"{where(('target',))}: a file overlay needs a file name as its target, not '.'")
    if target.endswith("/") and not source.is_dir:
        raise InputError(f"{where(('target',))}: a file overlay's target is the file it becomes, like "
                         f"{target}{Path(source.path).name}, not a folder")
    # the engine folder's own layout: a file cannot become a folder, nor a folder a file
    parts = [] if target in (".", "./") else target.rstrip("/").split("/")
    # what a folder source leaves out, put there by an overlay instead (a hook under .git/hooks)
    skipped = next((part for part in (parts if source.is_dir else parts[:-1]) if part in SKIPPED_DIRS), None)
    if skipped is not None:
        raise InputError(f"{where(('target',))}: the overlay's target {target} is inside a {skipped} folder, which is "
                         "never baked (a folder source leaves .git and __pycache__ folders out); choose another target")
    engine_dirs = {"/".join(f.split("/")[:i]) for f in engine_files for i in range(1, f.count("/") + 1)}
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        last = i == len(parts)
        if prefix in engine_files and (not last or source.is_dir):
            raise InputError(f"{where(('target',))}: '{prefix}' is a file of the engine, so the overlay cannot "
                             f"put a folder there (target: {target})")
        if last and not source.is_dir and prefix in engine_dirs:
            raise InputError(f"{where(('target',))}: '{prefix}' is a folder of the engine; a file overlay cannot "
                             "replace it: name a file in it")
    return Overlay(source=source, target=target, name=data.get("name", target.rstrip("/")),
                   md5=data.get("md5", default_of("overlays", "md5")))


# Set by the entrypoint's /bin/sh itself whatever the environment (dash, busybox and bash alike): a value in the
# image's ENV is replaced as the shell starts, and a profile's is never given (the entrypoint gives one only
# where none is set), so one of these in env never reached the engine, silently (an env file written by `env`
# in a working container holds PWD)
SHELL_ENV = frozenset({"IFS", "PPID", "PWD", "OPTIND"})
# Set, changed or dropped by some shells as /bin/sh (bash drops PS1, PS2, OLDPWD and _, sets LINENO and PS4;
# busybox counts SHLVL up): an env file written by `env` holds SHLVL and _. Bash as /bin/sh (the sh of RHEL, UBI,
# Fedora and Amazon Linux bases) also sets or drops its own variables, whatever the environment held (measured:
# `env -i NAME=x sh -c 'exec env'` with sh a link to bash 5.2). (POSIXLY_CORRECT is left: bash sets it to "y",
# and what reads it looks only at whether it is set.)
BASH_ENV_OWN = ("SHELLOPTS", "BASHOPTS", "RANDOM", "SRANDOM", "OPTERR", "BASHPID", "BASH_VERSION", "BASH_ARGV0",
                "HISTCMD", "EPOCHSECONDS", "EPOCHREALTIME", "BASH_COMMAND", "BASH_SUBSHELL", "BASH", "BASH_VERSINFO",
                "COMP_WORDBREAKS")
SOME_SHELLS_ENV = frozenset({"PS1", "PS2", "PS4", "LINENO", "SHLVL", "_", "OLDPWD", *BASH_ENV_OWN})


def _run_sh_refuses(name: str, vendor: str) -> str:
    """Why run.sh refuses ``-e NAME`` on a profile of this vendor whose env does not set it, for the
    ``${NAME}`` warning ("" where run.sh takes it, or sets it itself)."""
    if name in SOME_SHELLS_ENV:
        return (f"is a shell's own: bash or busybox as the entrypoint's /bin/sh sets or drops it, and run.sh refuses "
                f"-e {name}, so the engine may not start; remove it")
    if name == "NVIDIA_VISIBLE_DEVICES" and vendor != "nvidia":
        return ("is set by docker for an NVIDIA profile only (from run.sh's GPUS), and run.sh refuses -e "
                "NVIDIA_VISIBLE_DEVICES: the engine does not start; remove it")
    if name == "HIP_VISIBLE_DEVICES" and vendor == "hygon":
        return ("is set by run.sh on a hygon profile unless GPUS=all, and run.sh refuses -e HIP_VISIBLE_DEVICES "
                "there: with GPUS=all the engine does not start")
    return ""


def _check_env_key(key: str, where: str) -> None:
    if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIX):
        raise InputError(f"{where}: env key '{key}' is set by the image itself (PORT and MODEL_NAME come "
                         "from launch:); choose another name")
    if key in SHELL_ENV:
        raise InputError(f"{where}: env key '{key}' is the shell's own: the entrypoint's /bin/sh sets it, so this "
                         "value would not reach the engine (an env file written by `env`?); remove it")
    if key in SOME_SHELLS_ENV:
        raise InputError(f"{where}: env key '{key}' is a shell's own: bash or busybox as the entrypoint's /bin/sh "
                         "sets or drops it, so this value may not reach the engine (an env file written by `env`?); "
                         "remove it")
    if key == "NVIDIA_VISIBLE_DEVICES":  # (as run.sh refuses it in -e and env files)
        raise InputError(f"{where}: env key '{key}' chooses the container's GPUs, which docker sets from run.sh's "
                         "GPUS (--gpus), so this value would never take effect; remove it (GPUS chooses them)")


# What numbers the GPUs a program sees. The container is given only its profile's GPUs (run.sh: those of
# GPUS), which it numbers from 0: a host's numbering copied from a docker run that gave every GPU
# (CUDA_VISIBLE_DEVICES=4,5,6,7 on a profile of 4) hid every GPU from the engine. ROCm's HIP runtime reads
# GPU_DEVICE_ORDINAL as it reads HIP_VISIBLE_DEVICES.
VISIBLE_DEVICES_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                 "GPU_DEVICE_ORDINAL"})


def visible_devices_named(value: str) -> list[str]:
    """The GPUs a ``*_VISIBLE_DEVICES`` value names, each once (a number by its value: 00 is 0), in order."""
    items = [item.strip() for item in value.split(",")]
    return list(dict.fromkeys(str(int(item)) if item.isascii() and item.isdigit() else item
                              for item in items if item))


def _check_visible_devices(key: str, value: str, gpus: int, profile: str, where: str) -> None:
    items = [item.strip() for item in value.split(",")]
    numbers = [int(item) for item in items if item.isascii() and item.isdigit()]
    if not value.strip() or any(item.startswith("-") and item[1:].isascii() and item[1:].isdigit() for item in items) \
            or "" in items[:-1]:
        # "" shows no GPU; a negative number hides those after it (-1: all), as an empty item does (0,,1: CUDA and
        # ROCm stop at the first item that names no GPU)
        raise InputError(f"{where}: env {key}={value[:80]!r} hides GPUs from the engine; profile '{profile}' "
                         f"needs {gpus}: remove it")
    beyond = [n for n in numbers if n >= gpus]
    if beyond:
        raise InputError(f"{where}: env {key}={value[:80]} names GPU {beyond[0]}, but the container of profile "
                         f"'{profile}' sees only its {gpus} GPU{'s' if gpus > 1 else ''}, numbered from 0 to "
                         f"{gpus - 1} (run.sh gives it those of GPUS): remove it, or number them from 0")
    named = visible_devices_named(value)
    if len(named) < gpus:
        # the engine sees only the GPUs named: CUDA_VISIBLE_DEVICES=0 on a profile of 2 started a tensor-parallel
        # engine of 2 ranks on one GPU (each GPU counted once: 0,0 is GPU 0)
        raise InputError(f"{where}: env {key}={value[:80]} names {len(named)} GPU{'s' if len(named) > 1 else ''}, "
                         f"but profile '{profile}' needs {gpus}: the engine would see only "
                         f"{'those' if len(named) > 1 else 'that one'}; remove it (the container has the profile's "
                         f"GPUs alone), or name {gpus}, like {','.join(map(str, range(gpus)))}")


# Folders of the base image a read-only weight mount must not hide: its programs and libraries (the engine's
# shell, Python and CUDA), /etc, the device nodes, and the folders the engine and NCCL write (/tmp, /dev/shm); inside
# /proc and /sys the runtime mounts nothing. The smoke gate mounts no weights: the container failed on the GPU
# machine alone
SYSTEM_FOLDERS = {
    **dict.fromkeys(("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/usr/bin", "/usr/sbin",
                     "/usr/lib", "/usr/lib64", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/usr/local/cuda",
                     "/opt/rocm"), "its programs and libraries"),
    "/etc": "its users, libraries' settings and host names", "/dev": "the device nodes, the GPUs' too",
    "/tmp": "a folder the engine writes (the mount is read-only)",
    "/dev/shm": "the shared memory NCCL/RCCL and the engine's workers write (the mount is read-only)",
    "/proc": "the kernel's process files", "/sys": "the kernel's device files",
}


def _check_mounts(mounts: dict[str, str], where) -> None:
    """Weight mounts: each its own variable (run.sh's MODEL_<NAME>, the image's UNIBAKE_MOUNT_<NAME>)
    and its own path, none over the install (a mount there would hide the engine)."""
    variables: dict[str, str] = {}
    paths: dict[str, str] = {}
    for name, path in mounts.items():
        variable = mount_var(name)
        if variable == "NAME":  # MODEL_NAME is the served model's name, not a folder
            raise InputError(f"{where(name)}: a mount named '{name}' would be MODEL_NAME in run.sh, which is the "
                             "served model's name; rename it")
        if variable in variables:
            raise InputError(f"{where(name)}: mounts '{variables[variable]}' and '{name}' are both "
                             f"MODEL_{variable} in run.sh; rename one")
        clean = posixpath.normpath(path)
        if clean in paths:
            raise InputError(f"{where(name)}: '{name}' and '{paths[clean]}' both mount at {clean}; docker refuses "
                             "two mounts at one path")
        if clean == "/" or f"{clean}/".startswith(f"{INSTALL_ROOT}/") or f"{INSTALL_ROOT}/".startswith(f"{clean}/"):
            raise InputError(f"{where(name)}: mount '{name}' at {path} would hide the install under {INSTALL_ROOT}; "
                             "mount weights elsewhere, like /models/" + name)
        if clean in SYSTEM_FOLDERS:
            raise InputError(f"{where(name)}: mount '{name}' at {path} would hide the image's {clean}, "
                             f"{SYSTEM_FOLDERS[clean]}: the container would fail on the GPU machine (the smoke gate "
                             f"mounts no weights); mount weights elsewhere, like /models/{name}")
        if clean.startswith(("/proc/", "/sys/")):
            top = clean[:clean.index("/", 1)]
            said = "cannot be mounted because it is inside /proc" if top == "/proc" else "read-only file system"
            raise InputError(f"{where(name)}: mount '{name}' at {path} lies inside {top}, where the container runtime "
                             f"cannot mount it (runc: '{said}'): the container would not start on the GPU machine (the "
                             f"smoke gate mounts no weights); mount weights elsewhere, like /models/{name}")
        variables[variable], paths[clean] = name, name


def _unique(names: list[str], where: str, what: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise InputError(f"{where}: {what} '{n}' is listed twice")
        seen.add(n)


def _topology(d: dict, where) -> Topology:
    t = d.get("topology", {})
    nodes = t.get("nodes", default_of("topology", "nodes"))
    network = t.get("network", "host" if nodes > 1 else "bridge")
    if nodes > 1 and network != "host":
        raise InputError(f"{where(('topology', 'network'))}: a profile on {nodes} nodes needs network: host (its "
                         "ranks reach each other over the host's interfaces)")
    ipc = t.get("ipc", default_of("topology", "ipc"))
    if ipc == "host" and "shm_size" in t:
        raise InputError(f"{where(('topology', 'shm_size'))}: shm_size has no effect with ipc: host (the "
                         "container uses the host's /dev/shm); set ipc: private, or remove shm_size")
    if "shm_size" in t:
        size = t["shm_size"]
        size_bytes = shm_bytes(size)
        if size_bytes < 1 << 20:
            # docker reads a size without a unit as bytes: shm_size: "16" was a /dev/shm of one page, where NCCL
            # and the engine's workers failed with 'Bus error'
            raise InputError(f"{where(('topology', 'shm_size'))}: shm_size '{size}' is {size_bytes} bytes (docker "
                             "reads a size without a unit as bytes), less than any engine's shared memory needs; "
                             "write it with its unit, like 16g")
        if size_bytes >= 1 << 63:
            raise InputError(f"{where(('topology', 'shm_size'))}: shm_size '{size}' is more than docker can take "
                             "(8 EiB); write a size like 16g")
    return Topology(nodes=nodes, network=network, ipc=ipc, shm_size=t.get("shm_size"),
                    rdma=t.get("rdma", nodes > 1), master_port=t.get("master_port", default_of("topology",
                                                                                             "master_port")))


def _chain_level(origin: str, chain: tuple[str, ...]) -> int:
    """How near the profile's own file a key was set (``origin`` is ``FILE:LINE``; -1: not in the chain)."""
    file = origin.rsplit(":", 1)[0]
    return chain.index(file) if file in chain else -1


def _smoke(d: dict, where, chain: tuple[str, ...] = ()) -> Smoke:
    smoke = d.get("smoke", {})
    clash = [k for k in ("prompt", "expect_reply", "match") if k in smoke] if "prompts" in smoke else []
    if clash and chain:
        # a file's own smoke gate wins over the one it extends, as its other keys do: prompts set nearer the
        # profile replace an inherited prompt, expect_reply and match, and those replace inherited prompts
        # (before, a profile extending one with expect_reply could not give prompts at all)
        level = {k: _chain_level(where(("smoke", k)), chain) for k in ("prompts", *clash)}
        if all(level["prompts"] > level[k] for k in clash):
            smoke = {k: v for k, v in smoke.items() if k not in clash}
        elif all(level["prompts"] < level[k] for k in clash):
            smoke = {k: v for k, v in smoke.items() if k != "prompts"}
    if "prompts" in smoke:
        clash = [k for k in ("prompt", "expect_reply", "match") if k in smoke]
        if clash:
            # one of them may come from a file this one extends: say where prompts is set
            raise InputError(f"{where(('smoke', clash[0]))}: smoke.prompts replaces smoke.prompt, expect_reply and "
                             f"match; give one or the other (prompts is set at {where(('smoke', 'prompts'))})")
        if not smoke["prompts"]:
            raise InputError(f"{where(('smoke', 'prompts'))}: smoke.prompts is empty")
        prompts = tuple(SmokePrompt(prompt=x["prompt"], expect=x.get("expect"),
                                    match=x.get("match", default_of("smoke", "match"))) for x in smoke["prompts"])
        keys = [("smoke", "prompts", i) for i in range(len(prompts))]
    else:
        prompts = (SmokePrompt(prompt=smoke.get("prompt", default_of("smoke", "prompt")),
                               expect=smoke.get("expect_reply"), match=smoke.get("match", default_of("smoke", "match"))),)
        keys = [("smoke",)]
    for p, key in zip(prompts, keys):
        if p.expect is not None and not p.expect.strip():
            raise InputError(f"{where(key)}: the expected reply is empty: every reply would match it; give the "
                             "text the engine must answer")
        if p.expect is None and p.match != "exact":
            raise InputError(f"{where(key)}: match: {p.match} needs the expected reply to compare with")
        if p.match == "regex":
            check_regex(p.expect or "", where(key))
    skip = smoke.get("skip")
    if skip is False:  # this file's gate runs, whatever the file it extends skips
        skip = None
    if skip is not None:
        if not skip.strip():
            raise InputError(f"{where(('smoke', 'skip'))}: key 'smoke.skip' is empty: say why this profile's gate cannot run "
                             "(the release notes and records show the reason), or give false to run a gate the file "
                             "it extends skips")
        if any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c in "\u2028\u2029" for c in skip) or len(skip) > SKIP_REASON_MAX:
            raise InputError(f"{where(('smoke', 'skip'))}: key 'smoke.skip' must be one line of at most {SKIP_REASON_MAX} "
                             "characters (it is shown in the notes' table of gates)")
        skip = " ".join(skip.split())
    return Smoke(prompts=prompts, timeout=smoke.get("timeout", default_of("smoke", "timeout")), skip=skip)


PASSES_ITSELF_SECONDS = 2.0  # the regex's match against its own prompt, at the plan; longer: not said


def _passes_itself(check: SmokePrompt) -> bool:
    """Whether the prompt, as a reply, passes its own check (trimmed as a reply is, compared as the gate compares:
    a regex in a child process stopped after PASSES_ITSELF_SECONDS, as the gate runs it: patterns check_regex
    accepts, .*a.*b.*c.*d.*e, still take minutes on a long prompt)."""
    from .smoke import WHITESPACE, _MATCH

    text, expect = check.prompt.strip(WHITESPACE), check.expect.strip(WHITESPACE)
    if check.match != "regex":
        return expect in text if check.match == "contains" else expect == text
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _MATCH], input=json.dumps([check.expect, text]),
                              capture_output=True, text=True, timeout=PASSES_ITSELF_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return done.stdout.strip() == "True"


SKIP_REASON_MAX = 300  # characters of smoke.skip: a reason, shown in a table row


# GPU device nodes: run.sh gives the container those of the GPUs in GPUS (amd, hygon: /dev/dri/renderD<128+N>;
# nvidia: --gpus). One in devices.extra is given whatever GPUS says: /dev/dri (the usual --device of a ROCm
# or DTK docker run) gave every GPU of the host to a profile of one.
GPU_DEVICE_RE = {"amd": re.compile(r"^/dev/dri(?:/.*)?$"), "hygon": re.compile(r"^/dev/dri(?:/.*)?$"),
                 "nvidia": re.compile(r"^/dev/nvidia[0-9]+$")}


# runc's highest user or group number ("Unable to find group" past it, docker's exit 125 at every start)
MAX_GID = 2**31 - 1


def _check_extra_device(device: str, vendor: str, where: str) -> None:
    if GPU_DEVICE_RE[vendor].fullmatch(device):
        given = "--gpus device=GPUS" if vendor == "nvidia" else "/dev/dri/renderD<128+N> for each GPU N of GPUS"
        raise InputError(f"{where}: devices.extra names {device}, a GPU device: run.sh gives {'an' if vendor == 'amd' else 'a'} {vendor} profile "
                         f"{given} (GPUS=all: every GPU), so {device} would give the container GPUs GPUS did not "
                         "choose; remove it")


# a tune cache larger than this is refused: its check holds its bytes and its text (twice its size, for ASCII)
# and an object's keys until they are checked, not the values (measured, 256 MiB of JSON: a peak of 550 MiB as one
# array of numbers, 710 MiB as one object of a million configs; json.loads held 4 to 5 times the file)
MAX_TUNE_JSON = 256 << 20
# a string of JSON, or NaN / Infinity / -Infinity outside one (what Python's json writes for float("nan"))
_JSON_CONSTANT_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?Infinity|NaN)')


class _NotStrictJSON(Exception):
    """A tune cache's JSON that Python's json reads but another reader refuses or reads otherwise."""


class _NotFinite(_NotStrictJSON):
    """NaN, Infinity or -Infinity: said with its line (found again in the text)."""


def _once_each(pairs: list) -> None:
    """An object's keys, each once: Python's json keeps the last of two, another reader the first or refuses
    them. Nothing is kept (the check holds no values)."""
    if len(dict(pairs)) == len(pairs):
        return
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _NotStrictJSON(f"sets the key {json.dumps(key)[:80]} twice in one object (Python's json keeps the "
                                 "last, another reader the first); keep one")
        seen.add(key)


INT_DIGITS = 4300  # Python's json (3.11 on) refuses an integer of more digits: 'Exceeds the limit (4300 digits)'


def _int_length(text: str) -> int:
    """An integer of a tune cache, checked and dropped (its length kept: a small int Python shares)."""
    if len(text) - text.startswith("-") > INT_DIGITS:
        raise _NotStrictJSON(f"holds an integer of {len(text) - text.startswith('-')} digits, more than Python's json "
                             f"reads ({INT_DIGITS}: 'Exceeds the limit'); write it shorter")
    return len(text)


def _float_length(text: str) -> int:
    """A float of a tune cache, checked and dropped (its length kept): one too large for a double (1e999999) is
    read by Python's json as Infinity, which it then writes back as ``Infinity``, not JSON."""
    if math.isinf(float(text)):
        raise _NotStrictJSON(f"holds {text[:40]}, a number too large for a double: Python's json reads it as "
                             "Infinity (and writes it back so, which is not JSON); write a smaller number")
    return len(text)


def _not_finite(name: str) -> None:
    raise _NotFinite(f"holds {name}, which is not JSON (Python writes it for a float that is not a number; a "
                         "strict reader refuses the file); write a number, or null")


def _check_tune_json(tune: TuneCaches, profile: str) -> None:
    """Every ``*.json`` of a profile's tune caches parses as strict JSON: one cut short, saved empty or left with a
    merge's conflict markers was baked, counted, released and failed only when the engine read it on a GPU node; a
    NaN or a key written twice passed."""
    for f in tune.source.files:
        if not f.path.endswith(".json"):
            continue
        if f.size > MAX_TUNE_JSON:
            raise InputError(f"{f.path}: tune cache of profile '{profile}' is {f.size} bytes, more than the "
                             f"{MAX_TUNE_JSON >> 20} MiB unibake reads to check a tune cache's JSON; split it, or "
                             "keep it out of tune_caches.source")
        with open_regular(f.absolute, shown=f.path) as fh:
            data = fh.read(MAX_TUNE_JSON + 1)
        try:
            # as the engine reads it (json.load of the file opened as text): UTF-8, no byte-order mark
            text = data.decode("utf-8")
            del data
            if text.startswith("\ufeff"):
                raise InputError(f"{f.path}: tune cache of profile '{profile}' starts with a UTF-8 byte-order mark, "
                                 "which json.load of the opened file refuses ('Unexpected UTF-8 BOM'); save it "
                                 "without one")
            # no value is kept: an object is None once its keys are checked, a number its length (a small int
            # Python shares: a list of a million numbers holds pointers, not a million floats)
            json.loads(text, object_pairs_hook=_once_each, parse_constant=_not_finite,
                       parse_float=_float_length, parse_int=_int_length)
        except json.JSONDecodeError as exc:
            raise InputError(f"{f.path}:{exc.lineno}: tune cache of profile '{profile}' is not JSON ({exc.msg}, "
                             f"column {exc.colno}); fix it, or keep it out of tune_caches.source") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"{f.path}: tune cache of profile '{profile}' is not JSON (not UTF-8: {exc.reason} at "
                             f"byte {exc.start}); save it as UTF-8") from None
        except RecursionError:
            raise InputError(f"{f.path}: tune cache of profile '{profile}' nests its JSON too deep to be read "
                             "(Python's json stops at about 1000 levels, as the engine's would)") from None
        except _NotStrictJSON as exc:
            found = next((m for m in _JSON_CONSTANT_RE.finditer(text) if m.group(1)), None) \
                if isinstance(exc, _NotFinite) else None
            line = f":{text.count(chr(10), 0, found.start()) + 1}" if found else ""
            raise InputError(f"{f.path}{line}: tune cache of profile '{profile}' {exc}") from None


def _profile(root: Path, m: MergedProfile, builder: str | None, platform: Platform,
             limit: int | None = None) -> Profile:
    d = m.data
    sidecars = tuple(_kernel(root, k, lambda p, i=i: m.where(("sidecars", i) + p), builder, platform, limit)
                     for i, k in enumerate(d.get("sidecars", [])))
    _unique([k.name for k in sidecars], m.where(("sidecars",)), "sidecar")
    tune = None
    if "tune_caches" in d:
        t = d["tune_caches"]
        if "source" not in t:
            raise InputError(f"{m.where(('tune_caches',))}: tune_caches.source is required for profile "
                             f"'{m.name}'")
        tune = TuneCaches(source=read_source(root, t["source"], m.where(("tune_caches", "source")),
                                             want="dir", limit=limit), expect=t.get("expect"))
        found = len(tune.json_files)
        if tune.expect is not None and found != tune.expect:
            # the count (and self-check's) is of the folder's top level: say so when subfolders hold more
            deeper = sum(1 for f in tune.source.files if f.path.endswith(".json")) - found
            aside = (f" at its top level ({deeper} more in its subfolders are baked but not counted: expect "
                     "counts the top level only)") if deeper else ""
            raise InputError(f"{m.where(('tune_caches', 'expect'))}: profile '{m.name}' expects "
                             f"{tune.expect} tune-cache JSON files in '{t['source']}', found {found}{aside}")
        _check_tune_json(tune, m.name)
    for key in d.get("env", {}):
        _check_env_key(key, m.where(("env", key)))
    for key in VISIBLE_DEVICES_ENV & set(d.get("env", {})):
        _check_visible_devices(key, d["env"][key], d["gpus"], m.name, m.where(("env", key)))
    dev = d.get("devices", {})
    devices = Devices(vendor=dev.get("vendor", default_of("devices", "vendor")),
                      extra=tuple(dict.fromkeys(dev.get("extra", []))), groups=tuple(dict.fromkeys(dev.get("groups", []))))
    if devices.vendor == "hygon" and "HIP_VISIBLE_DEVICES" in d.get("env", {}):
        # run.sh gives a hygon profile's container HIP_VISIBLE_DEVICES=0,...,N-1 (as it refuses -e of it), and the
        # entrypoint gives a profile's value only where none is set
        raise InputError(f"{m.where(('env', 'HIP_VISIBLE_DEVICES'))}: env key 'HIP_VISIBLE_DEVICES' is set by run.sh "
                         f"for a hygon profile (to its {d['gpus']} GPU{'s' if d['gpus'] > 1 else ''} from 0, unless "
                         "GPUS=all), so this value would not take effect; remove it")
    for i, device in enumerate(dev.get("extra", [])):
        _check_extra_device(device, devices.vendor, m.where(("devices", "extra", i)))
    for i, group in enumerate(dev.get("groups", [])):
        if group.isdigit() and int(group) > MAX_GID:
            raise InputError(f"{m.where(('devices', 'groups', i))}: group {group} is past {MAX_GID}, the highest "
                             "group number docker's runtime takes: every start would fail with 'Unable to find "
                             f"group {group}'")
    topology = _topology(d, m.where)
    for i, device in enumerate(dev.get("extra", [])):
        if not topology.rdma and (device == "/dev/infiniband" or device.startswith("/dev/infiniband/")):
            # docker's default memlock limit (64 KiB) is far too little for the memory RDMA registers: NCCL's
            # ibv_reg_mr failed on the GPU nodes
            raise InputError(f"{m.where(('devices', 'extra', i))}: devices.extra names {device}, but RDMA needs "
                             "more locked memory than docker's default limit allows: set topology.rdma: true, which "
                             "gives the container /dev/infiniband and unlimited memlock, and remove it")
    port = d.get("launch", {}).get("port", default_of("launch", "port"))
    if topology.nodes > 1 and topology.master_port == port:
        # host networking: the rank-0 node's engine and its rendezvous would both listen on that port
        raise InputError(f"{m.where(('topology', 'master_port'))}: topology.master_port {port} is launch.port too: on "
                         f"{topology.nodes} nodes the container shares the host's network, where the engine and the "
                         "ranks' rendezvous cannot both listen on one port; choose another master_port")
    _check_flag_spellings(d, m.where)
    served = _literal_port(d, m.where)
    if served is not None and served[1] != port:
        # the smoke gate asks launch.port, run.sh publishes PORT: the gate waited out its timeout for a port
        # nothing listened on, after the build and the round trip
        where, number = served
        raise InputError(f"{where}: --port {number} of profile '{m.name}' is not launch.port {port}, where the image's "
                         "PORT, the smoke gate and run.sh expect the engine: write --port ${PORT} (expanded when "
                         "the container starts), or set launch.port")
    _check_parallel_size(d, m, topology)
    if topology.nodes > 1:
        for key in d.get("env", {}):
            if key in TOPOLOGY_ENV:
                raise InputError(f"{m.where(('env', key))}: env key '{key}' would never take effect: profile "
                                 f"'{m.name}' runs on {topology.nodes} nodes, where it is set from topology: (use "
                                 f"{TOPOLOGY_ENV[key]}); remove it")
    smoke = _smoke(d, m.where, m.chain)
    if topology.nodes > GATE_NODES and smoke.skip is None:
        # the gate starts every rank on one bridge network of the verify engine: its last rank failed there,
        # after the build, the round trip and every rank before it
        raise InputError(f"{m.where(('topology', 'nodes'))}: key 'topology.nodes' is {topology.nodes}, more ranks than "
                         f"the smoke gate can start (one container each on one bridge network, which holds at most "
                         f"{GATE_NODES}): use at most {GATE_NODES} nodes, or give smoke.skip with the reason")
    return Profile(name=m.name, file=m.file, gpus=d["gpus"], devices=devices, topology=topology,
                   env=dict(d.get("env", {})), env_files=m.env_files, args=tuple(d.get("args", [])),
                   sidecars=sidecars, tune=tune, smoke=smoke,
                   env_where={k: m.where(("env", k)) for k in d.get("env", {})})


# An engine's tensor- and pipeline-parallel sizes (vLLM's, SGLang's, the demo engine's spellings): the GPUs it starts
# ranks on, across every node
TENSOR_PARALLEL = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")
PIPELINE_PARALLEL = ("--pipeline-parallel-size", "-pp", "--pp-size", "--pp")


CHECKED_FLAGS = ("--port",) + TENSOR_PARALLEL + PIPELINE_PARALLEL  # the flags whose numbers the plan checks


def _check_flag_spellings(d: dict, where) -> None:
    """The flags the plan checks, written only as the plan reads them. An argparse engine also takes a long option
    cut short (``--por 8080`` is ``--port 8080`` when no other option begins so; ``--t 4`` is the demo engine's
    ``--tp 4``) and, for ``type=int``, any number Python's int() takes (``+8080``, `` 8080``, ``8_080``, other
    scripts' digits like ``８０８０``): each passed the checks of --port and --tp unread."""
    words = [(w, ("engine", "command", i)) for i, w in enumerate(d["engine"]["command"])]
    words += [(w, ("args", i)) for i, w in enumerate(d.get("args", []))]
    for n, (word, path) in enumerate(words):
        name, eq, value = word.partition("=")
        if name.startswith("--") and len(name) > 2 and name not in CHECKED_FLAGS:
            full = [f for f in CHECKED_FLAGS if f.startswith(name)]
            if full:
                raise InputError(f"{where(path)}: key '{dotted(path)}' is {name}, which an engine's argument parser "
                                 f"(Python's argparse) takes for {' or '.join(full)} when no other option of the "
                                 f"engine begins so; write the option in full")
        if name not in CHECKED_FLAGS:
            continue
        if not eq:
            if n + 1 >= len(words):
                continue
            value, path = words[n + 1]
        try:
            int(value)
        except ValueError:  # not a number to the engine either (${PORT}, expanded when the container starts)
            continue
        if not (value.isascii() and value.isdigit()):
            raise InputError(f"{where(path)}: key '{dotted(path)}' gives {name} the value {value[:40]!r}, which an "
                             "engine reads as a number (Python's int() takes a sign, spaces, '_' and other scripts' "
                             "digits) but the plan checks only numbers in plain digits; write it in the digits 0-9 "
                             "alone")


def _literal_flag(d: dict, where, names: tuple[str, ...]) -> tuple[str, str, int] | None:
    """The last of ``names`` in engine.command and args (the one an argument parser keeps), when its value is a
    plain number: the name as written, its ``file:line``, the number."""
    words = [(w, ("engine", "command", i)) for i, w in enumerate(d["engine"]["command"])]
    words += [(w, ("args", i)) for i, w in enumerate(d.get("args", []))]
    found = None
    for n, (word, path) in enumerate(words):
        name, eq, value = word.partition("=")
        if name in names and eq:
            found = (name, value, path)
        elif word in names and n + 1 < len(words):
            found = (word, words[n + 1][0], words[n + 1][1])
    if found is None or not found[1].isascii() or not found[1].isdigit() or len(found[1]) > 6:
        return None
    return found[0], where(found[2]), int(found[1])


def _check_parallel_size(d: dict, m: MergedProfile, topology: Topology) -> None:
    """A tensor-parallel size (times a pipeline-parallel one) written as a number that needs more GPUs than the
    profile's containers have: the engine failed at start on the GPU machine alone (the smoke gate has no GPUs)."""
    tp = _literal_flag(d, m.where, TENSOR_PARALLEL)
    if tp is None:
        return
    pp = _literal_flag(d, m.where, PIPELINE_PARALLEL)
    needed = tp[2] * (pp[2] if pp else 1)
    has = d["gpus"] * topology.nodes
    if needed > has:
        times = f" times {pp[0]} {pp[2]}" if pp else ""
        each = f" on each of {topology.nodes} nodes, {has} in all" if topology.nodes > 1 else ""
        gpus = d["gpus"]
        raise InputError(f"{tp[1]}: {tp[0]} {tp[2]}{times} of profile '{m.name}' starts the engine on {needed} GPUs, "
                         f"but the profile has {gpus}{each} (gpus: {gpus}): the engine would fail at start on the GPU "
                         "machine (the smoke gate has no GPUs to show it); set gpus, or write a size that fits")


def _literal_port(d: dict, where) -> tuple[str, int] | None:
    """Where the engine is told its port as a number (``--port 8000``, ``--port=8000``): the last ``--port`` of
    engine.command and args (the one an argument parser keeps) when it is a plain number, with its ``file:line``."""
    words = [(w, ("engine", "command", i)) for i, w in enumerate(d["engine"]["command"])]
    words += [(w, ("args", i)) for i, w in enumerate(d.get("args", []))]
    found = None
    for n, (word, path) in enumerate(words):
        if word == "--port" and n + 1 < len(words):
            found = (words[n + 1][0], words[n + 1][1])
        elif word.startswith("--port="):
            found = (word.removeprefix("--port="), path)
    if found is None or not found[0].isascii() or not found[0].isdigit():
        return None
    return where(found[1]), int(found[0])


GATE_NODES = 1023  # the ports of a Linux bridge (BR_MAX_PORTS 1024, port 0 unused): a multi-node gate's most ranks
