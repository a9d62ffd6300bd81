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
import json
import os
import tarfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from collections.abc import Iterator
from typing import BinaryIO

from .errors import InputError
from .files import open_regular, write_atomic
from .inputs import InputFile
from .metadata import METADATA_LABEL, ImageMetadata
from .plan import INSTALL_ROOT, Kernel, Profile, ReleasePlan
from .prebuilt import Member, Prebuilt, open_member
from .templates import render_template, sh

# the context folder of what every release changes, laid out as under the install root (profiles/NAME/tune/,
# meta/): one COPY below the build memo's marker, so one container and one layer a release builds
UPPER = "ctx/upper"
BUILD_LOG = "/tmp/unibake-kernel-build.log"
# the compiler's own first error line, else the last line of what the build printed
FIRST_ERROR = f"grep -m 1 -i -E 'error|undefined reference|fatal' {BUILD_LOG} || tail -n 1 {BUILD_LOG}"


@dataclass(frozen=True, kw_only=True)
class ContextFile:
    """One file of the build context: from disk (``source``) or generated (``data``)."""

    name: str  # path inside the context
    mode: int
    sha256: str
    source: Path | None = None
    data: bytes | None = None
    prebuilt: Prebuilt | None = None  # a member of a prebuilt archive: read from it, never from disk
    member: Member | None = None

    @property
    def size(self) -> int | None:
        if self.data is not None:
            return len(self.data)
        if self.member is not None:
            return self.member.size
        return self.source.stat().st_size if self.source is not None else None

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        if self.member is not None:
            with open_member(self.prebuilt, self.member) as fh:  # type: ignore[arg-type]
                return fh.read()
        assert self.source is not None
        with open_regular(self.source) as fh:
            return fh.read()


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
        return dict(zip(RENDERED_FILES, (self.dockerfile, self.entrypoint, self.self_check)))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def selection_name(plan: ReleasePlan) -> str:
    """``all`` or the profiles; another platform than linux/amd64 adds its architecture (``all-arm64``)."""
    return ("all" if plan.is_unified else "-".join(plan.profile_names)) + plan.platform.suffix


def _kernel_dir(kernel: Kernel, profile: str | None) -> str:
    """A kernel's folder under the install root: shared, or a profile's sidecar."""
    return f"profiles/{profile}/kernels/{kernel.name}" if profile else f"kernels/{kernel.name}"


def _kernel_path(kernel: Kernel, profile: str | None) -> str:
    return f"{_kernel_dir(kernel, profile)}/{kernel.library}"


def _profile_kernel_paths(plan: ReleasePlan, profile: Profile) -> list[str]:
    """The libraries a profile loads, under the install root: its sidecars where they replace a shared one."""
    own = {k.name for k in profile.sidecars}
    return [f"{_kernel_dir(k, profile.name if k.name in own else None)}/{out}"
            for k in profile.kernels(plan.kernels) for out in k.outputs]


def _python_dirs(plan: ReleasePlan, profile: Profile) -> list[str]:
    """The folders of the wheels a profile loads: importable, as a wheel is meant to be."""
    own = {k.name for k in profile.sidecars}
    return [f"{INSTALL_ROOT}/{_kernel_dir(k, profile.name if k.name in own else None)}"
            for k in profile.kernels(plan.kernels) if k.is_wheel]


