"""The pipeline: one ordered list of stages, declared once, run by one runner.

Each stage names what it needs (results of earlier stages), what it gives, and why it may be
skipped; the runner checks the wiring before anything runs, times every stage, reports progress,
and keeps every result frozen. The commands are selections of :data:`STAGES`:

    build    plan, render, scan context, rendered copies, target, folder, signing keys, build, export,
             scan image, smoke gates, sbom, kit, provenance, publish      (--stage render/build stops
             early, after normalise for build; --sequential: normalise, scan image, archive, round trip
             instead of export)
    hotfix   hotfix base + build's
    archive  inspect, scan inspected, folder, signing keys, archive, round trip, smoke gates, sbom,
             provenance, publish
    repro    build's up to the archive, into a temporary folder, twice; then compare
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from . import buildmemo, supply
from .archive import DEFAULT_LEVEL, Archive, write_archive
from .archive_reader import ReadBack, read_archive, read_back
from .builder import MAX_EPOCH, BuiltImage, Image, build_image, cache_ref, image_platform, keep_as_cache
from .console import Reporter
from .contents import LayerInspector
from .docker_engine import DockerEngine
from .digestmemo import FOLDER as DIGESTS, DigestMemo, remembering
from .engine import Engine
from .files import read_small_file, resolved, unwritable_reason, work_folder, work_folder_done
from .errors import (DiskFull, DocumentPlaceRefused, EngineError, HandoffAborted, InputError, NoLocks, PipelineError,
                     RoundTripUnavailable, UnibakeError, VerificationError)
from .hotfix import HotfixBase, load_base, omitted_layers
from .imagetar import blob_name, check_against, without_members
from .layerstore import archive_image
from .manifest import MANIFEST, GateResult, ReleaseManifest, RoundTripRecord, Validation
from .metadata import ImageMetadata
from .plan import INSTALL_ROOT, ReleasePlan, display_path, make_plan
from .platforms import DEFAULT as DEFAULT_PLATFORM, RECORD_PATTERN as PLATFORM_RECORD, parse as parse_platforms
from .publish import (ReleaseFolder, build_manifest, check_tag, find_releases, held_signals, hold_release,
                      lock_release, previous_release, publish, SUMS, refuse_existing, release_locks, release_tag,
                      render_files)
from .released import refuse_another_release, refuse_moving_a_released_tag, repro_ref
from .schema import NAME_RE
from .render import BuildContext, context_files, render, write_rendered
from .repro import ReproBuild
from .roundtrip import check_base_loaded, round_trip
from .sanitise import enforce, scan_added, scan_context, scan_release_texts, scan_values
from .scratch import ScratchEngine, SeededEngine
from .smoke import OWN_NAMESPACE, run_gates
from .threads import Background


# ---------------------------------------------------------------------------------------------
# What a command asks for


@dataclass(frozen=True, kw_only=True)
class Request:
    """Everything the command line asked for, checked; the pipeline's only input."""

    env: Mapping[str, str]
    cwd: Path
    config: Path = Path("profiles")
    profiles: tuple[str, ...] = ()
    version: str | None = None
    out: Path = Path("release")
    force: bool = False
    level: int = DEFAULT_LEVEL
    long_distance: bool = False
    split: int | None = None
    roundtrip: bool = True
    smoke: bool = True  # --no-smoke: the gates are skipped, the round trip still runs
    verify_engine: str | None = None
    scratch_dir: Path | None = None
    seed: bool = True  # the one-pass export's round trip in a scratch engine kept holding only the base image
    allow: tuple[str, ...] = ()  # sanitisation: values let through, besides product.yaml's
    identity: tuple[str, ...] = ()  # sanitisation: the builder's home and user name
    nocache: bool = False
    engine: str | None = None
    epoch: int = 0  # SOURCE_DATE_EPOCH
    revision: str = "unknown"
    image: str | None = None  # archive: the image to release
    tag: str | None = None  # archive: the release's name
    product: str | None = None  # archive: the product name
    base: str | None = None  # hotfix: the release it builds on
    write_rendered: bool = True  # keep dockerfiles/rendered/ in step with the YAML
    require_lock: bool = True  # False for --stage render: a missing inputs.lock is no error
    hold: str | None = None  # repro: build under unibake-repro/<product>:<hold>, never the release's tag
    sequential: bool = False  # normalise, archive and round trip as three passes instead of one
    engine_save: bool = False  # --engine-save: the image read through the engine's save, never from its storage
    assemble: bool = True  # hotfix: assembled from a small build when it can be (False: --full-build)
    whole: bool = False  # build --from: a whole release on the base's epoch, its archive's frames copied
    earlier: bool = False  # build without --from: made on the newest release at its epoch, when one is found
    platform: str | None = None  # the one to build for (linux/arm64); None: product.yaml's, else the host's
    sign: str | None = None  # --sign: the OpenPGP key (in GNUPGHOME) that signs SHA256SUMS and the provenance
    sign_minisign: Path | None = None  # --sign-minisign: the minisign secret key file
    metadata_file: Path | None = None  # --metadata-file, a file (resolved): never one the run reads or publishes

    @property
    def checksums(self) -> Path:
        return self.out.parent / "checksums"


# ---------------------------------------------------------------------------------------------
# Results that only the pipeline makes


@dataclass(frozen=True, kw_only=True)
class Target:
    """What is released, under which name: the product, the release folder's name, the image."""

    product: str
    release: str
    ref: str  # the image reference the archive is saved from and tagged with
    metadata: ImageMetadata | None  # None: an image unibake did not build (no smoke gates)
    base_image: str | None  # the image it was built on: what it adds is scanned, not the base

    @property
    def archive_name(self) -> str:
        return f"{self.product}-{self.release}.tar.zst"


@dataclass(frozen=True, kw_only=True)
class Scan:
    """A sanitisation pass that found nothing (beyond what the allowlist lets through)."""

    what: str
    allowed: int


@dataclass(frozen=True, kw_only=True)
class Proof:
    """The archive read back: its digests, and the round trip into a fresh engine unless skipped."""

    back: ReadBack
    round_trip: RoundTripRecord | None
    skipped: str  # why there was no round trip
    engine: Engine | None = field(default=None, compare=False)  # where the image is loaded, for the gates
    netns_pid: int | None = None  # the scratch engine's network namespace, for the gates' client


@dataclass(frozen=True, kw_only=True)
class Gates:
    results: tuple[GateResult, ...]
    skipped: str


@dataclass(frozen=True, kw_only=True)
class Release:
    folder: Path
    manifest: ReleaseManifest
    validation: Validation
    archive: Archive


class TempFolder:
    """Where repro writes the archives it compares: a temporary folder, removed at the end."""

    def __init__(self) -> None:
        self.staging = work_folder("unibake-repro-")

    def remove(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        work_folder_done(self.staging)


# ---------------------------------------------------------------------------------------------
# The run


Connect = Callable[[str | None], Engine]  # an engine address (None: the default one) to an engine


class Run:
    """One command's run: the request, the results so far, the engine and what to clean up."""

    def __init__(self, request: Request, reporter: Reporter, stack: ExitStack, connect: Connect):
        self.request, self.reporter, self.stack, self.connect = request, reporter, stack, connect
        self.results: dict[str, object] = {"request": request}
        self._engine: Engine | None = None
        self.builds = False  # whether this run's stages build: the build then says the unset ${NAME}s
        self.publishes = False  # whether they make a release folder (and so a kit, which carries the context)
        self._after: dict[str, list[Callable[[], None]]] = {}
        self.seed: SeededEngine | None = None  # the round trip's seeded verify engine, when it has one
        self.base_check: _BaseArchiveCheck | None = None  # a base release's archive, read beside the build

    def after(self, stage: str, let_go: Callable[[], None]) -> None:
        """Call ``let_go`` once ``stage`` has run or been skipped in this run (what only that stage
        and those before it need: the scratch engine after the smoke gates). A run whose selection
        lacks ``stage`` never calls it: the stack's exit still cleans up, as it always does."""
        self._after.setdefault(stage, []).append(let_go)

    def stage_done(self, stage: str) -> None:
        for let_go in self._after.pop(stage, ()):
            let_go()

    def __getitem__(self, name: str):
        return self.results[name]

    def get(self, name: str):
        return self.results.get(name)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = self.connect(self.request.engine)
        return self._engine

    @property
    def epoch(self) -> int:
        base: HotfixBase | None = self.get("base")
        return base.epoch if base is not None else self.request.epoch

    @property
    def allow(self) -> tuple[str, ...]:
        plan: ReleasePlan | None = self.get("plan")
        return (plan.sanitise_allow if plan else ()) + self.request.allow


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage: what it needs and gives, what it does, and why it may not run."""

    name: str
    about: str
    needs: tuple[str, ...]
    gives: tuple[str, ...]
    run: Callable[[Run], tuple]
    detail: Callable[[Run], str] = lambda run: ""
    skip: Callable[[Run], str | None] = lambda run: None  # a reason: the stage does not run
    on_skip: Callable[[str], tuple] = lambda reason: ()  # what it gives when skipped
    uses: tuple[str, ...] = ()  # results it reads when an earlier stage gave them


def _one(value) -> tuple:
    return (value,)


# --- the stages ------------------------------------------------------------------------------


def _hotfix_base(run: Run) -> tuple:
    return _one(_open_base(run, run.request.base or ""))


def _open_base(run: Run, name: str) -> HotfixBase:
    """The release ``name`` under --out, held till the run ends, checked against its SHA256SUMS (its archive, when
    the round trip loads it or its frames are lent, read in a thread)."""
    def hold(release: str) -> None:  # until the run ends: a --force run of the base is refused meanwhile
        run.stack.callback(hold_release(run.request.out, release).close)
        if os.path.islink(run.request.out / release):  # --from latest (-> 1.3.1): the release it names, too
            real = Path(os.path.realpath(run.request.out / release))
            try:
                check_tag(real.name)
            except InputError:
                return  # a folder no run can write (not a release's name): nothing to hold it against
            run.stack.callback(hold_release(real.parent, real.name).close)

    base = load_base(run.request.out, name, hold=hold)
    # a whole release on it copies its archive's frames: the archive checked as the round trip's load needs it
    with_archive = run.request.roundtrip or run.request.whole
    if with_archive:  # checked again at the round trip; here, before anything is built
        _check_base_archive(base)
    _check_base_sums(base, with_archive=with_archive)
    if with_archive:  # its bytes read in a thread beside the plan and the build, waited for before it is used
        run.base_check = _BaseArchiveCheck(run, base)
    env_epoch = run.request.env.get("SOURCE_DATE_EPOCH")
    if run.request.base and env_epoch not in (None, str(base.epoch)):
        run.reporter.warn(f"SOURCE_DATE_EPOCH={env_epoch} is ignored: {'this release' if run.request.whole else 'the hotfix'} "
                          f"uses {base.epoch}, the epoch of {base.manifest.release}, so that unchanged layers stay identical")
    return base


def _earlier_release(run: Run) -> tuple:
    """``build`` without ``--from`` (one platform, the one-pass export into the seeded verify engine, the build
    memo): the release made on the newest earlier release under --out of the same product, platform and profiles
    at this run's SOURCE_DATE_EPOCH, as ``--from`` it would be (its frames lent, assembled on its layers, the
    verify engine holding it): the same bytes, since that release's layers of unchanged inputs are the ones this
    build gives. None (the release made alone, as before) when there is none, or the one found does not verify
    (said)."""
    from .hotfix import earlier_releases

    request, plan, target = run.request, run["plan"], run["target"]
    found = earlier_releases(request.out, product=plan.product, platform=plan.platform.name,
                             profiles=plan.profile_names, release=target.release)
    names = [m.release for m in found if m.source_date_epoch == request.epoch]
    if not names:
        run.reporter.info(f"    no release of {', '.join(plan.profile_names)} under --out at SOURCE_DATE_EPOCH="
                          f"{request.epoch}: this release is made alone"
                          + (f" (--from {found[0].release} makes it on release {found[0].release}, with that one's "
                             "SOURCE_DATE_EPOCH, reusing its layers)" if found else ""))
        return (None,)
    name = names[0]
    try:
        base = _open_base(run, name)
    except (OSError, UnibakeError) as exc:  # (a hostile or broken folder: said, and this release made without it)
        run.reporter.warn(f"release {name} under --out is not used to make this release on: {exc}")
        return (None,)
    m = base.manifest  # (as checked against its SHA256SUMS: the epoch decides every layer's bytes)
    if (base.epoch, m.product, m.platform or DEFAULT_PLATFORM) != (request.epoch, plan.product, plan.platform.name):
        run.reporter.warn(f"release {name} under --out is not used to make this release on: its manifest.json "
                          f"changed while it was read (now {m.product}, {m.platform}, SOURCE_DATE_EPOCH={base.epoch})")
        if run.base_check is not None:
            run.base_check.abandon()
            run.base_check = None
        return (None,)
    run.reporter.info(f"    made on release {name}, the newest under --out at SOURCE_DATE_EPOCH={request.epoch} "
                      "(its layers and frames reused; the same bytes; --no-from makes it alone)")
    return _one(base)


def _digest_memo(run: Run, root: Path) -> DigestMemo | None:
    """The record of the inputs' sha256 by their stat (:mod:`unibake.digestmemo`): read unless --no-cache; none
    without this user's key or for a repro build (which writes nothing in the project)."""
    key = buildmemo.secret(run.request.env)
    if key is None or run.request.hold:
        return None
    return DigestMemo(root / BUILD_MEMO / DIGESTS, key, read=not run.request.nocache)


