"""The supply-chain stages of a release: signing keys checked, the SBOM, the reconstruct kit, the
provenance; and what they hand to the publish stage.

Each writes its file into the release's staging folder (nothing is final until the publish stage
renames the folder) and gives a frozen record of it; the publish stage lists them in
``SHA256SUMS``, ``manifest.json`` and the notes, and signs ``SHA256SUMS`` before the folder is
committed. The stages are declared in :data:`unibake.pipeline.STAGES`.
"""

from __future__ import annotations

import errno
import hashlib
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .engine import Engine
from .errors import DiskFull, EngineError, UnibakeError, VerificationError
from .files import write_atomic
from .inputs import LOCK_FILE, sha256_file
from .manifest import Signature, SupplyChain, SupplyFile
from .normalise import EPOCH_LABEL
from .plan import INSTALL_ROOT, ReleasePlan, display_path
from .provenance import PROVENANCE, TOOLCHAIN_ROLE, Material, builder_id, provenance_document
from .sbom import SBOM, BaseImage, repo_digests, sbom_document
from .sanitise import enforce, scan_release_texts
from .signing import Signer, check_keys, public_keys, read_public_key, verify_signature

if TYPE_CHECKING:
    from .pipeline import Run
    from .publish import ReleaseFolder


@dataclass(frozen=True, kw_only=True)
class Sbom:
    """The SBOM written, and what it found out about the images the release was built on."""

    file: SupplyFile
    base: BaseImage | None
    builder: BaseImage | None
    engine_version: str
    packages: int
    libraries: int
    toolchains: tuple[BaseImage, ...] = ()  # the kernels' other builder images (plan.toolchain_images)


@dataclass(frozen=True, kw_only=True)
class Kit:
    file: SupplyFile
    context_sha256: str
    dockerfile_sha256: str


@dataclass(frozen=True, kw_only=True)
class Provenance:
    file: SupplyFile
    signatures: dict[str, str]  # the provenance's own signature files: name -> sha256


def image_record(engine: Engine, ref: str, role: str) -> BaseImage:
    """An image the release was built on, by ID, and by the repository digests the engine knows for it in
    the ref's repository (its ``RepoDigests``, and the ref's own when it names one): none for an image
    built or loaded there."""
    info = engine.inspect_image(ref)
    if info is None:
        raise EngineError(f"the {role} {ref} is gone from the engine at {engine.address}")
    return BaseImage(ref=ref, image_id=info.id, diff_ids=info.diff_ids,
                     repo_digests=repo_digests(info.repo_digests, ref))


def _epoch(labels: dict[str, str]) -> int | None:
    value = labels.get(EPOCH_LABEL, "")  # an image's label: "²" is a digit, 10**20 no time
    return int(value) if value.isdigit() and value.isascii() and len(value) < 12 else None


# RFC 3339, as an engine writes an image config's created (Go's RFC3339Nano): fromisoformat alone takes
# other forms too (a date alone, a time without its zone, read as local time: another SBOM on another host)
CREATED_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)", re.ASCII)


def created_epoch(created: str) -> int | None:
    """An image config's ``created`` as whole seconds since 1970 (the fraction dropped); None when it is
    not an RFC 3339 time from 1970 to the year 2242 (Go's zero time, 0001-01-01, is none)."""
    from .pipeline import MAX_EPOCH

    if not CREATED_RE.fullmatch(created):
        return None
    try:
        seconds = int(datetime.fromisoformat(created).timestamp())
    except (ValueError, OverflowError):
        return None
    return seconds if 0 <= seconds <= MAX_EPOCH else None


# --- signing keys ------------------------------------------------------------------------------


def signing_keys_skip(run: Run) -> str | None:
    return None if run.request.sign or run.request.sign_minisign else "no --sign or --sign-minisign given"


def signing_keys(run: Run) -> tuple:
    signer = check_keys(run.request.sign, run.request.sign_minisign, run.request.env)
    for record in signer.records:
        run.reporter.info(f"    {record.kind} key {record.key}: signs (a probe was signed)")
    return (signer,)