def _build_script(kernel: Kernel, out: str, src: str) -> str:
    """The RUN of one kernel in its builder stage: the compile, its output kept in a log, and on failure
    one line naming the kernel and the compiler's own first error."""
    flags = " ".join(kernel.cflags)
    name, version = kernel.name, kernel.version
    if kernel.build is None:
        c_files = " ".join(sh(f"{src}/{kernel.source.relative(f)}") for f in kernel.source.files  # type: ignore
                           if f.path.endswith(".c"))
        command = (f"cc -O2 -shared -fPIC -ffile-prefix-map=/src=. {''.join(sh(f) + ' ' for f in kernel.cflags)}"
                   f"-DUNIBAKE_KERNEL_NAME={sh(chr(34) + name + chr(34))} "
                   f"-DUNIBAKE_KERNEL_VERSION={sh(chr(34) + version + chr(34))} -o \"$out\"/{sh(kernel.library)} "
                   f"{c_files} -lm")
    elif kernel.build.make is not None:
        # CFLAGS on make's command line overrides every assignment of it in the Makefile (CFLAGS ?= -O3,
        # CFLAGS += -fPIC): given only when the kernel has cflags, so a Makefile's own flags stand otherwise
        cflags = f" CFLAGS={sh(flags)}" if kernel.cflags else ""
        command = (f"make -C {sh(src)} {sh(kernel.build.make)} OUT=\"$out\"{cflags} "
                   f"UNIBAKE_KERNEL_NAME={sh(name)} UNIBAKE_KERNEL_VERSION={sh(version)}")
    else:
        command = (f"env OUT=\"$out\" SRC={sh(src)} CFLAGS={sh(flags)} UNIBAKE_KERNEL_NAME={sh(name)} "
                   f"UNIBAKE_KERNEL_VERSION={sh(version)} sh -c {sh(kernel.build.run)}")
    # cc writes its library where outputs says: a folder of it is made first (cc makes none)
    folder = (f" \"$out\"/{sh(kernel.library.rsplit('/', 1)[0])}" if kernel.build is None and "/" in kernel.library
              else "")
    lines = [
        f"set -eu; out={sh(out)}; mkdir -p \"$out\"{folder}; cd {sh(src)};",
        f"if ! {command} >{BUILD_LOG} 2>&1; then",
        f"  cat {BUILD_LOG}; printf 'error: kernel-build[%s]: %s\\n' {sh(name)} \"$({FIRST_ERROR})\"; exit 1;",
        f"fi; cat {BUILD_LOG}; rm -f {BUILD_LOG};",
        f"for f in {' '.join(sh(o) for o in kernel.outputs)}; do",
        f"  [ -f \"$out/$f\" ] || {{ printf 'error: kernel-build[%s]: %s was not built\\n' {sh(name)} \"$f\"; exit 1; }};",
        "done",
    ]
    return " \\\n    ".join(lines)


def _stages(plan: ReleasePlan) -> list[dict]:
    """The builder stages: one per builder image, each compiling its kernels; the first is ``kernels``."""
    stages: dict[str, dict] = {}
    compiled = [(k, None) for k in plan.kernels] + [(k, p.name) for p in plan.profiles for k in p.sidecars]
    for k, profile in compiled:
        if k.prebuilt is not None:
            continue
        assert k.builder is not None and k.source is not None
        stage = stages.setdefault(k.builder, {"name": "kernels" if not stages else f"kernels{len(stages) + 1}",
                                              "image": k.builder, "builds": [], "shared": False, "sidecars": False})
        stage["shared" if profile is None else "sidecars"] = True
        ctx = f"ctx/kernels/{k.name}" if profile is None else f"ctx/sidecars/{profile}/{k.name}"
        src = f"/src/kernels/{k.name}" if profile is None else f"/src/sidecars/{profile}/{k.name}"
        out = f"/out/{_kernel_dir(k, profile)}"
        stage["builds"].append({"kernel": k, "ctx": ctx, "src": src, "script": _build_script(k, out, src)})
    return list(stages.values())


def kernel_paths(plan: ReleasePlan, profile: Profile) -> tuple[str, ...]:
    """The absolute paths in the image of the kernels a profile loads."""
    return tuple(f"{INSTALL_ROOT}/{x}" for x in _profile_kernel_paths(plan, profile))