def _save_digests(run: Run, memo: DigestMemo | None) -> None:
    if memo is None:
        return
    if memo.remembered:
        run.reporter.info(f"    {memo.remembered} input file(s), {memo.remembered_bytes} bytes, not read again: unchanged "
                          "since an earlier plan hashed them (by their inode, size and times)")
    try:
        memo.save()
    except (OSError, UnibakeError) as exc:
        run.reporter.info(f"    the inputs' digests were not kept ({exc}): the next plan hashes every input")


def _plan(run: Run) -> tuple:
    request = run.request
    base: HotfixBase | None = run.get("base")
    profiles = list(request.profiles) or (list(base.manifest.profiles) if base else [])
    platform = request.platform or (base.manifest.platform if base else None)
    from .kit import CONTEXT_FILE_LIMIT  # a release's kit carries the context: a file it cannot is refused unread

    config = (request.cwd / request.config).resolve()
    memo = _digest_memo(run, config.parent)
    try:
        with remembering(memo):
            plan = make_plan(config, profiles=profiles or ["all"],
                             version=request.version, cwd=request.cwd, require_lock=request.require_lock,
                             allow=request.allow, identity=request.identity,
                             platform=parse_platforms(platform, "--platform")[0] if platform else None,
                             context_limit=CONTEXT_FILE_LIMIT if run.publishes else None)
    except InputError as exc:
        if request.profiles or base is None or not str(exc).startswith("unknown profile"):
            raise
        # no --profile was given: the names are the base release's, a profile since renamed or removed
        raise InputError(f"{str(exc).replace(' (--profile)', '')}: a hotfix builds the profiles of release "
                         f"{base.manifest.release} ({', '.join(profiles)}) unless --profile names others") from None
    _save_digests(run, memo)
    if request.verify_engine and run.publishes:  # VALIDATION.json and the notes record which engine loaded it: their
        # scan at publish refused an address on a private network, or the builder's name, after every stage had run
        enforce(scan_values([("--verify-engine", "", request.verify_engine)], request.identity),
                plan.sanitise_allow + request.allow,
                "the --verify-engine address (the release's VALIDATION.json and notes record the engine of its round trip)")
    # an unset ${NAME} is said by the build, which reads the base image's ENV; a run that does not build says
    # it here, for every base
    for warning in plan.source_warnings if run.builds else plan.warnings:
        run.reporter.warn(warning)
    if base is not None and plan.product != base.manifest.product:
        raise InputError(f"--from {request.base}: release {base.manifest.release} is of the product "
                         f"{base.manifest.product}, not {plan.product}; a hotfix is made on a release of its own product")
    if base is not None and plan.platform.name != base.manifest.platform:
        raise InputError(f"release {base.manifest.release} is {base.manifest.platform}; a hotfix on it is built for "
                         f"the same platform, not {plan.platform.name}")
    if base is not None and plan.tag == base.manifest.tag:
        raise InputError(f"--version {request.version} gives {plan.tag}, the tag of the base release; "
                         "choose a new version")
    if base is not None and not request.profiles:
        _say_new_profiles(run, plan, base)
    if run.publishes:
        _refuse_out_among_inputs(request, plan)
    _refuse_the_document_over_a_file_read(request, plan)
    return _one(plan)


def _refuse_the_document_over_a_file_read(request: Request, plan: ReleasePlan) -> None:
    """``--metadata-file`` naming a file the plan reads (a YAML, the lock, a baked input, a notes file): the run's
    document would replace it. A JSON attachment (an eval's results) passed the early check, which knows only
    what the lock pins, and the next release published the last run's manifest as those results."""
    document = request.metadata_file
    try:
        here = os.stat(document) if document is not None else None
    except OSError:
        return  # none there yet: no file is lost
    if here is None:
        return
    read = [plan.project_root / rel for rel in plan.config_files] + [f.absolute for f in plan.inputs] + \
        list(plan.notes.sources)
    for path in read:
        try:
            info = os.stat(path)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (here.st_dev, here.st_ino):
            shown, read_as = display_path(document, request.cwd), display_path(path, request.cwd)
            raise DocumentPlaceRefused(f"--metadata-file {shown}: a file this release is made from"
                                       f"{f' ({read_as})' if read_as != shown else ''}, which the run's document "
                                       "would replace; give another path")


def _refuse_out_among_inputs(request: Request, plan: ReleasePlan) -> None:
    """A release folder (and its lock) written into a folder the image bakes whole would be an input of
    the next build: refused by the lock, and baked into the next image (the archive too) once locked."""
    inside = plan.input_folder_holding(resolved(request.out))
    if inside:
        raise InputError(f"--out {display_path(request.out, request.cwd)}: inside {inside}, so its releases "
                         "would be inputs of the next build; give --out a folder outside the folders the image "
                         "bakes (default: release/ beside the profiles folder)")


def _say_new_profiles(run: Run, plan: ReleasePlan, base: HotfixBase) -> None:
    """A hotfix builds its base's profiles: when profiles were added since a base made of every profile,
    those alone are a selection now, and the hotfix's tag carries their names (VERSION-a-b, not VERSION)."""
    suffix = "-" + "-".join(plan.profile_names) + plan.platform.suffix
    new = sorted(set(plan.known_profiles) - set(plan.profile_names))
    if not new or not plan.tag.endswith(suffix) or base.manifest.tag.endswith(suffix):
        return
    named = ", ".join(new)
    run.reporter.warn(f"the profiles now include {named}, which release {base.manifest.release} (made of every "
                      f"profile then: {', '.join(plan.profile_names)}) did not have: this hotfix builds that "
                      f"release's profiles, so it is named {plan.tag}, not "
                      f"{plan.tag.removesuffix(suffix) + plan.platform.suffix}; give --profile all to build "
                      f"{'it' if len(new) == 1 else 'them'} too (or --profile for the ones to build)")


def _render(run: Run) -> tuple:
    return _one(render(run["plan"]))


def _rendered_skip(run: Run) -> str | None:
    if not run.request.write_rendered:
        return "this command keeps no copies"
    if run.request.version is not None:  # the tracked copies follow the YAML, not a --version given here
        return "--version given; copies keep the YAML's"
    return None


def _write_rendered(run: Run) -> tuple:
    folder = write_rendered(run["context"], run["plan"].project_root)
    run.reporter.info(f"    {display_path(folder, run.request.cwd)}")
    return _one(folder)


# the project's memos (.cache/, beside the profiles folder): the build's and normalise's
BUILD_MEMO = Path(".cache", "build-memo")
NORMALISED = Path(".cache", "normalised")


def sanitise_cache(env) -> Path | None:
    """Where the gate remembers each file's findings by its sha256: the user's own cache folder, not
    the project, so a checkout cannot bring memos that say a file holds no secret (None: no cache,
    when the environment names no home)."""
    base = env.get("XDG_CACHE_HOME") or (f"{env['HOME']}/.cache" if env.get("HOME") else "")
    return Path(base) / "unibake" / "sanitise" if base.startswith("/") else None


def _scan_context(run: Run) -> tuple:
    context: BuildContext = run["context"]
    root = run["plan"].project_root
    if run.publishes:  # the folder stage refuses a context no kit can carry: said before a file of 8 GiB is scanned
        from .kit import check_context_sizes  # (minutes: a file without newlines is read whole, in chunks)

        check_context_sizes(context)
    findings = scan_context(context_files(context, root), run.request.identity, cache=sanitise_cache(run.request.env))
    enforce(findings, run.allow, "the build context")
    return _one(Scan(what="the build context and the Dockerfile", allowed=len(findings)))


def _target_of_plan(run: Run) -> tuple:
    plan: ReleasePlan = run["plan"]
    context: BuildContext = run["context"]
    if not run.request.hold:  # refused here, before the engine is reached: nothing is built
        refuse_moving_a_released_tag(run.request.out, plan.tag, force=run.request.force)
    return _one(Target(product=plan.product, release=release_tag(plan.tag), ref=plan.tag, metadata=context.metadata,
                       base_image=plan.base_image))