# --- the SBOM ----------------------------------------------------------------------------------


def sbom_stage(run: Run) -> tuple:
    target, image, archive = run["target"], run["image"], run["archive"]
    plan: ReleasePlan | None = run.get("plan")
    contents = archive.contents
    if contents is None:
        raise VerificationError("the archive stage read no layers for the SBOM")
    if contents.not_inspected:
        run.reporter.warn(f"{len(contents.not_inspected)} layers could not be read for the SBOM "
                          f"(first {contents.not_inspected[0][:19]}): their packages are not listed")
    for problem in contents.problems[:5]:
        run.reporter.warn(f"SBOM: {problem}")
    base = image_record(run.engine, target.base_image, "base image") if target.base_image else None
    if base is not None and tuple(image.diff_ids[:len(base.diff_ids)]) != tuple(base.diff_ids):
        raise VerificationError(f"the base image {base.ref} is now {base.image_id}, whose layers are not the first "
                                f"layers of {image.ref}: it changed since the build; build again")
    builder = image_record(run.engine, plan.builder_image, "builder image") if plan and plan.builder_image else None
    toolchains = tuple(image_record(run.engine, ref, TOOLCHAIN_ROLE) for ref in plan.toolchain_images) if plan \
        else ()
    engine_version = run.engine.version()
    labels = image.labels
    epoch = _epoch(labels)
    # an image unibake did not build (archive IMAGE) may have no epoch label: its config's created is the
    # SBOM's time then, the same for the same image (never the wall clock)
    created = created_epoch(image.created) if epoch is None else None
    if epoch is None and created is None:
        run.reporter.warn(f"{image.ref} has no {EPOCH_LABEL} label and its config's created "
                          f"{image.created[:40]!r} is not an RFC 3339 time: the SBOM's timestamp is 1970-01-01")
    text = sbom_document(product=target.product, release=target.release, tag=image.ref,
                         version=labels.get("org.opencontainers.image.version", target.release),
                         image_id=image.image_id, diff_ids=image.diff_ids,
                         components=target.metadata.components if target.metadata else (), contents=contents,
                         base=base, engine_version=engine_version, install_root=INSTALL_ROOT, epoch=epoch,
                         created=created)
    sha = write_atomic(run["folder"].staging, SBOM, text)
    debs = sum(1 for p in contents.packages if p.kind in ("deb", "apk", "rpm"))
    conda = sum(1 for p in contents.packages if p.kind == "conda")
    also = f"{conda} conda packages, " if conda else ""
    run.reporter.info(f"    {debs} OS packages, {len(contents.packages) - debs - conda} Python packages, {also}"
                      f"{len(contents.libraries)} libraries under {INSTALL_ROOT}, from {contents.layers} layers")
    return (Sbom(file=SupplyFile(name=SBOM, bytes=len(text.encode()), sha256=sha), base=base, builder=builder,
                 engine_version=engine_version, packages=len(contents.packages), libraries=len(contents.libraries),
                 toolchains=toolchains),)


# --- the reconstruct kit -----------------------------------------------------------------------


def kit_skip(run: Run) -> str | None:
    return None if run.get("plan") is not None else "the image was not built from profiles here"


def kit_begin_stage(run: Run) -> tuple:
    """The kit begun in a thread (its context tar written, hashed and compressed). Its thread starts once
    the build has ended, beside the export, which waits on the engine for most of its time with a core to
    spare (a cold build keeps both busy); on a base release (a hotfix, a release made ``--from`` one) at once,
    beside a build that is mostly steps from the build memo, waiting on the engine: on the realistic
    product, a ``--from`` release took 6.0-6.2 s so, 6.3-7.7 s with the kit beside the frames' copy and the
    read back."""
    from .kit import KitDraft, kit_name

    target = run["target"]
    reuse = _base_kit(run)
    draft = KitDraft(run["folder"].staging, kit_name(target.product, target.release), plan=run["plan"],
                     context=run["context"], release=target.release, epoch=run.epoch, reuse=reuse,
                     vouched=_kit_frames_known(run) if reuse is not None else None)
    run.stack.callback(draft.abandon)  # after a failure: stopped, its file removed (nothing once finished)
    if run.get("base") is not None:
        draft.begin_in_thread()
    else:
        run.after("build", draft.begin_in_thread)
    return (draft,)