DOCKERFILE_LINE_LIMIT = 65535  # Engine 20.10: "dockerfile line greater than max allowed size of 65535"


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
        if rel not in plan.patched:
            add_input(f"ctx/engine/{rel}", f, f"engine/{rel}")
    for rel, patched in sorted(plan.patched.items()):
        if patched.data is not None:
            files[f"ctx/engine/{rel}"] = ContextFile(name=f"ctx/engine/{rel}", mode=patched.mode,
                                                     sha256=patched.sha256, data=patched.data)
            baked[f"engine/{rel}"] = patched.sha256
    stages = _stages(plan)
    for stage in stages:
        for b in stage["builds"]:
            k = b["kernel"]
            for f in k.source.files:
                add_input(f"{b['ctx']}/{k.source.relative(f)}", f, None)
    prebuilt = [(k, None) for k in plan.kernels if k.prebuilt] + \
               [(k, p.name) for p in plan.profiles for k in p.sidecars if k.prebuilt]
    for k, profile in prebuilt:
        for m in k.prebuilt.members:
            path = f"{_kernel_dir(k, profile)}/{m.path}"
            files[f"ctx/prebuilt/{path}"] = ContextFile(name=f"ctx/prebuilt/{path}", mode=m.mode, sha256=m.sha256,
                                                        prebuilt=k.prebuilt, member=m)
            baked[path] = m.sha256
    for p in plan.profiles:
        if p.tune:
            for f in p.tune.source.files:
                rel = p.tune.source.relative(f)
                add_input(f"{UPPER}/profiles/{p.name}/tune/{rel}", f, f"profiles/{p.name}/tune/{rel}")
    overlaid: dict[str, tuple[InputFile, bool]] = {}
    for o in plan.overlays:
        for rel, f in o.files():
            add_input(f"ctx/overlays/{rel}", f, f"engine/{rel}")
            overlaid[f"engine/{rel}"] = (f, o.md5)

    shared_env = plan.env_common
    profiles = []
    for p in plan.profiles:
        paths = _profile_kernel_paths(plan, p)
        profiles.append({
            "name": p.name, "gpus": p.gpus, "args": list(p.args),
            "env": {k: v for k, v in p.env.items() if k not in shared_env},
            "kernels": [f"{INSTALL_ROOT}/{x}" for x in paths],
            "kernel_dirs": [f"{INSTALL_ROOT}/{x.rsplit('/', 1)[0]}" for x in paths],
            "python_dirs": _python_dirs(plan, p),
            "tune_dir": f"{INSTALL_ROOT}/profiles/{p.name}/tune" if p.tune else "",
            "tune_expect": "" if not p.tune or p.tune.expect is None else p.tune.expect,
            "topology": p.topology,
        })
    engine_py = any(path.startswith("engine/") and path.endswith(".py") for path in baked)
    has_kernels = bool(plan.kernels) or any(p.sidecars for p in plan.profiles)

    metadata = ImageMetadata.from_plan(plan)
    ledgers = [("meta/files.sha256", "sha256sum")] + [(f"meta/{s['name']}.sha256", "sha256sum") for s in stages]
    if overlaid:
        ledgers.append(("meta/overlays.sha256", "sha256sum"))
    md5_files = {path: f for path, (f, md5) in overlaid.items() if md5}
    if md5_files:
        ledgers.append(("meta/overlays.md5", "md5sum"))
    values = dict(plan=plan, root=INSTALL_ROOT, profiles=profiles, shared_env=shared_env,
                  has_kernels=has_kernels, stages=stages, engine_py=engine_py, has_prebuilt=bool(prebuilt),
                  upper=UPPER, components=plan.components, ledgers=ledgers,
                  names=",".join(plan.profile_names), metadata_label=METADATA_LABEL, metadata=metadata.to_json())
    entrypoint = render_template("entrypoint.sh.j2", **values)
    self_check = render_template("self-check.sh.j2", **values)

    def add_meta(name: str, data: bytes, mode: int = 0o644) -> None:
        path = f"{UPPER}/meta/{name}"
        files[path] = ContextFile(name=path, mode=mode, sha256=_sha(data), data=data)

    for name, text in (("entrypoint.sh", entrypoint), ("self-check.sh", self_check)):
        add_meta(name, text.encode(), 0o755)
        baked[f"meta/{name}"] = _sha(text.encode())
    release = (metadata.model_dump_json(indent=2) + "\n").encode()
    add_meta("release.json", release)
    baked["meta/release.json"] = _sha(release)
    if overlaid:
        ledger = "".join(f"{f.sha256}  {path}\n" for path, (f, _) in sorted(overlaid.items())).encode()
        add_meta("overlays.sha256", ledger)
        baked["meta/overlays.sha256"] = _sha(ledger)
    if md5_files:
        ledger = "".join(f"{_md5(f)}  {path}\n" for path, f in sorted(md5_files.items())).encode()
        add_meta("overlays.md5", ledger)
        baked["meta/overlays.md5"] = _sha(ledger)
    manifest = "".join(f"{digest}  {path}\n" for path, digest in sorted(baked.items())).encode()
    add_meta("files.sha256", manifest)
    dockerfile = render_template("Dockerfile.j2", **values)
    longest = max(dockerfile.split("\n"), key=lambda line: len(line.encode()))
    if len(longest.encode()) >= DOCKERFILE_LINE_LIMIT:
        # the image's metadata label is one line, and it grows with every profile and kernel: said here,
        # not by the engine after the plan, the render and the context were all made
        raise InputError(f"the Dockerfile of {plan.tag} would hold a line of {len(longest.encode())} bytes (the label "
                         f"{METADATA_LABEL}, which grows with each profile and kernel); the engine refuses lines of "
                         f"{DOCKERFILE_LINE_LIMIT} bytes or more: " + (
                             "release fewer profiles at once (--profile)" if len(plan.profiles) > 1
                             else _largest_part(metadata)))
    files["Dockerfile"] = ContextFile(name="Dockerfile", mode=0o644, sha256=_sha(dockerfile.encode()),
                                      data=dockerfile.encode())
    return BuildContext(tag=plan.tag, selection=selection_name(plan), dockerfile=dockerfile,
                        entrypoint=entrypoint, self_check=self_check,
                        files=tuple(files[n] for n in sorted(files)), baked=tuple(sorted(baked.items())),
                        metadata=metadata)


