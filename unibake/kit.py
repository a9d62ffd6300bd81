"""The reconstruct kit: ``<product>-<tag>-kit.tar.zst``, everything needed to rebuild a release's
image and check that it is the one released.

    <product>-<tag>-kit/
      Dockerfile         the rendered Dockerfile
      context.tar        the build context exactly as it was sent to the engine (same bytes)
      inputs.lock        the ledger of every baked input
      profiles/*.yaml    the profiles it was rendered from (their paths from the project root)
      tool/              unibake itself at the release's version: the package, build.py, the pins
      kit.json           the release: image ID, diffIDs, SOURCE_DATE_EPOCH, revision, base and builder by ID
      README.md          what this is
      verify.sh          ./verify.sh checks every file against kit.sha256; --rebuild rebuilds and compares
      kit.sha256         the kit's own ledger (sha256sum format)

Why the tool travels with the kit: the image ID depends on the normalise stage, which rewrites the
built image (times set to ``SOURCE_DATE_EPOCH``, the config's build traces removed); a plain
``docker build`` of the context gives another ID every time. The rebuild (``build.py rebuild``,
run by ``verify.sh --rebuild`` from the kit's own copy of unibake in a virtual environment made from
its pins) builds ``context.tar`` on the engine at hand with the release's build arguments, without
the cache, normalises it with the release's epoch, and compares the image ID with ``kit.json``'s.
The base and builder images must be in that engine with the IDs the release was built on; the
rebuild refuses before building when they are not.

The kit is deterministic (sorted entries, fixed owners, times set to the epoch, zstd with workers,
whose frames are the same bytes for any number of workers from 1 up), so ``build.py kit
RELEASE_DIR --out DIR`` writes, from the checkout, a kit byte for byte equal to the one published,
after checking the checkout's inputs and profiles against the release's provenance.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from . import __version__
from .archive import DEFAULT_LEVEL, compressor
from .builder import BuiltImage, Image, cache_ref, iso_time, keep_as_cache
from .engine import Engine
from .errors import BuildFailed, InputError, UnibakeError, VerificationError
from .files import fsync_dir, read_small_text
from .inputs import LOCK_FILE, sha256_file
from .manifest import TAG_PATTERN, Tool
from .metadata import DIGEST, HEX64, Digest, Record, first_error
from .plan import INSTALL_ROOT, ReleasePlan
from .render import BuildContext, write_context_tar
from .sbom import BaseImage
from .sums import parse_sums, render_sums
from .templates import render_template

KIT_JSON = "kit.json"
LEDGER = "kit.sha256"
CONTEXT = "context.tar"
SCHEMA = 1
KIT_REPOSITORY = "unibake-kit"  # the rebuilt image's tag: never the release's own, which it must not move
PACKAGE = Path(__file__).resolve().parent
SKIPPED = ("__pycache__", ".venv")


class KitImage(Record):
    ref: str = Field(max_length=512)
    image_id: str = Field(pattern=DIGEST)


class KitRecord(Record):
    """``kit.json``: the release a kit rebuilds, and everything the rebuild needs to be identical."""

    schema_version: Literal[1] = Field(alias="schema")
    product: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")
    release: str = Field(pattern=TAG_PATTERN)
    tag: str = Field(max_length=255)
    version: str = Field(max_length=128)
    profiles: tuple[str, ...]
    image_id: str = Field(pattern=DIGEST)
    diff_ids: tuple[Digest, ...]
    source_date_epoch: int = Field(ge=0)
    revision: str = Field(max_length=256)
    base: KitImage
    builder: KitImage | None
    tool: Tool
    install_root: str = Field(pattern=r"^/[A-Za-z0-9_./-]+$")
    context_sha256: str = Field(pattern=HEX64)
    dockerfile_sha256: str = Field(pattern=HEX64)

    model_config = Record.model_config | {"populate_by_name": True}

    @property
    def build_args(self) -> dict[str, str]:
        """The build arguments the pipeline's build stage passes (``builder.build_image``)."""
        return {"UNIBAKE_REVISION": self.revision, "UNIBAKE_CREATED": iso_time(self.source_date_epoch)}


@dataclass(frozen=True, kw_only=True)
class WrittenKit:
    file: object  # manifest.SupplyFile
    context_sha256: str
    dockerfile_sha256: str
    files: int


def kit_name(product: str, release: str) -> str:
    return f"{product}-{release}-kit.tar.zst"


