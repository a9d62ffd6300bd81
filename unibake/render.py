"""Render a :class:`ReleasePlan` into a :class:`BuildContext` (pure; golden-tested).

The Dockerfile, entrypoint and self-check come from the Jinja2 templates in
``unibake/templates/``. Every value from YAML reaches them through an escaping filter of
:mod:`unibake.templates`: ``dq`` for a double-quoted Dockerfile word, ``sh`` for a POSIX shell
word, ``json`` for exec form. Control characters never get this far (the schema refuses them), so
no value can end a line.

Layers, least to most often changed: base, engine, shared kernels, per-profile sidecars, tune
caches, overlays, environment + launcher + metadata, the in-image checks, labels.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import InputError
from .files import write_atomic
from .inputs import InputFile
from .metadata import METADATA_LABEL, ImageMetadata
from .plan import INSTALL_ROOT, Kernel, Profile, ReleasePlan
from .templates import render_template


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
    metadata: ImageMetadata  # what the image will say about itself (label and meta/release.json)

    @property
    def rendered(self) -> dict[str, str]:
        """The reviewable outputs, by file name (as kept under ``dockerfiles/rendered/``)."""
        return {"Dockerfile": self.dockerfile, "entrypoint.sh": self.entrypoint,
                "self-check.sh": self.self_check}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def selection_name(plan: ReleasePlan) -> str:
    """``all`` or the profiles; another platform than linux/amd64 adds its architecture (``all-arm64``)."""
    return ("all" if plan.is_unified else "-".join(plan.profile_names)) + plan.platform.suffix


def _kernel_path(kernel: Kernel, profile: str | None) -> str:
    base = f"profiles/{profile}/kernels" if profile else "kernels"
    return f"{base}/{kernel.name}/{kernel.library}"


def _profile_kernel_paths(plan: ReleasePlan, profile: Profile) -> list[str]:
    """The kernels a profile loads, under the install root: its sidecars where they replace a shared one."""
    own = {k.name for k in profile.sidecars}
    return [_kernel_path(k, profile.name if k.name in own else None) for k in profile.kernels(plan.kernels)]


def kernel_paths(plan: ReleasePlan, profile: Profile) -> tuple[str, ...]:
    """The absolute paths in the image of the kernels a profile loads."""
    return tuple(f"{INSTALL_ROOT}/{x}" for x in _profile_kernel_paths(plan, profile))


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
        paths = _profile_kernel_paths(plan, p)
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

    metadata = ImageMetadata.from_plan(plan)
    values = dict(plan=plan, root=INSTALL_ROOT, profiles=profiles, shared_env=shared_env,
                  has_kernels=has_kernels, builds=builds, engine_py=engine_py,
                  has_sidecars=any(p.sidecars for p in plan.profiles),
                  has_tune=any(p.tune for p in plan.profiles), components=plan.components,
                  names=",".join(plan.profile_names), metadata_label=METADATA_LABEL, metadata=metadata.to_json())
    entrypoint = render_template("entrypoint.sh.j2", **values)
    self_check = render_template("self-check.sh.j2", **values)
    for name, text in (("entrypoint.sh", entrypoint), ("self-check.sh", self_check)):
        data = text.encode()
        files[f"ctx/meta/{name}"] = ContextFile(name=f"ctx/meta/{name}", mode=0o755, sha256=_sha(data), data=data)
        baked[f"meta/{name}"] = _sha(data)
    release = (metadata.model_dump_json(indent=2) + "\n").encode()
    files["ctx/meta/release.json"] = ContextFile(name="ctx/meta/release.json", mode=0o644, sha256=_sha(release),
                                                 data=release)
    baked["meta/release.json"] = _sha(release)
    manifest = "".join(f"{digest}  {path}\n" for path, digest in sorted(baked.items())).encode()
    files["ctx/meta/files.sha256"] = ContextFile(name="ctx/meta/files.sha256", mode=0o644, sha256=_sha(manifest),
                                                 data=manifest)
    dockerfile = render_template("Dockerfile.j2", **values)
    files["Dockerfile"] = ContextFile(name="Dockerfile", mode=0o644, sha256=_sha(dockerfile.encode()),
                                      data=dockerfile.encode())
    return BuildContext(tag=plan.tag, selection=selection_name(plan), dockerfile=dockerfile,
                        entrypoint=entrypoint, self_check=self_check,
                        files=tuple(files[n] for n in sorted(files)), baked=tuple(sorted(baked.items())),
                        metadata=metadata)


def context_files(context: BuildContext, root: Path):
    """(where, bytes or path, sha256) of every context file, for the sanitisation gate: a file from
    the repository is named by its repository path, a generated one by its name in the context."""
    for f in context.files:
        if f.data is not None:
            yield f.name, f.data, f.sha256
        elif f.source is not None:
            try:
                yield f.source.relative_to(root).as_posix(), f.source, f.sha256
            except ValueError:
                yield str(f.source), f.source, f.sha256


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
        write_atomic(out, name, text)
    return out