def _inspect(run: Run) -> tuple:
    request = run.request
    ref = request.image or ""
    by_digest = ref.startswith("sha256:") or "@" in ref
    info = run.engine.inspect_image(ref)
    if info is None:
        raise InputError(f"the engine at {run.engine.address} has no image {ref!r}")
    repo = request.product if by_digest else ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    metadata = ImageMetadata.from_labels(info.labels, ref)
    product = request.product or (metadata.product if metadata else None) or repo.rsplit("/", 1)[-1]
    # said now, as what to give, not by the manifest's schema after the export, the read-back and the SBOM
    if not NAME_RE.fullmatch(product):
        raise InputError(f"the image's repository name gives the product name {product[:100]!r}, which is not one "
                         "(lower-case letters, digits, '.', '_' and '-', at most 64): give --product NAME")
    platform = image_platform(info)
    if platform and not re.fullmatch(PLATFORM_RECORD, platform):
        raise InputError(f"the image {ref} records the platform {platform[:100]!r} (its config's architecture "
                         f"{info.architecture[:40]!r}, os {info.os[:40]!r}): not one a release can record, like "
                         "linux/amd64; fix the image's config")
    release = check_tag(request.tag or release_tag(ref))
    if not request.force:  # said now, not after the image is scanned (the folder stage says it again)
        refuse_existing(request.out / release)
    image = Image(ref=ref, image_id=info.id, diff_ids=info.diff_ids, labels=info.labels, size=info.size,
                  platform=platform, created=info.created, repo_digests=info.repo_digests)
    return Target(product=product, release=release, ref=ref, metadata=metadata, base_image=None), image


def _folder(run: Run) -> tuple:
    target: Target = run["target"]
    context = run.get("context")
    if context is not None:  # a release built from profiles writes a kit: one it cannot carry is said before the build
        from .kit import check_context_sizes

        check_context_sizes(context)
    _refuse_the_document_in_the_release(run.request, run.request.out / target.release,
                                        run.request.checksums / f"{target.release}.{SUMS}")
    if run.request.force:
        refuse_another_release(run.request.out / target.release, target.ref)  # archive and hotfix too
        _refuse_replacing_a_hotfix_base(run.request.out, target.release)
    folder = _entered(run, ReleaseFolder(run.request.out, target.release, force=run.request.force))
    if run.request.force:  # again, under the lock: a hotfix on it published while it was waited for
        _refuse_replacing_a_hotfix_base(run.request.out, target.release)
    if folder.first_release_problem:  # ranked by it for ever: taken only from a folder that checks out
        run.reporter.warn(f"{folder.final}: when the release it replaces was first published is not carried over "
                          f"({folder.first_release_problem}); the new release counts as first published now")
    # the checksums record is written beside --out, at the very end: a folder it cannot be written in is
    # said now, before the build, the export and the gates run for nothing
    record = run.request.checksums
    # checked, not made: a run that fails leaves no empty checksums folder behind (publish makes it)
    problem = unwritable_reason(record, folder=True)
    if problem:
        raise UnibakeError(f"cannot write the checksums record folder {record} ({problem}); it sits beside --out")
    _refuse_another_products_record(record / f"{target.release}.{SUMS}", target, force=run.request.force)
    return _one(folder)


def _refuse_the_document_in_the_release(request: Request, folder: Path, record: Path) -> None:
    """``--metadata-file`` inside the release folder this run publishes, or its checksums record: found at the end,
    after the work (the folder itself: exit 1, the run's document lost; a file in it: one the release does not
    list; its manifest or its record: replaced). Said now, before the build."""
    document = request.metadata_file
    if document is None:
        return
    if document == folder or folder in document.parents or document == record:
        where = "the checksums record" if document == record else "inside the release folder"
        raise DocumentPlaceRefused(f"--metadata-file {display_path(document, request.cwd)}: it is {where} this run "
                                   f"publishes ({display_path(record if document == record else folder, request.cwd)});"
                                   " give a path outside it")


def _refuse_another_products_record(record: Path, target: Target, *, force: bool,
                                    ending: str = "nothing was built") -> None:
    """checksums/<tag>.SHA256SUMS is named by the tag alone, and every --out of one parent shares it:
    another product's release of the same version under a sibling --out (release/a, release/b, as
    each product needs its own --out) would replace that product's record without a word. Refused
    unless --force; the same product's release of the tag made again elsewhere replaces it as before."""
    if os.path.isdir(record) and not os.path.islink(record):  # publish could not rename the record over it
        raise InputError(f"{record} is a folder where this release's checksums record goes (a file): no run makes "
                         f"one; remove it, then run again; {ending}")
    try:  # a FIFO planted as the record is not waited on: not a record (publish renames over it)
        held = read_small_file(record, UnibakeError, limit=16 << 20).decode("utf-8", "replace")
    except UnibakeError:
        return
    names = [line.split("  ", 1)[1] for line in held.splitlines() if "  " in line]
    ours = target.archive_name
    if force or not names or any(n == ours or n.startswith(f"{ours}.part-") for n in names):
        return
    archive = next((n for n in names if n.endswith(".tar.zst") and not n.endswith("-kit.tar.zst")), names[0])
    raise InputError(f"{record} is the record of another product's release {target.release} (its archive "
                     f"{archive!r}, not {ours!r}): every --out beside {record.parent.parent} shares "
                     f"{record.parent}; give each product its own parent folder (e.g. --out "
                     f"releases/{target.product}/release), or --force to replace that record; {ending}")


def _refuse_replacing_a_hotfix_base(out: Path, release: str) -> None:
    """--force makes a release again under its name; a hotfix made on the one it replaces needs that
    very image (apply.sh, verify --load): the new one would leave it with a base nobody can load."""
    found = {r.folder.name: r.manifest for r in find_releases(out) if r.manifest is not None}
    replaced = found.get(release)
    if replaced is None:
        return
    needing = sorted(m.release for m in found.values()
                     if m.hotfix is not None and m.hotfix.base_image_id == replaced.image_id)
    if needing:
        raise InputError(f"release {release} is the base of the hotfix {', '.join(needing)} under {out}: --force "
                         f"would replace its image {replaced.image_id[:19]}, which the hotfix needs to be applied; "
                         "choose another version, or remove the hotfix first")


def _temp_folder(run: Run) -> tuple:
    with held_signals():  # made and handed to the clean-up as one step: an interrupt between left the folder
        folder = TempFolder()
        run.stack.callback(folder.remove)
    return _one(folder)