def _kit_frames(run: Run) -> tuple[Path, bytes] | None:
    """Where this user's record of kit frames lies, and the key it is signed with (:mod:`unibake.framememo`);
    None without the key (then every copied frame is decoded, and nothing is recorded)."""
    from . import buildmemo
    from .framememo import FOLDER
    from .pipeline import BUILD_MEMO

    key = buildmemo.secret(run.request.env)
    return None if key is None else (run["plan"].project_root / BUILD_MEMO / FOLDER, key)


def _kit_frames_known(run: Run) -> dict[str, tuple[str, int, int]]:
    """The frames this user's kits made or decoded; none with --no-cache (every copied frame decoded)."""
    from .framememo import known_kit_frames

    where = _kit_frames(run)
    return {} if where is None or run.request.nocache else known_kit_frames(*where)


def _remember_kit_frames(run: Run, draft) -> None:
    """A finished kit's frames kept for the next kit made on this release. A record that cannot be written costs that
    kit the decoding of the frames it copies, nothing else."""
    from .framememo import remember_kit_frames

    where = _kit_frames(run)
    if where is None or run.request.hold:
        return
    try:
        remember_kit_frames(*where, draft.made_frames())
    except (OSError, UnibakeError) as exc:
        run.reporter.info(f"    the kit frames' record was not kept ({exc}): a kit made on this release decodes "
                          "the frames it copies")


def _base_kit(run: Run) -> tuple[Path, str, int] | None:
    """A hotfix's base release's kit, as its manifest records it (name and sha256): the frames of the large
    files that did not change are copied from it, not compressed again (the same bytes)."""
    from .kit import kit_name

    base = run.get("base")
    supply = base.manifest.supply_chain if base is not None else None
    kit = supply.kit if supply is not None else None
    if kit is None or kit.name != kit_name(base.manifest.product, base.manifest.release):
        return None
    return base.folder / kit.name, kit.sha256, kit.bytes


def kit_stage(run: Run) -> tuple:
    from .kit import KitDraft, kit_name

    target, image, sbom = run["target"], run["image"], run["sbom"]
    plan: ReleasePlan = run["plan"]
    if sbom.base is None:
        raise VerificationError(f"the kit of {target.release} needs its base image's ID")
    name = kit_name(target.product, target.release)
    epoch = _epoch(image.labels)  # what the image was built with, as the manifest records it
    epoch = run.epoch if epoch is None else epoch
    draft: KitDraft | None = run.get("kit_draft")
    if draft is not None and draft.epoch != epoch:  # normalise writes run.epoch into the label: cannot be
        raise VerificationError(f"the kit of {target.release} was begun with the epoch {draft.epoch}, "
                                f"the image records {epoch}")
    if draft is None:  # not begun (a run of single stages)
        draft = KitDraft(run["folder"].staging, name, plan=plan, context=run["context"], release=target.release,
                         epoch=epoch)
        run.stack.callback(draft.abandon)
    try:
        written = draft.finish(image_id=image.image_id, diff_ids=image.diff_ids,
                               revision=image.labels.get("org.opencontainers.image.revision", run.request.revision),
                               base=sbom.base, builder=sbom.builder, toolchains=sbom.toolchains)
    except OSError as exc:  # the folder named, as the archive's disk errors are (it was "a file")
        where = run["folder"].staging
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"no space left in {where} while writing the reconstruct kit {name}; nothing was "
                           "published") from None
        raise UnibakeError(f"cannot write the reconstruct kit {name} in {where} ({exc.strerror}); nothing was "
                           "published") from None
    _remember_kit_frames(run, draft)
    run.reporter.info(f"    {name}: {written.file.bytes} bytes, {written.files} files in its ledger")
    if draft.reuse_note:
        run.reporter.info(f"    {draft.reuse_note}")
    return (Kit(file=written.file, context_sha256=written.context_sha256,
                dockerfile_sha256=written.dockerfile_sha256),)