def _tool_files() -> dict[str, tuple[bytes | Path, int]]:
    """unibake as it runs now: its package, build.py, pyproject.toml and pins (``tool/...``)."""
    out: dict[str, tuple[bytes | Path, int]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        rel = path.relative_to(PACKAGE)
        if path.is_file() and not any(part in SKIPPED for part in rel.parts) and path.suffix in (".py", ".j2"):
            out[f"tool/unibake/{rel.as_posix()}"] = (path, 0o644)
    checkout = PACKAGE.parent
    for name in ("build.py", "pyproject.toml", "requirements.txt"):
        if (checkout / name).is_file():
            out[f"tool/{name}"] = (checkout / name, 0o755 if name == "build.py" else 0o644)
    if "tool/requirements.txt" not in out:  # installed from a wheel: pin what runs now
        pins = sorted({f"{d.metadata['Name']}=={d.version}\n" for d in importlib.metadata.distributions()
                       if d.metadata["Name"] and d.metadata["Name"].lower() != "unibake"})
        out["tool/requirements.txt"] = (("# the environment unibake ran in\n" + "".join(pins)).encode(), 0o644)
    if "tool/build.py" not in out:
        out["tool/build.py"] = (b"#!/usr/bin/env python3\nimport sys\nfrom unibake.cli import main\nsys.exit(main())\n",
                                0o755)
    return out


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what passes to ``fh``."""

    def __init__(self, fh):
        self.fh, self.sha, self.bytes = fh, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha.update(data)
        self.bytes += len(data)
        return self.fh.write(data)


def write_kit(out: Path, name: str, *, plan: ReleasePlan, context: BuildContext, release: str, image_id: str,
              diff_ids: tuple[str, ...], epoch: int, revision: str, base: BaseImage,
              builder: BaseImage | None, expect_context: str | None = None) -> WrittenKit:
    """Write ``out/name`` (via a temporary name): the kit of the release of ``plan``.
    ``expect_context``: the sha256 the build context must have; nothing is written otherwise."""
    from .manifest import SupplyFile

    top = name.removesuffix(".tar.zst")
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as context_tar:
        write_context_tar(context, context_tar, mtime=epoch)  # the same call, the same bytes as the build stage's
        context_tar.seek(0)
        context_sha = hashlib.file_digest(context_tar, "sha256").hexdigest()
        if expect_context is not None and context_sha != expect_context:
            raise VerificationError(f"the build context of {plan.tag} rendered here (sha256 {context_sha[:16]}...) "
                                    f"differs from the one release {release} was built from ({expect_context[:16]}...); "
                                    "no kit was written")
        dockerfile = context.dockerfile.encode()
        record = KitRecord(
            schema_version=SCHEMA, product=plan.product, release=release, tag=plan.tag, version=plan.version,
            profiles=plan.profile_names, image_id=image_id, diff_ids=diff_ids, source_date_epoch=epoch,
            revision=revision, base=KitImage(ref=base.ref, image_id=base.image_id),
            builder=KitImage(ref=builder.ref, image_id=builder.image_id) if builder else None,
            tool=Tool(name="unibake", version=__version__), install_root=INSTALL_ROOT, context_sha256=context_sha,
            dockerfile_sha256=hashlib.sha256(dockerfile).hexdigest())
        entries: dict[str, tuple[bytes | Path | object, int]] = {
            "Dockerfile": (dockerfile, 0o644), CONTEXT: (context_tar, 0o644),
            LOCK_FILE: ((plan.config_dir / LOCK_FILE).read_bytes(), 0o644),
            KIT_JSON: ((record.model_dump_json(by_alias=True, indent=2) + "\n").encode(), 0o644),
            "README.md": (render_template("kit-README.md.j2", k=record, kit=name, top=top).encode(), 0o644),
            "verify.sh": (render_template("kit-verify.sh.j2", k=record, kit=name).encode(), 0o755),
        }
        for rel in plan.config_files:
            entries[rel] = ((plan.project_root / rel).read_bytes(), 0o644)
        entries.update(_tool_files())
        digests = {}
        for rel, (content, _) in entries.items():
            if isinstance(content, bytes):
                digests[rel] = hashlib.sha256(content).hexdigest()
            elif isinstance(content, Path):
                digests[rel] = sha256_file(content)
            else:
                digests[rel] = context_sha
        entries[LEDGER] = (render_sums(digests).encode(), 0o644)
        temp = out / f".{name}.tmp"
        try:
            with open(temp, "wb") as fh:
                counted = _Hashing(fh)
                with compressor(DEFAULT_LEVEL, False, threads=-1).stream_writer(counted, closefd=False) as zw:
                    _write_tar(zw, top, entries, epoch)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temp, out / name)
            fsync_dir(out)
        finally:
            temp.unlink(missing_ok=True)
    return WrittenKit(file=SupplyFile(name=name, bytes=counted.bytes, sha256=counted.sha.hexdigest()),
                      context_sha256=context_sha, dockerfile_sha256=record.dockerfile_sha256, files=len(digests))


def _write_tar(fileobj, top: str, entries: dict, epoch: int) -> None:
    """A tar in one fixed form: sorted, folders first, root-owned, every time the epoch."""
    folders = {top}
    for rel in entries:
        parts = rel.split("/")[:-1]
        folders.update(f"{top}/{'/'.join(parts[:i])}" for i in range(1, len(parts) + 1))
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for folder in sorted(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        for rel in sorted(entries):
            content, mode = entries[rel]
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.mode, info.mtime = mode, epoch
            if isinstance(content, bytes):
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            elif isinstance(content, Path):
                with open(content, "rb") as fh:
                    info.size = os.fstat(fh.fileno()).st_size
                    tar.addfile(info, fh)
            else:
                content.seek(0, os.SEEK_END)
                info.size = content.tell()
                content.seek(0)
                tar.addfile(info, content)


# ---------------------------------------------------------------------------------------------
# An unpacked kit: its ledger, and the rebuild


def read_kit(folder: Path) -> KitRecord:
    text = read_small_text(folder / KIT_JSON, VerificationError, limit=1 << 20, what="not a reconstruct kit folder",
                           follow=False)
    try:
        return KitRecord.model_validate_json(text)
    except ValidationError as exc:
        raise VerificationError(f"{folder / KIT_JSON}: not a valid kit record: {first_error(exc)}") from None


def check_ledger(folder: Path) -> list[str]:
    """Every file against ``kit.sha256``: what differs, is missing, or is not listed."""
    text = read_small_text(folder / LEDGER, VerificationError, limit=16 << 20, what="not a reconstruct kit folder",
                           follow=False)
    listed = {e.name: e.sha256 for e in parse_sums(text, str(folder / LEDGER), VerificationError)}
    problems = []
    for rel, sha in sorted(listed.items()):
        path = folder / rel
        if ".." in Path(rel).parts or rel.startswith("/"):
            problems.append(f"{rel}: a path outside the kit")
        elif not path.is_file() or path.is_symlink():
            problems.append(f"{rel}: missing")
        elif sha256_file(path) != sha:
            problems.append(f"{rel}: differs from {LEDGER}")
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if any(part in SKIPPED for part in path.relative_to(folder).parts) or rel == LEDGER:
            continue
        if (path.is_file() or path.is_symlink()) and rel not in listed:
            problems.append(f"{rel}: not listed in {LEDGER}")
    return problems


def check_kit(folder: Path) -> KitRecord:
    """An unpacked kit, checked against its ledger and its record; VerificationError otherwise."""
    problems = check_ledger(folder)
    if problems:
        raise VerificationError(f"{folder}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                                               else ""))
    record = read_kit(folder)
    if sha256_file(folder / CONTEXT) != record.context_sha256:
        raise VerificationError(f"{folder / CONTEXT}: its sha256 differs from kit.json's context_sha256")
    return record


@dataclass(frozen=True, kw_only=True)
class Rebuilt:
    record: KitRecord
    image: Image
    ref: str

    @property
    def matches(self) -> bool:
        return self.image.image_id == self.record.image_id


def rebuild(folder: Path, engine: Engine, *, on_line: Callable[[str], None] = lambda line: None,
            progress: Callable[[int], object] = lambda n: None) -> Rebuilt:
    """Build the kit's context on ``engine`` as the release was built (no cache), normalise it, and
    return the result for comparison; tags it ``unibake-kit/<product>:<release>``."""
    from .normalise import normalise_image

    record = check_kit(folder)
    context = folder / CONTEXT
    for role, image in (("base image", record.base), ("builder image", record.builder)):
        if image is None:
            continue
        info = engine.inspect_image(image.ref)
        if info is None or info.id != image.image_id:
            have = f"is {info.id}" if info else "is missing"
            raise InputError(f"the {role} {image.ref} {have} in the engine at {engine.address}; release "
                             f"{record.release} was built on {image.image_id}: load that image, then rebuild")
    ref = f"{KIT_REPOSITORY}/{record.product}:{record.release}"
    selection = f"kit-{record.release}"
    with open(context, "rb") as fh:
        try:
            outcome = engine.build(fh, tag=ref, buildargs=record.build_args, nocache=True, on_line=on_line)
        except BuildFailed as exc:
            for n, stage in enumerate(exc.stage_images, 1):
                keep_as_cache(engine, cache_ref(record.product, selection, f"stage{n}"), stage)
            keep_as_cache(engine, cache_ref(record.product, selection, "failed"), exc.last_image)
            raise
    for n, stage in enumerate(outcome.stage_images, 1):  # as the build stage keeps them: cache, never dangling
        keep_as_cache(engine, cache_ref(record.product, selection, f"stage{n}"), stage)
    info = engine.inspect_image(ref)
    if info is None:
        raise UnibakeError(f"the rebuild finished but {ref} is not in the engine")
    built = BuiltImage(image_id=info.id, tag=ref, diff_ids=info.diff_ids, steps=outcome.steps,
                       stage_images=outcome.stage_images, seconds=0.0, size=info.size)
    image = normalise_image(engine, built, epoch=record.source_date_epoch, base_image=record.base.ref,
                            owned=record.install_root, cache=None, progress=progress)
    if image.image_id != built.image_id:
        keep_as_cache(engine, cache_ref(record.product, selection, "build"), built.image_id)
    return Rebuilt(record=record, image=image, ref=ref)


# ---------------------------------------------------------------------------------------------
# The kit of an existing release, again


def kit_for_release(release: Path, config: Path, out: Path, cwd: Path) -> tuple[WrittenKit, str | None]:
    """Write the kit of the release in ``release`` again, into ``out``, from the checkout's profiles
    and inputs, after checking them against the release's provenance; returns the kit and the
    sha256 the release published for it (None when it has none). The context rendered now must be
    the one the release was built from (its sha256 is a byproduct in the provenance)."""
    from .manifest import load_manifest
    from .plan import make_plan
    from .provenance import PROVENANCE, PROVENANCE_LIMIT, byproducts_of, materials_of, parse_provenance
    from .render import render
    from .verify import read_sums

    manifest = load_manifest(release, InputError)
    where = f"release {manifest.release} ({release})"
    if manifest.supply_chain is None or manifest.source_date_epoch is None:
        raise InputError(f"{where} has no provenance (it was made before unibake wrote one): its inputs cannot be "
                         "checked, so no kit is written")
    if manifest.tool.version != __version__:
        raise InputError(f"{where} was made by unibake {manifest.tool.version}, this is {__version__}: run the kit "
                         f"command of that version (revision {manifest.revision})")
    text = read_small_text(release / PROVENANCE, VerificationError, limit=PROVENANCE_LIMIT, follow=False)
    if hashlib.sha256(text.encode()).hexdigest() != read_sums(release).get(PROVENANCE):
        raise VerificationError(f"{release / PROVENANCE}: differs from SHA256SUMS; the release cannot be trusted")
    document = parse_provenance(text, str(release / PROVENANCE))
    from .platforms import KNOWN

    # the release's platform: its base, builder and prebuilt kernels are that platform's
    plan = make_plan(config, profiles=list(manifest.profiles), version=manifest.version, cwd=cwd,
                     platform=KNOWN.get(manifest.platform or ""))
    if plan.tag != manifest.tag:
        raise InputError(f"the profiles in {config} give the image {plan.tag}, not {where}'s {manifest.tag}")
    checks = (("input", {f.path: f.sha256 for f in plan.inputs}),
              ("profile", {rel: sha256_file(plan.project_root / rel) for rel in plan.config_files}),
              ("lock", {(plan.config_dir / LOCK_FILE).relative_to(plan.project_root).as_posix():
                        sha256_file(plan.config_dir / LOCK_FILE)}))
    for role, ours in checks:
        theirs = materials_of(document, role)
        for path in sorted(set(ours) | set(theirs)):
            if ours.get(path) != theirs.get(path):
                state = "is not one" if path not in theirs else "is missing here" if path not in ours else "differs"
                raise InputError(f"{role} {path} {state} of {where}'s (its provenance lists them); check out the "
                                 f"revision it was built from ({manifest.revision})")
    images = {}
    for role in ("base image", "builder image"):
        found = materials_of(document, role)
        images[role] = BaseImage(ref=next(iter(found)), image_id=f"sha256:{next(iter(found.values()))}") \
            if found else None
    if images["base image"] is None:
        raise VerificationError(f"{release / PROVENANCE}: names no base image")
    out.mkdir(parents=True, exist_ok=True)
    name = kit_name(manifest.product, manifest.release)
    written = write_kit(out, name, plan=plan, context=render(plan), release=manifest.release,
                        image_id=manifest.image_id, diff_ids=manifest.diff_ids, epoch=manifest.source_date_epoch,
                        revision=manifest.revision, base=images["base image"], builder=images["builder image"],
                        expect_context=byproducts_of(document).get(CONTEXT, "none recorded"))
    kit = manifest.supply_chain.kit
    return written, kit.sha256 if kit else None