def _hold_the_tag_on_the_engine(run: Run, tag: str) -> None:
    """The release's tag is the engine's, not one --out's: two runs of one tag under two --out (each holding its
    own release folder's lock) moved it under each other, and both failed their checks with images left
    dangling. A lock of this user's (``tags/`` in :func:`buildmemo.user_folder`, by engine and tag) is held from
    the build to the run's end; a second run is refused, exit 1. No such folder: not held (said by nothing)."""
    import fcntl
    import hashlib

    folder = buildmemo.user_folder(run.request.env)
    if folder is None:
        return
    name = hashlib.sha256(f"{run.engine.address}\0{tag}".encode()).hexdigest()[:32]
    try:
        (folder / "tags").mkdir(mode=0o700, exist_ok=True)
        fd = os.open(folder / "tags" / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    run.stack.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        raise UnibakeError(f"another run is building {tag} on the engine at {run.engine.address}"
                           f"{f' (pid {holder})' if holder.isdigit() else ''}, into another --out: the tag is the "
                           "engine's; wait for it, then run again") from None
    except OSError:  # (a home on a file system that takes no locks: held as a lock file that cannot be opened is)
        return
    try:  # the holder's pid, for the message of a run it refuses; on a full disk left out (the lock is held)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


def _release_tag_on_failure(run: Run, plan: ReleasePlan, replaced: str | None, built: list[BuiltImage]):
    """The build tags the release's tag at once. When the run ends well, or once its release folder
    is published, the image the tag named before (``replaced``) is let go (unless something else needs
    it). When it fails before that (a check, the smoke gates, an interrupt), the tag must not name an
    image that was never released: what it names is kept as build cache (``...-failed``, its selection's)
    and the tag goes back to the image it named before, or away. Pushed before the build, so that an
    interrupt as the build ends (the engine's tag set, ``built`` not yet given) is put back too."""
    def on_exit(exc_type, exc, tb) -> bool:
        folder: ReleaseFolder | None = run.get("folder")
        try:
            now = run.engine.inspect_image(plan.tag)
            if exc_type is None or (folder is not None and folder.committed):
                if built and replaced and replaced != built[0].image_id and (now is None or now.id != replaced):
                    run.engine.remove_if_unused(replaced)
                return False
            if now is not None and now.id != replaced:
                # (the selection names the platform already, all-arm64: as the builder's failed build is kept, one
                # name for one role, not all-arm64-failed-arm64 beside all-arm64-failed)
                keep_as_cache(run.engine, cache_ref(plan.product, run["context"].selection, "failed"), now.id)
                if replaced and run.engine.inspect_image(replaced) is not None:
                    run.engine.tag(replaced, plan.tag)
                else:
                    run.engine.remove_image(plan.tag)
        except UnibakeError as err:  # the run's own error is the one to report
            if built:  # (a build that failed, or was cut short, before it ended most likely tagged nothing)
                run.reporter.warn(f"{plan.tag} may still name the image of this failed run: {err}")
        return False
    return on_exit


def _repro_tag_on_failure(run: Run, ref: str):
    """A repro build's tag (``unibake-repro/...``) is removed when its run fails or is interrupted
    after the build: :func:`reproduce` removes only the tags of runs that ended well."""
    def on_exit(exc_type, exc, tb) -> bool:
        if exc_type is not None:
            try:
                run.engine.remove_image(ref)
            except UnibakeError as err:  # the run's own error is the one to report
                run.reporter.warn(f"{ref} is left in the engine: {err}")
        return False
    return on_exit


def _hold_a_released_tag(run: Run, tag: str) -> None:
    """``--stage build --force`` of a released version moves its tag with no release folder written
    (which holds the release's lock): the lock is held here instead, till the run ends, so that it is
    refused while a hotfix made on that release (or a run writing it) needs its image. A version with
    no release yet is held too when its lock file exists: a full build writing it right now (its
    manifest not written yet) has its tag moved under it otherwise. A release folder that is a link
    (``1.0 -> /mnt/big/1.0``) is held under both names: a run with that --out holds the target's."""
    for where, release in release_locks(run.request.out, release_tag(tag)):
        released = os.path.lexists(where / release / MANIFEST)
        try:
            lock = lock_release(where, release, create=released)
        except NoLocks:
            raise
        except UnibakeError as exc:
            raise UnibakeError(f"{exc}: a hotfix made on it, or a run writing it, needs its image as it is; the "
                               f"build would move {tag}; wait for it (nothing was built)") from None
        if lock is not None:
            run.stack.callback(lock.close)
        if released:  # (as a whole --force is refused: the base image of a hotfix would be let go at the end)
            _refuse_replacing_a_hotfix_base(where, release)


def _build(run: Run) -> tuple:
    from .targets import check_base

    plan: ReleasePlan = run["plan"]
    if not run.request.hold and run.get("folder") is None:
        _hold_a_released_tag(run, plan.tag)
    check_base(run.engine, plan)
    info = run.engine.inspect_image(plan.base_image)  # None: FROM scratch, which sets nothing
    for warning in plan.unset_warnings({e.split("=", 1)[0] for e in info.env} if info else set(),
                                       plan.base_image if info else ""):
        run.reporter.warn(warning)
    ref = repro_ref(plan.product, run.request.hold) if run.request.hold else plan.tag
    # repro proves a build from its inputs: never from the memo
    memo = None if run.request.hold else plan.project_root / BUILD_MEMO
    # each memo signed with a key of the user's own: a memo file a checkout brought is not taken
    memo_key = buildmemo.secret(run.request.env) if memo is not None else None
    # the tag's clean-up pushed before the build: an interrupt as the build ends (the engine's tag set, the
    # build's last look at it under way) put the tag on an image never released, for good
    given: list[BuiltImage] = []
    if not run.request.hold:
        _hold_the_tag_on_the_engine(run, plan.tag)
        before = run.engine.inspect_image(plan.tag)
        run.stack.push(_release_tag_on_failure(run, plan, before.id if before is not None else None, given))
    else:  # repro holds its build only once the run is whole: a failed or interrupted one lets go of it here
        run.stack.push(_repro_tag_on_failure(run, ref))
    built = _assembled(run, plan, memo, memo_key)
    if built is None:
        built = build_image(run["context"], run.engine, product=plan.product, revision=run.request.revision,
                            epoch=run.epoch, nocache=run.request.nocache, on_line=run.reporter.build_line, ref=ref,
                            platform=plan.platform.name, memo=memo if memo_key else None, memo_key=memo_key)
    given.append(built)
    if built.replaced and built.replaced != built.image_id:
        # no release folder of this tag under --out (that is refused before the build), but the engine's
        # tag named another image: released under another --out, perhaps; said, not silently let go
        run.reporter.warn(f"{ref} named {built.replaced[:19]} before this build; it names the new image now, "
                          f"and {built.replaced[:19]} is removed when the run ends well, unless another tag names it "
                          f"(to keep it: docker tag {built.replaced[:19]} NAME, before the run ends)")
    memoised = f" ({built.memoised} of them from the build memo: their context was not sent)" if built.memoised else ""
    run.reporter.info(f"    {built.cached_steps} of {len(built.cacheable_steps)} steps from the build cache{memoised}")
    return _one(built)


def _assembled(run: Run, plan: ReleasePlan, memo: Path | None, memo_key: bytes | None) -> BuiltImage | None:
    """A hotfix's small build, when it can be assembled (:mod:`unibake.assemble`); None, the reason said, when
    the whole image is to be built."""
    from .assemble import try_assemble
    from .builder import _release

    base: HotfixBase | None = run.get("base")
    request = run.request
    if base is None:
        return None
    if not request.assemble or request.sequential or request.nocache:
        reason = "--full-build" if not request.assemble else "--sequential" if request.sequential else "--no-cache"
    elif memo is None or memo_key is None:
        reason = "no build memo key for this user"
    elif request.whole and isinstance(lends := _lender(base, request), str):
        reason = lends
    else:
        if request.whole:
            lends.close()  # (opened again by the export, which copies the frames)
        held: list[str] = []  # the small image's tag of this run's own, removed as the run ends
        run.stack.callback(_release, run.engine, held)
        found = try_assemble(run["context"], run.engine, product=plan.product, tag=plan.tag, base=base, memo=memo,
                             memo_key=memo_key, epoch=run.epoch, revision=request.revision,
                             platform=plan.platform.name, owned=INSTALL_ROOT, on_line=run.reporter.build_line,
                             tags=held, use_store=not request.engine_save)
        if not isinstance(found, str):
            run.reporter.info(f"    assembled: the steps below the build memo's marker built alone "
                              f"({found.seconds:.1f} s), the rest is release {base.manifest.release}'s")
            return found
        reason = found
    run.reporter.info(f"    the whole image is built and exported (not assembled): {reason}")
    return None


def _lender(base: HotfixBase, request: Request):
    """The base release's archive, open to lend its frames to a whole release on it (``build --from``); a reason
    (a string) when it cannot: the release is then built and exported whole."""
    from .archive import open_lender

    files = base.manifest.archive.files
    what = f"release {base.manifest.release}'s archive"
    if len(files) != 1:
        return f"{what} is in {len(files)} parts, and frames are copied from an archive of one file"
    found = open_lender(base.folder / files[0].name, files[0].bytes, level=request.level,
                        long_distance=request.long_distance, what=what)
    return f"{what} cannot lend its frames: {found}" if isinstance(found, str) else found


def _delta_base(run: Run) -> HotfixBase | None:
    """A hotfix's base release, whose layers its archive leaves out (a whole release on a base: None)."""
    return None if run.request.whole else run.get("base")


def _remember_lower(run: Run, plan: ReleasePlan, built: BuiltImage, diff_ids: tuple[str, ...]) -> None:
    """After the whole image built FROM the build memo's image was normalised: which diffIDs that image's
    layers got with this epoch (what a later hotfix's assembly checks its base release against). A record that
    cannot be written (a full disk, a read-only .cache) costs that hotfix its assembly, nothing else."""
    if built.memo_lower is None or built.assembled is not None or run.request.hold:
        return
    key = buildmemo.secret(run.request.env)
    lower = run.engine.inspect_image(built.memo_lower)
    if key is None or lower is None or len(lower.diff_ids) > len(diff_ids):
        return
    try:
        buildmemo.remember_lower(plan.project_root / BUILD_MEMO, run["context"].selection, plan.platform.name,
                                 built.memo_lower, run.epoch, tuple(diff_ids[:len(lower.diff_ids)]), key)
    except (OSError, UnibakeError) as exc:
        run.reporter.info(f"    the build memo's layer record was not kept ({exc}): a hotfix on this release is built "
                          "whole")


def _remember_contents(run: Run, plan: ReleasePlan, inspector: LayerInspector, archive: Archive) -> None:
    """What each layer the pass read holds (the SBOM's reader's record), and the image's config, kept for a
    later assembled hotfix on this release (:func:`unibake.assemble.held_bottom`). A record that cannot be
    written costs that hotfix a read of the archive, nothing else."""
    from .assemble import remember_config, remember_layers

    key = buildmemo.secret(run.request.env)
    if key is None or run.request.hold:
        return
    image = archive.image
    folder = plan.project_root / BUILD_MEMO
    try:
        remember_layers(folder, key, [(d, m.size, found) for m, d in zip(image.layer_members, image.diff_ids)
                                      for found in [inspector.found(m.name)] if found is not None])
        remember_config(folder, image.config_bytes)
    except (OSError, UnibakeError) as exc:
        run.reporter.info(f"    the layers' records were not kept ({exc}): a hotfix on this release reads its archive")


def _known_frames(run: Run, plan: ReleasePlan) -> dict:
    """The frames earlier read backs decoded (:mod:`unibake.framememo`), for a release made ``--from`` another,
    whose archive copies that one's frames; none with --no-cache or without this user's key."""
    from .framememo import FOLDER, known_frames

    key = buildmemo.secret(run.request.env)
    if key is None or run.request.nocache:
        return {}
    return known_frames(plan.project_root / BUILD_MEMO / FOLDER, key)


def _remember_frames(run: Run, plan: ReleasePlan, back: ReadBack) -> None:
    """What the read back found of the big layers' frames, kept for a release made ``--from`` this one. A record
    that cannot be written costs that release the hashing of the layers it copies, nothing else."""
    from .framememo import FOLDER, remember_frames

    key = buildmemo.secret(run.request.env)
    if key is None or run.request.hold or not back.frames:
        return
    try:
        remember_frames(plan.project_root / BUILD_MEMO / FOLDER, key, back.frames)
    except (OSError, UnibakeError) as exc:
        run.reporter.info(f"    the frames' record was not kept ({exc}): a release made --from this one hashes every layer")


def _normalise(run: Run) -> tuple:
    from .normalise import normalise_image

    plan: ReleasePlan = run["plan"]
    built: BuiltImage = run["built"]
    context: BuildContext = run["context"]
    with run.reporter.progress("normalise", built.size or None) as advance:
        image = normalise_image(run.engine, built, epoch=run.epoch, base_image=plan.base_image, owned=INSTALL_ROOT,
                                cache=plan.project_root / NORMALISED, reuse=not run.request.nocache,
                                progress=advance, platform=plan.platform)
    if image.image_id != built.image_id:  # the image the engine built is build cache now, not dangling
        keep_as_cache(run.engine, cache_ref(plan.product, context.selection, "build"), built.image_id)
    _remember_lower(run, plan, built, image.diff_ids)
    return _one(image)


def _fresh_engine(run: Run, seed: str | None = None,
                  keep: str | None = None) -> tuple[Engine, int | None, str, str | None, Path | None]:
    """The engine that never saw the image: the one --verify-engine names, a scratch dockerd, or
    (``seed``, the base image's ID) a scratch dockerd kept between runs that holds only the base
    image (and ``keep``, a hotfix's base release, when an earlier run kept it there: ``run.seed.kept``), or
    nothing yet (it keeps the base image from this run's round trip: :class:`SeededEngine`'s ``defer``).
    Its network namespace's PID, where it is, the image it held (None: nothing) and its data folder
    (a scratch engine's) come with it."""
    if run.request.verify_engine:
        return run.connect(run.request.verify_engine), None, run.request.verify_engine, None, None
    if seed is not None:
        try:
            seeded = _entered(run, SeededEngine(run.request.scratch_dir, source=run.engine, base_id=seed,
                                                on_line=run.reporter.info, progress=run.reporter.progress, keep=keep,
                                                defer=True))
        except RoundTripUnavailable as exc:  # in use by another run, or its folder refused: an empty engine
            run.reporter.info(f"    {exc}: an empty scratch engine instead")
        else:
            run.after("smoke gates", seeded.stop_in_background)
            run.seed = seeded
            if seeded.deferred is not None:  # empty: seeded from this round trip as it stops
                return seeded.engine, seeded.pid, f"the empty verify engine {seeded.folder}", None, seeded.folder
            holds = f"only the base image and the release {seeded.kept[:19]}" if seeded.kept else "only the base image"
            return (seeded.engine, seeded.pid, f"the verify engine {seeded.folder}, holding {holds}", seed,
                    seeded.folder)
    scratch = _entered(run, ScratchEngine(run.request.scratch_dir, on_line=run.reporter.info))
    run.after("smoke gates", scratch.stop_in_background)
    return scratch.engine, scratch.pid, f"scratch dockerd {scratch.folder}", None, scratch.folder


def _entered(run: Run, held):
    """``held`` entered (a scratch engine started, a release folder locked and staged), its exit handed to the run's
    clean-up first: with ``enter_context`` an interrupt as the enter returned, before the exit was recorded, left a
    dockerd running and its folder, or a staging folder. (Each exit does nothing after an enter that failed, which
    lets go of what it took, nor when it has run already.)"""
    run.stack.push(held.__exit__)
    return held.__enter__()


@contextmanager
def _scratch_room(engine: Engine | None, folder: Path | None, size: int | None):
    """A scratch engine that runs out of room while it unpacks the image: said as the full folder
    (the --scratch-dir), not as an engine refusal naming its socket. (The local engine's own refusal,
    which names its own address, is left as it is.)"""
    try:
        yield
    except EngineError as exc:
        if folder is None or engine is None or "no space left on device" not in str(exc) \
                or f"(engine at {engine.address})" not in str(exc):
            raise
        try:
            free = f"{shutil.disk_usage(folder).free} bytes free"
        except OSError:
            free = "its free space unknown"
        raise DiskFull(f"no space left in {folder.parent} (the round trip's scratch engine, {free}) while it "
                       f"unpacked the image ({size or 'an unknown number of'} bytes; a load needs about twice that): "
                       "free space or give --scratch-dir a folder on a bigger disk") from None


def _seed_of(run: Run, base_image: str) -> str | None:
    """The base image's ID when the round trip may use a seeded verify engine (not with
    --verify-engine or --no-seed)."""
    if not run.request.seed or run.request.verify_engine:
        return None
    info = run.engine.inspect_image(base_image)
    return info.id if info is not None else None


def _check_base_archive(base: HotfixBase) -> None:
    """A hotfix's round trip loads its base release first: its archive must still be there."""
    missing = base.missing_files()
    if missing:
        raise InputError(f"the round trip of a hotfix loads release {base.manifest.release} first, but "
                         f"{base.folder / missing[0]} is missing; restore it or use --no-roundtrip")


def _check_base_sums(base: HotfixBase, *, with_archive: bool) -> None:
    """The base release as ``sha256sum -c SHA256SUMS`` sees it, before anything is built: the manifest (whose
    diffIDs decide what the hotfix leaves out), and with ``with_archive`` (the round trip will load it, or a
    release made on it copies its frames) the archive listed, under the sha256 its manifest records (its bytes
    are read beside the build: :class:`_BaseArchiveCheck`). A folder that does not verify is exit 3, naming it,
    not an engine's refusal later or, with --no-roundtrip, a hotfix published on layers no base has."""
    from .verify import read_sums

    sums = read_sums(base.folder)
    unlisted = [n for n in (MANIFEST, *(base.archive_files if with_archive else ())) if n not in sums]
    if unlisted:
        raise VerificationError(f"the base release {base.folder}: {unlisted[0]} is not listed in its SHA256SUMS; "
                                f"check it with: python build.py verify {base.folder}")
    _check_base_files(base, {MANIFEST: sums[MANIFEST]})
    # SHA256SUMS rewritten over another archive: its own sums pass, the manifest's record does not
    other = [f.name for f in base.manifest.archive.files if with_archive and sums[f.name].lower() != f.sha256]
    if other:
        raise VerificationError(f"the base release {base.folder}: {other[0]} is not the archive its manifest.json "
                                f"records (their sha256 differ); a hotfix is made on a release that verifies "
                                f"(python build.py verify {base.folder})")
    # and every other file it lists, as `sha256sum -c` reads them (found by probing: a changed run.sh, SBOM or
    # kit, or a deleted provenance, passed); the archive and the kit, the big ones, are read beside the build
    # when the archive is needed (:class:`_BaseArchiveCheck`), each under the sha256 its manifest records
    kit = _base_kit(base) if with_archive else None
    if kit is not None and sums.get(kit.name, "").lower() != kit.sha256:
        raise VerificationError(f"the base release {base.folder}: {kit.name} is not the kit its manifest.json records "
                                f"(SHA256SUMS lists {'another sha256' if kit.name in sums else 'none'}); a hotfix is "
                                f"made on a release that verifies (python build.py verify {base.folder})")
    # (without a round trip and not lending its frames, the archive is not read at all)
    beside = {MANIFEST, *base.archive_files, *((kit.name,) if kit else ())}
    _check_base_files(base, {n: sha for n, sha in sums.items() if n not in beside})


def _base_kit(base: HotfixBase):
    """The base release's reconstruct kit as its manifest records it (a SupplyFile), if it has one."""
    chain = base.manifest.supply_chain
    return chain.kit if chain is not None else None


def _check_base_files(base: HotfixBase, expected: Mapping[str, str], *,
                      advance: Callable[[int], object] = lambda n: None) -> None:
    """The base release's files ``expected`` (name -> sha256) read and found so; exit 3 naming the first that is not."""
    from .verify import check_sums

    bad = [c for c in check_sums(base.folder, expected, advance=advance) if not c.passed]
    if bad:
        raise VerificationError(f"the base release {base.folder}: {bad[0].target} {bad[0].detail}; a hotfix is "
                                f"made on a release that verifies (python build.py verify {base.folder})")


class _BaseArchiveCheck:
    """The base release's archive (and its kit) read against its SHA256SUMS in a thread, beside the plan and the build (a
    whole release's archive: minutes for a big one, where an assembled build takes seconds); :meth:`result`
    waits for it before the archive is used (the export, the archive and round trip stages, publish) and raises
    what it found. The run's clean-up stops it at its next block. Its counter is
    ``check RELEASE (the base)``."""

    def __init__(self, run: Run, base: HotfixBase):
        self._stop = threading.Event()
        kit = _base_kit(base)
        total = sum(f.bytes for f in base.manifest.archive.files) + (kit.bytes if kit else 0)
        shown = run.reporter.counter(f"check {base.manifest.release} (the base)", total)

        def advance(n: int) -> None:
            if self._stop.is_set():
                raise HandoffAborted()
            shown(n)

        # against the sha256 the manifest records, which SHA256SUMS was found to list before the build (not read again)
        expected = {f.name: f.sha256 for f in base.manifest.archive.files} | ({kit.name: kit.sha256} if kit else {})
        self._task = Background(partial(_check_base_files, base, expected, advance=advance), name="base-check")
        self._waiting = partial(run.reporter.info, "    waiting for the base release's archive to be checked "
                                                   "against its SHA256SUMS")
        run.stack.callback(self.abandon)

    def result(self) -> None:
        """Its verdict: waited for (and said so) when the check is still reading."""
        if not self._task.done():
            self._waiting()
        self._task.result()

    def abandon(self) -> None:
        self._stop.set()
        self._task.wait()


def _base_checked(run: Run) -> None:
    """The base release's archive, read beside the build, found as its SHA256SUMS lists it (or the error)."""
    if run.base_check is not None:
        try:
            run.base_check.result()
        except VerificationError as exc:
            if not run.request.earlier:
                raise
            raise VerificationError(f"{exc}; this release was being made on it, the newest release under --out at "
                                    "its SOURCE_DATE_EPOCH (--no-from makes a release without it)") from None


def _forget_after(run: Run, engine: Engine, image_id: str) -> None:
    """What the round trip is about to load into a --verify-engine (a hotfix's base release, the
    hotfix) is removed again when the run ends, well or not: said before the load, so that a load or
    check that fails leaves nothing behind; unless that engine held it before (a scratch engine goes
    away whole anyway)."""
    if not run.request.verify_engine or engine.inspect_image(image_id) is not None:
        return

    def forget() -> None:
        try:
            engine.remove_image(image_id)
        except UnibakeError as exc:  # the run's own error, if it failed, is the one to report
            run.reporter.warn(f"{image_id[:19]} may still be in the verify engine at {engine.address}: {exc}")
    run.stack.callback(forget)


def _forget_the_export_load(run: Run, engine: Engine, tag: str) -> frozenset[str]:
    """What the one-pass export loads into a --verify-engine (its image, under ``tag``) is removed again when the
    run ends, well or not: said before the export, as its image ID is known only once the stream has passed (said
    after it, an error or an interrupt once the load was done left the image there, under the release's tag); not
    an image the tag named before, nor one the engine held before under other names (only ``tag`` is taken off
    it). The IDs of the images the engine held before, for :func:`_check_not_held_before`."""
    before = engine.inspect_image(tag)
    held = frozenset(i.id for i in engine.list_images())

    def forget() -> None:
        try:
            now = engine.inspect_image(tag)
            if now is None or (before is not None and now.id == before.id):
                return
            if now.id in held:
                engine.untag(tag)
            else:
                engine.remove_image(now.id)
        except UnibakeError as exc:  # the run's own error, if it failed, is the one to report
            run.reporter.warn(f"{tag} may still be in the verify engine at {engine.address}: {exc}")
    run.stack.callback(forget)
    return held


def _check_not_held_before(engine: Engine, image_id: str, held: frozenset[str]) -> None:
    """A --verify-engine that held the release's image before the one-pass export's load (an earlier run's, under
    another name, or the build engine itself) proves nothing by holding it after: refused, as the round trip of the
    sequential path refuses it (its image ID is known before its load there, only after the pass here)."""
    if image_id in held:
        raise VerificationError(f"the verify engine at {engine.address} already held {image_id} before the load: "
                                "a load there proves nothing; remove the image from it or use the scratch engine")


def _fresh_done(run: Run, fresh: Engine, base_id: str, image_id: str) -> None:
    """A whole release on an earlier one: its round trip is checked before its archive is read back, so the
    seeded verify engine keeps the new release and the one it was made on (for a release made on either
    next) and, when no smoke gate will run there, is stopped while the read back goes on."""
    if run.seed is not None and fresh is run.seed.engine:
        run.seed.keep_after(image_id, base_id)
    if not run.request.smoke:
        run.stage_done("smoke gates")


def _base_release_stream(run: Run, base: HotfixBase, held: str | None) -> Iterator[bytes]:
    """A hotfix's base release as its fresh engine loads it: the whole archive, or, when that engine
    is seeded with the base image and the release's layers start with the base image's, without the
    base image's layer files (the engine holds them: the same chain IDs)."""
    stream = read_archive(base.folder, base.archive_files)
    info = run.engine.inspect_image(held) if held else None
    if info is None or tuple(base.manifest.diff_ids[:len(info.diff_ids)]) != tuple(info.diff_ids):
        return stream
    return without_members(stream, frozenset(blob_name(d) for d in info.diff_ids))


def _export(run: Run) -> tuple:
    from .export import Exported, SaveSource, export_once
    if run.request.earlier and run.base_check is not None and run["built"].assembled is None:
        # built whole after all (the reason said): the earlier release lends nothing and is not loaded, so its
        # archive is neither waited for nor read further (a release made alone; the kit checks each frame it copied)
        run.base_check.abandon()
        run.base_check = None
        run.reporter.info(f"    release {run['base'].manifest.release} is not used after all: this release is made alone")
        run.results["base"] = None  # (so the provenance records no made_on: its image and archive were made alone)
    _base_checked(run)

    plan: ReleasePlan = run["plan"]
    built: BuiltImage = run["built"]
    target: Target = run["target"]
    base: HotfixBase | None = run.get("base")
    request = run.request
    # a whole release on a base (build --from): assembled, it is exported as a hotfix is, its archive completed
    # with the base release's frames; built whole, it is exported as any release (only the base's epoch kept)
    whole = base is not None and request.whole
    if whole and built.assembled is None:
        base = whole = None
    fresh = netns_pid = held = room = None
    kept = False  # a hotfix's base release already in the seeded verify engine (an earlier run kept it)
    if request.roundtrip:
        if base is not None:
            _check_base_archive(base)
        fresh, netns_pid, where, held, room = _fresh_engine(run, _seed_of(run, plan.base_image),
                                                            keep=base.manifest.image_id if base else None)
        kept = base is not None and run.seed is not None and run.seed.kept == base.manifest.image_id
        run.reporter.info(f"    loading into {where}" + (
            " (what this release adds, as the save stream is read; an earlier run kept the release it is made on "
            "there)" if whole and kept else
            " (the release it is made on first, then what this release adds, as the save stream is read)" if whole else
            " (the hotfix after the pass; an earlier run kept its base release there)" if kept else
            " (the previous release during the pass, the hotfix after)" if base else " as the save stream is read"))
    name = target.archive_name
    # A hotfix's fresh engine takes in its base release while the pass runs (read through the save, the
    # engine's export spends most of its time writing its temporary folder, with a core to spare).
    before = loading = checks = small = lender = None
    vouched = {}
    verify_held = None  # the images a --verify-engine held before the one-pass export's load
    if request.verify_engine and fresh is not None and (base is None or whole):
        verify_held = _forget_the_export_load(run, fresh, built.tag)
    try:
        if base is not None and fresh is not None and not kept:
            _forget_after(run, fresh, base.manifest.image_id)
            before = fresh.list_images()  # what a base that loads as another image brought is taken out again
            stream = _base_release_stream(run, base, held)
            with held_signals():  # started and recorded as one step: an interrupt lands once the finally waits for it
                loading = Background(partial(fresh.load, stream), name="base-release-load")
            if whole:  # the pass's load names the base release's layers without their files: they must be there
                with _scratch_room(fresh, room, built.size):
                    loaded = loading.result()
                check_base_loaded(fresh, base.folder, base.manifest.image_id, before=before, loaded=loaded,
                                  base_tag=base.manifest.tag)
                loading = None
        if whole:
            lender = _lender(base, request)
            if isinstance(lender, str):  # (it could lend before the build: the archive changed since)
                raise VerificationError(f"{lender}; it could before the build")
            run.stack.callback(lender.close)
            vouched = _known_frames(run, plan)
        source = None
        inspector = LayerInspector(INSTALL_ROOT)
        if built.assembled is not None:
            from .assemble import assembled_source, check_early, held_bottom, save_small

            # the bottom layers as earlier passes recorded them, when this user's records hold them all: not
            # read again (their diffIDs are the base release's, checked against its SHA256SUMS); else read
            recorded = held_bottom(plan.project_root / BUILD_MEMO, buildmemo.secret(request.env), built.assembled, base)
            small = save_small(run.engine, built.assembled, run["folder"].staging,  # read by the export and the checks
                               on_fallback=run.reporter.warn)
            source = assembled_source(built.assembled, base, small, built.tag, held=recorded)
            if recorded is not None:
                for layer, _, _, _, found in recorded.layers:
                    inspector.preload(layer, found)
                run.reporter.info(f"    the {len(recorded.layers)} bottom layers of release {base.manifest.release} as "
                                  "its pass recorded them (not read again)")
            with held_signals():  # beside the export; started and recorded as one step: a failure waits for it
                checks = Background(partial(check_early, run.engine, built.assembled, base,
                                            small.linked(".assembled-checks.tar.tmp")), name="in-image-checks")
                # however the run ends after this function (an interrupt while the checks are waited for, an error
                # after the export): their container and image are removed by their own run before the run's
                # clean-up goes on, not left as the interpreter exits (a daemon thread is not waited for)
                run.stack.callback(checks.wait)

        def export(source: SaveSource, fresh_inspector: bool) -> Exported:
            nonlocal inspector  # the one that read the pass that made the release, for _remember_contents
            if fresh_inspector:  # (a second pass: the first one's reader saw bytes that were not the image's)
                inspector = LayerInspector(INSTALL_ROOT)
            with run.reporter.progress("export", built.size or None) as advance, \
                    _scratch_room(fresh, room, built.size):
                return export_once(run.engine, built, staging=run["folder"].staging, name=name, epoch=run.epoch,
                                   owned=INSTALL_ROOT, base_image=plan.base_image, fresh=fresh, level=request.level,
                                   long_distance=request.long_distance, split=request.split,
                                   omit_base=base.manifest.diff_ids if base else None, progress=advance,
                                   platform=plan.platform, inspector=inspector,
                                   fresh_holds=held, base_release=base.manifest.image_id if base else None,
                                   source=source, lender=lender, vouched=vouched,
                                   fresh_done=partial(_fresh_done, run, fresh, base.manifest.image_id) if whole
                                   else lambda image_id: None)

        try:
            if source is not None:  # (an assembled hotfix's stream)
                done = export(source, False)
            else:  # the engine's storage where it can be read (unibake.layerstore), else its save
                passes = [False, True]  # a second pass reads with a reader of its own
                done = archive_image(run.engine, built.tag, image_id=built.image_id,
                                     write=lambda chunks: export(SaveSource(stream=chunks), passes.pop(0)),
                                     use_store=not request.engine_save, on_source=_said(run, built.tag),
                                     on_fallback=run.reporter.warn)
        except DiskFull as exc:
            raise _disk_full(exc, run["folder"].staging, request.out, built.size) from None
        if loading is not None:
            with _scratch_room(fresh, room, built.size):
                loaded = loading.result()  # its error, if the base release did not load
            check_base_loaded(fresh, base.folder, base.manifest.image_id, before=before, loaded=loaded,
                              base_tag=base.manifest.tag)
    except BaseException:
        if checks is not None:  # its container removed by its own run before the run's clean-up goes on
            checks.wait()
        if small is not None:  # (each reader removes its name of the spool as it ends; one never started, here)
            for spool in (small.path, small.path.with_name(".assembled-checks.tar.tmp")):
                spool.unlink(missing_ok=True)
        raise
    finally:
        if loading is not None and request.verify_engine:  # on a failure the load may still run: stopping the
            # scratch engine ends it, a --verify-engine's is waited for, so that what it loaded is there to be
            # removed (a daemon thread: a third interrupt, cutting this wait short, leaves an exit that waits for none)
            loading.wait()
    image, archive = done.image, done.archive
    if verify_held is not None and done.round_trip is not None:
        _check_not_held_before(fresh, done.round_trip.image_id, verify_held)
    context: BuildContext = run["context"]
    _remember_contents(run, plan, inspector, archive)
    _remember_frames(run, plan, done.back)
    if built.assembled is None:  # (an assembled hotfix's small image keeps its own name: the whole build's stays)
        keep_as_cache(run.engine, cache_ref(plan.product, context.selection, "build"), built.image_id)
        _remember_lower(run, plan, built, image.diff_ids)
    shipped = f"{len(archive.shipped)} of {len(archive.image.diff_ids)} layers shipped, " if base and not whole else ""
    if whole:
        lent = len(omitted_layers(base.manifest.diff_ids, image.diff_ids))
        shipped = (f"all {len(archive.image.diff_ids)} layers shipped, {lent} of them as release "
                   f"{base.manifest.release}'s archive compressed them (its frames copied, not compressed again), ")
    vouched_layers = len(done.back.vouched)
    recomputed = f"{len(archive.image.diff_ids) - vouched_layers} diffIDs and the config recomputed from the archive read back"
    passed_over = len(done.back.passed_over)
    if vouched_layers:
        recomputed += (f", {vouched_layers} taken from this user's record of an earlier read back that decoded the same "
                       "frames (each copied frame's sha256 matched; " + (
                           f"{passed_over} of them not decoded again: the archive's bytes up to their ends are the ones "
                           "that read back read, the decoded stream's sha256 resumed after them)" if passed_over else
                           "every frame decoded)"))
    run.reporter.info(f"    {archive.compressed_bytes} bytes compressed; {shipped}{recomputed}")
    if not request.roundtrip:
        proof = Proof(back=done.back, round_trip=None, skipped="skipped with --no-roundtrip")
    elif base is None or whole:
        trip = done.round_trip
        if whole:  # the engine held the release it is made on, whose layers the pass's load named without files
            trip = trip.model_copy(update={"held_before": (base.manifest.image_id,) + ((held,) if held else ())})
        proof = Proof(back=done.back, round_trip=trip, skipped="", engine=fresh, netns_pid=netns_pid)
    else:  # a hotfix: the fresh engine holds its base release now; its small archive is loaded as it is
        _forget_after(run, fresh, archive.image.image_id)
        try:
            with _scratch_room(fresh, room, archive.uncompressed_bytes):
                trip, back = round_trip(archive, fresh)
        except BaseException:
            if checks is not None:
                checks.wait()
            raise
        trip = trip.model_copy(update={"held_before": (base.manifest.image_id,) + ((held,) if held else ())})
        proof = Proof(back=back, round_trip=trip, skipped="", engine=fresh, netns_pid=netns_pid)
    if run.seed is not None and fresh is run.seed.engine:  # kept there for a hotfix or a --from release on it:
        # this release, and the one it was made on (a second release made on that one loads only itself); a hotfix
        # only its base release (no release is made on a hotfix)
        hotfix = base is not None and not whole
        run.seed.keep_after(*((base.manifest.image_id,) if hotfix else
                              (image.image_id, base.manifest.image_id if base is not None else None)))
    if checks is not None:
        if not request.smoke:  # no gate will run in the verify engine: it stops while the checks end, not after
            run.stage_done("smoke gates")
        checks.result()  # a failure (a check, or a change the checks made) releases nothing
        run.reporter.info(f"    in-image checks of {', '.join(plan.profile_names)} passed on the assembled image, "
                          "which they left unchanged")
    return image, archive, proof


def _scan_image(run: Run) -> tuple:
    target: Target = run["target"]
    image: Image = run["image"]
    findings = scan_added(run.engine, image.ref, target.base_image, run.request.identity)
    enforce(findings, run.allow, f"the image {image.ref}")
    return _one(Scan(what="what the image config adds: env, labels, history, command, entrypoint, author",
                     allowed=len(findings)))


def _disk_full(exc: DiskFull, staging: Path, out: Path, size: int | None) -> DiskFull:
    """The archive did not fit: say how much room there is and how much the image needs."""
    free = shutil.disk_usage(staging).free if staging.exists() else shutil.disk_usage(out).free
    return DiskFull(f"{exc}: the release folder {out} has {free} bytes free; the image is {size or 'an unknown number of'} "
                    "bytes uncompressed and its archive needs up to twice its compressed size while it is written; "
                    "free space or choose another --out (the partial files were removed)")


def _said(run: Run, ref: str) -> Callable[[str], None]:
    """Where the image's bytes were read (:func:`unibake.layerstore.archive_image`), as an info line."""
    return lambda where: run.reporter.info(f"    {ref}: {where}")


def _archive(run: Run) -> tuple:
    _base_checked(run)
    target: Target = run["target"]
    image: Image = run["image"]
    base = _delta_base(run)
    request = run.request
    omit = omitted_layers(base.manifest.diff_ids, image.diff_ids) if base else ()
    name = target.archive_name
    staging = run["folder"].staging
    def write(chunks) -> Archive:
        with run.reporter.progress("archive", image.save_bytes or image.size) as advance:
            return write_archive(chunks, staging, name, tag=target.ref, level=request.level,
                                 long_distance=request.long_distance, split=request.split, omit=omit,
                                 progress=advance, inspector=LayerInspector(INSTALL_ROOT))

    try:
        archive = archive_image(run.engine, image.ref, image_id=image.image_id, write=write,
                                use_store=not request.engine_save, on_source=_said(run, image.ref),
                                on_fallback=run.reporter.warn)
    except DiskFull as exc:
        raise _disk_full(exc, staging, request.out, image.size) from None
    check_against(archive.image, image_id=image.image_id, diff_ids=image.diff_ids, what=f"the engine's {image.ref}")
    shipped = f"{len(archive.shipped)} of {len(archive.image.diff_ids)} layers shipped, " if omit else ""
    run.reporter.info(f"    {archive.compressed_bytes} bytes compressed in {archive.seconds:.1f} s; {shipped}config "
                      f"and {len(archive.image.diff_ids)} diffIDs recomputed and matched")
    return _one(archive)


def _read_back(run: Run) -> tuple:
    _base_checked(run)
    archive: Archive = run["archive"]
    base = _delta_base(run)
    request = run.request
    omitted = frozenset(archive.omitted)
    if not request.roundtrip:
        why = "skipped with --no-roundtrip"
        with run.reporter.progress("read back", archive.uncompressed_bytes) as advance:
            back = read_back(archive, omitted=omitted, progress=advance)
        return _one(Proof(back=back, round_trip=None, skipped=why))
    if base is not None:
        _check_base_archive(base)
    engine, netns_pid, where, _, room = _fresh_engine(run)
    run.reporter.info(f"    loading into {where}" + (" (the previous release first)" if base else ""))
    if base is not None:
        _forget_after(run, engine, base.manifest.image_id)
    _forget_after(run, engine, archive.image.image_id)  # held before: the round trip refuses, nothing is removed
    # a hotfix's base release is loaded first: a whole release's archive, its own counter (not the hotfix's)
    loading_base = run.reporter.progress(f"load {base.manifest.release} (the base)",
                                         base.manifest.archive.uncompressed_bytes) if base else nullcontext(None)
    with loading_base as base_advance, run.reporter.progress("round trip", archive.uncompressed_bytes) as advance, \
            _scratch_room(engine, room, archive.uncompressed_bytes):
        trip, back = round_trip(archive, engine, progress=advance,
                                base=(base.folder, base.archive_files, base.manifest.image_id, base.manifest.tag)
                                if base else None, base_progress=base_advance or (lambda n: None))
    if base is not None:
        trip = trip.model_copy(update={"held_before": (base.manifest.image_id,)})
    return _one(Proof(back=back, round_trip=trip, skipped="", engine=engine, netns_pid=netns_pid))


def _smoke_skip(run: Run) -> str | None:
    proof: Proof = run["proof"]
    if proof.round_trip is None:
        return "they run on the loaded image, and the round trip was skipped"
    if not run.request.smoke:
        return "skipped with --no-smoke"
    if run["target"].metadata is None:
        return "the image carries no unibake profiles"
    return None


def _gate_given(spec) -> str:
    """What of run.sh's docker run a gate's container had, and what not: the verify engine's host need not have the
    profile's GPUs and devices, so a server that needs them at start cannot pass there (use smoke.skip)."""
    topology = spec.topology
    shm = f", shm_size {topology.shm_size}" if topology.shm_size else ""
    devices = [f"its {spec.gpus} GPU{'s' if spec.gpus > 1 else ''}"] + list(spec.extra_devices)
    devices += ["/dev/infiniband"] if topology.rdma else []
    return (f"run with ipc {topology.ipc}{shm}; not given {', '.join(devices)} (the verify engine's host need not "
            "have them)")


def _smoke(run: Run) -> tuple:
    proof: Proof = run["proof"]
    target: Target = run["target"]

    def line(result: GateResult) -> None:
        if result.skipped is not None:
            run.reporter.warn(f"smoke gate of profile {result.profile} SKIPPED (its smoke.skip: {result.skipped}); "
                              "the notes say so")
            return
        steps = ", ".join(f"{s.name} {s.seconds:.2f} s{'' if s.passed else ' FAILED'}" for s in result.steps)
        given = _gate_given(target.metadata.profiles[result.profile])
        run.reporter.info(f"    {result.profile}: {'passed' if result.passed else 'FAILED'} ({steps}); {given}")

    # an engine not ours (--verify-engine): each gate container's own network namespace, or its address asked from
    # here and confirmed free once it is removed (another engine's container can hold the same address)
    netns = proof.netns_pid if proof.netns_pid is not None else OWN_NAMESPACE
    results = run_gates(proof.engine, run["image"].ref, target.metadata, netns_pid=netns, on_result=line,
                        warn=run.reporter.warn)
    failed = [g for g in results if g.skipped is None and not g.passed]
    if failed:
        step = failed[0].failed
        raise VerificationError(f"smoke gate failed for profile {failed[0].profile} at step {step.name}: "
                                f"{step.detail}; nothing was published")
    return _one(Gates(results=results, skipped=""))


def _publish(run: Run) -> tuple:
    _base_checked(run)
    target: Target = run["target"]
    image: Image = run["image"]
    archive: Archive = run["archive"]
    proof: Proof = run["proof"]
    gates: Gates = run["gates"]
    folder: ReleaseFolder = run["folder"]
    base: HotfixBase | None = run.get("base")
    request = run.request
    plan: ReleasePlan | None = run.get("plan")
    notes = plan.notes if plan is not None else None
    attachments = {a.name: a.read() for a in notes.attachments} if notes else {}
    first_release = supply.carried_first_release(run, folder)
    # (the release an implicit earlier release was made on is an optimisation: the release it follows is the one
    # --no-from names, a hotfix made on that one since included; an explicit --from or a hotfix names its own)
    previous = (base.manifest if base and not request.earlier
                else previous_release(request.out, target.product, target.release, target.metadata,
                                      first_release=first_release))
    hotfix = base.manifest if base is not None and archive.omitted else None
    if base is not None and hotfix is None and not request.whole:  # apply.sh, the verifiers and deploy would ask for a
        # base it does not need
        run.reporter.warn(f"the image shares no layer with release {base.manifest.release} (its bottom layer changed: "
                          "another base image?): its archive is whole, so it is released as a full release, which "
                          "needs no base in the engine")
    manifest = build_manifest(product=target.product, tag=target.release, image_ref=target.ref, archive=archive,
                              digests=proof.back, metadata=target.metadata, labels=image.labels, previous=previous,
                              hotfix=hotfix, image_size=image.size, notes=notes,
                              attachments=attachments, supply_chain=supply.supply_chain(run),
                              first_release=first_release)
    validation = Validation(round_trip=proof.round_trip, round_trip_skipped=proof.skipped or None,
                            smoke=gates.results, smoke_skipped=gates.skipped or None)
    files: dict[str, str | bytes] = {**render_files(manifest, validation, previous, notes,
                                                    kit_images=supply.kit_images(run)), **attachments}
    enforce(scan_release_texts(files, request.identity), run.allow, f"release {target.release}")
    # checked again as the record takes its place (another product's run of this version may have written it since)
    final = publish(folder, archive, proof.back, files, request.checksums, extra=supply.extra_files(run),
                    sign=supply.sign_sums(run), check_record=lambda record: _refuse_another_products_record(
                        record, target, force=request.force, ending="nothing was published"))
    return _one(Release(folder=final, manifest=manifest, validation=validation, archive=archive))


STAGES: tuple[Stage, ...] = (
    Stage(name="hotfix base", about="the published release a hotfix (or a release made --from it) builds on, and "
                                    "its SOURCE_DATE_EPOCH",
          needs=("request",), gives=("base",), run=_hotfix_base,
          detail=lambda run: f"release {run.request.base}"),
    Stage(name="inspect", about="an image the engine already has: its identity and its own metadata",
          needs=("request",), gives=("target", "image"), run=_inspect, detail=lambda run: run.request.image or ""),
    Stage(name="scan inspected", about="the sanitisation gate on the image config: env, labels, history",
          needs=("target", "image"), uses=("plan",), gives=("image_scan",), run=_scan_image),
    Stage(name="plan", about="profiles loaded, validated, merged; every input hashed and checked against the lock",
          needs=("request",), uses=("base",), gives=("plan",), run=_plan,
          detail=lambda run: display_path((run.request.cwd / run.request.config).resolve(), run.request.cwd)),
    Stage(name="render", about="the Dockerfile, entrypoint, self-check and build context (pure)",
          needs=("plan",), gives=("context",), run=_render, detail=lambda run: run["plan"].tag),
    Stage(name="scan context", about="the sanitisation gate on the build context and the Dockerfile",
          needs=("context",), uses=("plan",), gives=("context_scan",), run=_scan_context),
    Stage(name="rendered copies", about="dockerfiles/rendered/ kept in step with the YAML, for review in git",
          needs=("plan", "context", "context_scan"), gives=("rendered",), run=_write_rendered, skip=_rendered_skip,
          on_skip=lambda reason: (None,)),
    Stage(name="target", about="the product, the release's name and the image reference",
          needs=("plan", "context"), gives=("target",), run=_target_of_plan),
    Stage(name="folder", about="the release folder, locked and staged; an existing release refused before any work",
          needs=("target",), gives=("folder",), run=_folder,
          detail=lambda run: str(run.request.out / run["target"].release)),
    Stage(name="earlier release", about="build without --from: the newest release under --out of this product and "
                                        "platform at this SOURCE_DATE_EPOCH, made on as --from would (the same bytes)",
          needs=("plan", "target", "folder"), gives=("base",), run=_earlier_release,
          detail=lambda run: f"SOURCE_DATE_EPOCH={run.request.epoch}"),
    Stage(name="signing keys", about="the --sign and --sign-minisign keys checked: each signs a probe before any work",
          needs=("request",), gives=("signer",), run=supply.signing_keys, skip=supply.signing_keys_skip,
          on_skip=lambda reason: (None,)),
    Stage(name="kit begin", about="the reconstruct kit begun in a thread, its build context written, hashed and "
                                  "compressed: after the build (beside the export), or at once on a base release",
          needs=("plan", "context", "target", "folder"),
          gives=("kit_draft",), run=supply.kit_begin_stage, skip=supply.kit_skip, on_skip=lambda reason: (None,)),
    Stage(name="build", about="the image built; the in-image checks run as its last steps, so a failure tags nothing",
          needs=("plan", "context"), uses=("base",), gives=("built",), run=_build,
          detail=lambda run: f"{run['plan'].tag} ({run['plan'].platform.name}) on engine {run.engine.version()} at "
                             f"{run.engine.address}"),
    Stage(name="normalise", about="times set to SOURCE_DATE_EPOCH in the layers unibake adds: the same inputs, "
                                  "the same image ID", needs=("plan", "context", "built"), uses=("base",),
          gives=("image",), run=_normalise, detail=lambda run: f"times set to SOURCE_DATE_EPOCH={run.epoch}"),
    Stage(name="export", about="one pass over the save stream: normalised, archived in canonical form, loaded "
                               "into an engine that never saw the image, and the archive read back",
          needs=("plan", "context", "built", "target", "folder"), uses=("base",), gives=("image", "archive", "proof"),
          run=_export, detail=lambda run: f"{run['built'].tag}, times set to SOURCE_DATE_EPOCH={run.epoch}"),
    Stage(name="scan image", about="the sanitisation gate on what the image config adds: env, labels, history",
          needs=("target", "image"), uses=("plan",), gives=("image_scan",), run=_scan_image),
    Stage(name="temp folder", about="a temporary folder for an archive that is not published (repro)",
          needs=("request",), gives=("folder",), run=_temp_folder),
    Stage(name="archive", about="one pass over the save stream: every diffID recomputed, zstd frames, the canonical "
                                ".tar.zst", needs=("target", "image", "folder"), uses=("base",), gives=("archive",),
          run=_archive, detail=lambda run: f"{run['image'].ref} -> {run['target'].archive_name}"),
    Stage(name="round trip", about="the archive read back once: every digest taken, and loaded into an engine "
                                   "that never saw the image (with --no-roundtrip: only parsed and checked)",
          needs=("archive",), uses=("base",), gives=("proof",), run=_read_back,
          detail=lambda run: "load into an engine that never saw the image" if run.request.roundtrip
          else "read back only (--no-roundtrip): decompress, hash and check the archive written"),
    Stage(name="smoke gates", about="every profile's gate on the loaded image: self-check, start, /health, a chat",
          needs=("proof", "target", "image"), gives=("gates",), run=_smoke, skip=_smoke_skip,
          on_skip=lambda reason: (Gates(results=(), skipped=reason),),
          detail=lambda run: ", ".join(sorted(run["target"].metadata.profiles))),
    Stage(name="sbom", about="sbom.cdx.json (CycloneDX): the base by digest, components, kernels' .so digests, "
                             "packages read in the archive pass", needs=("target", "image", "archive", "folder"),
          uses=("plan",), gives=("sbom",), run=supply.sbom_stage),
    Stage(name="kit", about="the reconstruct kit: Dockerfile, context as built, inputs.lock, profiles, the tool, "
                            "verify.sh", needs=("target", "image", "folder", "sbom"), uses=("plan", "context", "kit_draft"),
          gives=("kit",), run=supply.kit_stage, skip=supply.kit_skip, on_skip=lambda reason: (None,)),
    Stage(name="provenance", about="provenance.intoto.json (in-toto, SLSA v1): subjects, materials, builder; signed",
          needs=("target", "image", "archive", "proof", "sbom", "folder"), uses=("plan", "kit", "signer"),
          gives=("provenance",), run=supply.provenance_stage),
    Stage(name="publish", about="manifest, notes, validation, run.sh, SHA256SUMS last and signed; the folder renamed "
                                "into place",
          needs=("target", "image", "archive", "proof", "gates", "folder"), uses=("base", "plan", "sbom", "kit",
                                                                                  "provenance", "signer"),
          gives=("release",),
          run=_publish, detail=lambda run: str(run.request.out / run["target"].release)),
)
BY_NAME = {s.name: s for s in STAGES}
BUILD = ("plan", "render", "scan context", "rendered copies", "target", "folder", "signing keys", "kit begin", "build",
         "export", "scan image", "smoke gates", "sbom", "kit", "provenance", "publish")
SEQUENTIAL = ("plan", "render", "scan context", "rendered copies", "target", "folder", "signing keys", "kit begin",
              "build", "normalise", "scan image", "archive", "round trip", "smoke gates", "sbom", "kit",
              "provenance", "publish")
ARCHIVE = ("inspect", "scan inspected", "folder", "signing keys", "archive", "round trip", "smoke gates", "sbom",
           "provenance", "publish")
HOTFIX = ("hotfix base",) + BUILD

HOTFIX_SEQUENTIAL = ("hotfix base",) + SEQUENTIAL
REPRO = ("plan", "render", "scan context", "target", "build", "normalise", "scan image", "temp folder", "archive",
         "round trip")
STOP_AFTER = {"render": "rendered copies", "build": "scan image", "release": "publish"}


def on_earlier(request: Request, names: Sequence[str]) -> tuple[Request, tuple[str, ...]]:
    """A release's request and stages, made on the newest earlier release at its SOURCE_DATE_EPOCH when one is
    found (the "earlier release" stage), where that gives the same bytes and the same proof: the one-pass export
    (not ``--sequential``) with the build memo (not ``--no-cache``: a cold release stays cold), its round trip in
    the seeded verify engine (not ``--no-seed`` or ``--verify-engine``, which ask for an engine holding nothing of
    this product). Otherwise both unchanged."""
    if "folder" not in names or "export" not in names or request.base or request.nocache or not request.seed \
            or request.verify_engine or not request.roundtrip or request.hold:
        return request, tuple(names)
    at = list(names).index("folder") + 1
    return replace(request, whole=True, earlier=True), (*names[:at], "earlier release", *names[at:])


def selection(names: Sequence[str], stop_after: str = "release") -> tuple[Stage, ...]:
    """The stages of a command, in the order of :data:`STAGES`, up to ``--stage``; the build and
    render stops leave out the release folder (and stop after normalising: nothing is archived)."""
    last = STOP_AFTER[stop_after]
    chosen = [n for n in names]
    if stop_after != "release" and "export" in chosen:
        chosen = [("normalise" if n == "export" else n) for n in chosen]
    chosen = chosen[:chosen.index(last) + 1] if last in chosen else chosen
    if stop_after != "release":
        chosen = [n for n in chosen if n not in ("folder", "signing keys", "kit begin")]
    order = {s.name: i for i, s in enumerate(STAGES)}
    if [order[n] for n in chosen] != sorted(order[n] for n in chosen):
        raise PipelineError(f"stages out of order: {', '.join(chosen)}")
    return tuple(BY_NAME[n] for n in chosen)


def check_wiring(stages: Sequence[Stage], given: Sequence[str] = ()) -> None:
    """Every stage's needs are given by an earlier one (or by ``given``, the results of an earlier
    run): a wiring mistake fails before any work."""
    given = {"request", *given}
    for stage in stages:
        missing = [n for n in stage.needs if n not in given]
        if missing:
            raise PipelineError(f"stage {stage.name!r} needs {', '.join(missing)}, which no earlier stage gives")
        given.update(stage.gives)


@dataclass(frozen=True, kw_only=True)
class Results:
    """What a run gave, by name."""

    values: Mapping[str, object]

    def __getitem__(self, name: str):
        return self.values[name]

    def get(self, name: str):
        return self.values.get(name)


def docker_engines(request: Request) -> Connect:
    return lambda address: DockerEngine(address, request.env)


def run_stages(stages: Sequence[Stage], request: Request, reporter: Reporter, *,
               connect: Connect | None = None, stack: ExitStack | None = None,
               given: Results | None = None, builds: bool | None = None) -> Results:
    """Run ``stages`` in order: each timed and reported, skipped ones recorded with why.
    ``connect`` makes an engine of an address (default: docker-py's; unit tests pass a fake).
    ``stack``: the caller's, so that what the stages hold (the release folder, the scratch engine)
    outlives this call; ``given``: the results of an earlier call on it, to go on from; ``builds``: whether
    a later call builds (default: whether ``stages`` has the build)."""
    check_wiring(stages, tuple(given.values) if given else ())
    with ExitStack() as own:
        run = Run(request, reporter, stack if stack is not None else own, connect or docker_engines(request))
        run.results.update(given.values if given else {})
        run.builds = any(s.name == "build" for s in stages) if builds is None else builds
        run.publishes = any(s.name == "folder" for s in stages)
        for stage in stages:
            reason = stage.skip(run)
            if reason:
                reporter.skipped(stage.name, reason)
                given = stage.on_skip(reason)
            else:
                with reporter.stage(stage.name, stage.detail(run)):
                    given = stage.run(run)
            if len(given) != len(stage.gives):
                raise PipelineError(f"stage {stage.name!r} gave {len(given)} results, not {len(stage.gives)}")
            run.results.update(zip(stage.gives, given))
            run.stage_done(stage.name)
        return Results(values=dict(run.results))


# ---------------------------------------------------------------------------------------------
# Repro: the build's stages twice, then the comparison


def reproduce(request: Request, reporter: Reporter, *, connect: Connect | None = None):
    """Two cold builds of the same inputs, each archived as a release would be, compared.

    Each build is made under its own tag, ``unibake-repro/<product>:<n>-<run>`` (a released tag never
    moves), and held there until the comparison is done; the archives name the release's tag, as
    the release would; the holding tags are removed after."""
    from .repro import compare

    connect = connect or docker_engines(request)
    engine = connect(request.engine)
    builds, held = [], []
    token = f"{os.getpid()}x{secrets.token_hex(3)}"
    try:
        for n in (1, 2):
            reporter.info(f"==> cold build {n} of 2")
            # a tag of this run's own: two repros at once took each other's (and a warning named the release's)
            hold = f"{n}-{token}"
            results = run_stages(selection(REPRO), replace(request, hold=hold), reporter, connect=connect)
            image: Image = results["image"]
            proof: Proof = results["proof"]
            held.append(image.ref)
            builds.append(ReproBuild(image_id=image.image_id, diff_ids=image.diff_ids,
                                     archive_sha256=proof.back.compressed_sha256))
        return compare(engine, results["plan"].tag, *builds)
    finally:
        for hold in held:
            try:
                engine.remove_image(hold)
            except UnibakeError as err:  # the run's own error (or its report) is the one to give
                reporter.warn(f"{hold} is left in the engine: {err}")


# ---------------------------------------------------------------------------------------------
# Where the epoch and revision come from


def git_revision(root: Path, outputs: Sequence[Path] = ()) -> str:
    """HEAD's commit, ``-dirty`` when a tracked file differs from it. Changes under ``outputs`` (the
    release folder, the checksums folder, the rendered copies) do not count: they are what a run
    writes, not its sources, so a second run of the same commit must not call the first one's results
    a change."""
    try:
        git = ["git", "-C", str(root)]
        rev = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        top = Path(subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                                  check=True).stdout.strip())
        status = subprocess.run([*git, "status", "--porcelain", "-z", "--untracked-files=no"],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    skip = [o.resolve() for o in outputs]
    entries, changed = iter(status.split("\0")), []
    for entry in entries:
        if len(entry) > 3:
            changed.append(top / entry[3:])
            if entry[0] in "RC":  # a rename or copy: its source path is the next field
                changed.append(top / next(entries, ""))
    dirty = [p for p in changed if not any(p == o or o in p.parents for o in skip)]
    return rev + ("-dirty" if dirty else "")


def source_date_epoch(root: Path, env: Mapping[str, str]) -> int:
    """SOURCE_DATE_EPOCH if set, else the last commit's time, else 0: never the wall clock."""
    value = env.get("SOURCE_DATE_EPOCH")
    if value is not None:
        if not value.isdigit() or not value.isascii() or int(value) > MAX_EPOCH:
            raise InputError(f"SOURCE_DATE_EPOCH={value!r} is not a whole number of seconds (0 to {MAX_EPOCH})")
        return int(value)
    try:
        out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True,
                             text=True, check=True).stdout.strip()
        return int(out) if out.isdigit() else 0
    except (OSError, subprocess.CalledProcessError):
        return 0