def kit_images(run: Run) -> tuple[dict[str, str], ...]:
    """Every image the kit's rebuild needs in its engine (the base, the builder, the toolchains), with its
    ID, as the release notes name them; none when no kit was written."""
    sbom: Sbom | None = run.get("sbom")
    if sbom is None or run.get("kit") is None:
        return ()
    images = [("base image", sbom.base), ("builder image", sbom.builder)]
    images += [(TOOLCHAIN_ROLE, image) for image in sbom.toolchains]
    return tuple({"role": role, "ref": image.ref, "image_id": image.image_id} for role, image in images
                 if image is not None)


# --- the provenance ----------------------------------------------------------------------------


def materials(plan: ReleasePlan) -> tuple[Material, ...]:
    """The files a build was made from: every input of inputs.lock, the profiles, and the lock."""
    out = [Material(name=f.path, sha256=f.sha256, role="input") for f in plan.inputs]
    out += [Material(name=rel, sha256=hashlib.sha256(plan.config_data(rel)).hexdigest(), role="profile")
            for rel in plan.config_files]
    lock = (plan.config_dir / LOCK_FILE).relative_to(plan.project_root).as_posix()
    out.append(Material(name=lock, sha256=hashlib.sha256(plan.config_data(lock)).hexdigest(), role="lock"))
    return tuple(out)


def build_parameters(run: Run) -> dict[str, object]:
    """What the command line asked for that shapes the release (never a key or a password)."""
    request = run.request
    plan: ReleasePlan | None = run.get("plan")
    out: dict[str, object] = {
        "command": "hotfix" if request.base else "build" if plan is not None else "archive",
        "release": run["target"].release, "level": request.level, "long_distance": request.long_distance,
        "split": request.split, "roundtrip": request.roundtrip, "source_date_epoch": run.epoch,
    }
    if plan is not None:
        out.update(profiles=list(plan.profile_names), version=plan.version,
                   config=display_path(plan.config_dir, plan.project_root), nocache=request.nocache)
    if request.base:
        out["hotfix_from"] = request.base
    if request.earlier and run.get("base") is not None:  # (build without --from: the release it was made on)
        out["made_on"] = run["base"].manifest.release
    if request.image:
        out["image"] = request.image
    return {k: v for k, v in out.items() if v is not None}


def provenance_stage(run: Run) -> tuple:
    target, image, archive, proof, sbom = run["target"], run["image"], run["archive"], run["proof"], run["sbom"]
    kit: Kit | None = run.get("kit")
    plan: ReleasePlan | None = run.get("plan")
    signer: Signer | None = run.get("signer")
    staging: Path = run["folder"].staging
    subjects = {f.name: proof.back.file_sha256[f.name] for f in archive.files}
    subjects[sbom.file.name] = sbom.file.sha256
    byproducts = {}
    if kit is not None:
        subjects[kit.file.name] = kit.file.sha256
        byproducts = {"context.tar": kit.context_sha256, "Dockerfile": kit.dockerfile_sha256}
    # an image released as it is (archive IMAGE) is itself the material
    source = None if plan is not None else BaseImage(ref=image.ref, image_id=image.image_id, diff_ids=image.diff_ids,
                                                     repo_digests=repo_digests(image.repo_digests, image.ref))
    text = provenance_document(
        subjects=subjects, image_ref=image.ref, image_id=image.image_id, parameters=build_parameters(run),
        materials=materials(plan) if plan is not None else (), revision=run.request.revision if plan else "",
        base=sbom.base, builder=sbom.builder, toolchains=sbom.toolchains, source_image=source,
        engine_version=sbom.engine_version,
        byproducts=byproducts, builder_id=builder_id(run.request.env))
    # the gate the release's texts pass (the SBOM's paths are the image's own, not the builder's: not scanned)
    enforce(scan_release_texts({PROVENANCE: text}, run.request.identity), run.allow, f"release {target.release}")
    sha = write_atomic(staging, PROVENANCE, text)
    signatures = {}
    if signer is not None:
        for name in signer.sign(staging / PROVENANCE, f"{target.product} {target.release} {PROVENANCE}", text.encode()):
            signatures[name] = sha256_file(staging / name)
    run.reporter.info(f"    {len(subjects) + 1} subjects" + (f", signed: {', '.join(signatures)}" if signatures else ""))
    return (Provenance(file=SupplyFile(name=PROVENANCE, bytes=len(text.encode()), sha256=sha), signatures=signatures),)