PART_NAMES = {"smoke": "smoke prompts and expected replies", "env": "env", "args": "args", "kernels": "kernels",
              "sidecars": "sidecars"}


def _largest_part(metadata: ImageMetadata) -> str:
    """Where to shorten a label that holds one profile: its largest part (fewer profiles would not help)."""
    document = json.loads(metadata.to_json())
    parts = {f"profile {name}'s {PART_NAMES.get(key, key)}": value
             for name, profile in document.get("profiles", {}).items() for key, value in profile.items()}
    parts.update({f"the {key}": value for key, value in document.items() if key != "profiles"})
    name, value = max(parts.items(), key=lambda item: len(json.dumps(item[1])))
    return f"shorten {name}, the largest part of it ({len(json.dumps(value))} bytes)"


def _md5(f: InputFile) -> str:
    """The md5 of an overlay file, for the ledger such stacks keep (md5sum -c), never for integrity alone."""
    h = hashlib.md5(usedforsecurity=False)
    with open_regular(f.absolute) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
        elif f.member is not None and f.prebuilt.kind == "so":  # type: ignore[union-attr]
            # a prebuilt library is its file: scanned from disk (grep, the memo), not read whole into memory
            yield f.prebuilt.file.path, f.prebuilt.file.absolute, f.sha256  # type: ignore[union-attr]
        elif f.member is not None:  # a member of a prebuilt archive: read from the archive as a stream
            yield (f"{f.prebuilt.file.path}:{f.member.source}",  # type: ignore[union-attr]
                   partial(open_member, f.prebuilt, f.member), f.sha256)


# Why tar by hand: the kit needs the build context's tar laid out (every header, every file's place and
# the whole size) before any file is read, and its bytes streamed in large pieces; tarfile gives neither
# (its stream writer re-slices a large write 10 kB at a time). Headers are tarfile's own (``tobuf``), the
# padding and the end are as tarfile writes them, so the bytes are the ones ``tarfile.open(mode="w")`` gives
# (a test holds them equal).
BLOCK = tarfile.BLOCKSIZE
CHUNK = 1 << 20


def tar_header(info: tarfile.TarInfo) -> bytes:
    """A member's header as ``TarFile.addfile`` writes it in PAX format."""
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def tar_padding(size: int) -> bytes:
    """What follows ``size`` bytes of a member's data: up to the next 512-byte block."""
    return bytes(-size % BLOCK)


def tar_end(offset: int) -> bytes:
    """The end of a tar whose members take ``offset`` bytes: two zero blocks, then up to a 10 kB record."""
    return bytes(2 * BLOCK + -(offset + 2 * BLOCK) % tarfile.RECORDSIZE)


def tar_info(name: str, mode: int, mtime: int, size: int = 0, folder: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.size = mode, mtime, size
    if folder:
        info.type = tarfile.DIRTYPE
    return info


def _size(f: ContextFile) -> int:
    if f.data is not None:
        return len(f.data)
    if f.member is not None:
        return f.member.size
    assert f.source is not None
    with open_regular(f.source) as fh:
        return os.fstat(fh.fileno()).st_size


def context_tar_layout(context: BuildContext, *, mtime: int) -> tuple[list[bytes | tuple[ContextFile, int]], int]:
    """The build context as a reproducible tar (sorted, root-owned, one fixed mtime), laid out before any
    file is read: its pieces in order (a header's or the end's bytes, or a context file and its size, whose
    data and padding come there), and the tar's whole size."""
    pieces: list[bytes | tuple[ContextFile, int]] = []
    at = 0
    dirs: set[str] = set()
    for f in context.files:
        parts = f.name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                pieces.append(tar_header(tar_info(d, 0o755, mtime, folder=True)))
                at += len(pieces[-1])
        size = _size(f)
        pieces.append(tar_header(tar_info(f.name, f.mode, mtime, size)))
        pieces.append((f, size))
        at += len(pieces[-2]) + size + len(tar_padding(size))
    pieces.append(tar_end(at))
    return pieces, at + len(pieces[-1])


def context_file_chunks(f: ContextFile, size: int) -> Iterator[bytes]:
    """A context file's bytes as laid out (``size`` of them), in pieces of up to 1 MiB; InputError when
    they are not the bytes the plan hashed (the file changed since)."""
    if f.data is not None:
        yield f.data
        return
    sha = hashlib.sha256()
    opened = open_member(f.prebuilt, f.member) if f.member is not None else open_regular(f.source)  # type: ignore[arg-type]
    with opened as fh:
        left = size
        while left:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                break
            sha.update(chunk)
            left -= len(chunk)
            yield chunk
    if left or sha.hexdigest() != f.sha256:
        if f.member is not None:
            raise InputError(f"{f.prebuilt.file.path}: {f.member.source} changed while the build context "  # type: ignore[union-attr]
                             "was written; run the build again")
        raise InputError(f"{f.source}: changed while the build context was written; run the build again")


def write_context_tar(context: BuildContext, fileobj: BinaryIO, *, mtime: int) -> None:
    """The build context as a reproducible tar: sorted, root-owned, one fixed mtime."""
    pieces, _ = context_tar_layout(context, mtime=mtime)
    for piece in pieces:
        if isinstance(piece, bytes):
            fileobj.write(piece)
            continue
        f, size = piece
        for chunk in context_file_chunks(f, size):
            fileobj.write(chunk)
        fileobj.write(tar_padding(size))


RENDERED_FILES = ("Dockerfile", "entrypoint.sh", "self-check.sh")  # in each folder under RENDERED
RENDERED = Path("dockerfiles", "rendered")  # under the project root: the reviewable copies, one folder per selection


def write_rendered(context: BuildContext, root: Path) -> Path:
    """Write the reviewable outputs to ``dockerfiles/rendered/<selection>/``; returns the folder."""
    out = root / RENDERED / context.selection
    for part in (root / "dockerfiles", out.parent, out):  # written where they are shown, never through a link
        if part.is_symlink():
            raise InputError(f"{part}: is a symlink; the rendered copies are written only inside the project: "
                             "remove it")
    out.mkdir(parents=True, exist_ok=True)
    for name in context.rendered:  # all checked before any is written: the copies stay one render's
        target = out / name
        if os.path.lexists(target) and not target.is_symlink() and not target.is_file():  # a link is replaced
            raise InputError(f"{target}: is not a regular file; the rendered copies replace only files: remove it")
    for name, text in context.rendered.items():
        write_atomic(out, name, text)
    return out