def supply_chain(run: Run) -> SupplyChain | None:
    """The manifest's record of the supply-chain files, when the stages ran."""
    sbom: Sbom | None = run.get("sbom")
    provenance: Provenance | None = run.get("provenance")
    if sbom is None or provenance is None:
        return None
    kit: Kit | None = run.get("kit")
    signer: Signer | None = run.get("signer")
    from .publish import SUMS

    signatures = tuple(Signature(kind=r.kind, key=r.key, files=(SUMS + r.suffix, provenance.file.name + r.suffix))
                       for r in (signer.records if signer else ()))
    return SupplyChain(sbom=sbom.file, provenance=provenance.file, kit=kit.file if kit else None,
                       signatures=signatures)


def extra_files(run: Run) -> dict[str, str]:
    """The files the supply-chain stages wrote into the staging folder, for SHA256SUMS: name -> sha256."""
    out = {}
    for key in ("sbom", "kit", "provenance"):
        result = run.get(key)
        if result is not None:
            out[result.file.name] = result.file.sha256
    provenance: Provenance | None = run.get("provenance")
    if provenance is not None:
        out.update(provenance.signatures)
    return out


def sign_sums(run: Run):
    """What the publish stage calls on SHA256SUMS once written, before the folder is committed."""
    signer: Signer | None = run.get("signer")
    if signer is None:
        return None
    target = run["target"]
    return lambda path, data: signer.sign(path, f"{target.product} {target.release} {path.name}", data)


def carried_first_release(run: Run, folder: ReleaseFolder) -> str | None:
    """When the release a --force run replaces was first published, as the new release carries it over
    (:attr:`ReleaseFolder.first_release`). Whoever can rewrite that folder's manifest.json and SHA256SUMS
    alike could forge it, and rank the release for ever (prune, previous_release): a signed run carries it
    only when one of its own keys signed the very SHA256SUMS that listed that manifest; else it warns, and
    the new release counts as first published now. An unsigned run has no key to check it with: carried."""
    from .publish import SUMS, SUMS_LIMIT

    signer: Signer | None = run.get("signer")
    if folder.first_release is None or signer is None:
        return folder.first_release
    with tempfile.TemporaryDirectory(prefix="unibake-keys-") as temp:
        checks = [verify_signature(folder.final, SUMS, read_public_key(key), run.request.env, limit=SUMS_LIMIT)
                  for key in public_keys(signer, Path(temp))]
    if any(c.passed and c.data == folder.first_release_sums for c in checks):
        return folder.first_release
    why = "; ".join(f"{c.target}: {c.detail}" if not c.passed else f"{c.target}: signs another {SUMS} than the one "
                    "read" for c in checks)
    run.reporter.warn(f"{folder.final}: when the release it replaces was first published ({folder.first_release}) "
                      f"is not carried over: its {SUMS} is not signed by this run's key ({why}); the new release "
                      "counts as first published now")
    return None
