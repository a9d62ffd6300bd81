"""``build.py prune``: what unibake leaves in the engine over time, removed on request.

Kept: the images of the newest ``--keep`` versions of each product found under ``--out`` (ranked by
when each version was first published: a folder added to an older version later, ``--profile tp4
--version 1.0`` after 2.0, does not make it newer, nor does a ``--force`` re-release of 1.0, whose
manifest keeps the first release's time; a version's folders, one per platform or profile
selection, count as one), and the base image of every kept hotfix (its archive ships only the
layers the base lacks). Removed: the engine's tags of older releases (when the image's own metadata
label names that release: a folder alone cannot name an image to remove) and their kits' rebuilds
(``unibake-kit/<product>:<release>``), unibake's build cache
(``unibake-cache/*``), and dangling images unibake made: an older release's image, or a build of
unibake's Dockerfile (its history ends with the Dockerfile's own last steps; an image built FROM a
release carries the release's labels too, so labels alone prove nothing). Nothing is forced: an
image a container uses is kept, and said; so is the image of a release whose lock a run holds (one
writing it, a hotfix made on it), and prune holds the lock of each release whose image it removes
(of a linked folder, ``1.0 -> /mnt/big/1.0``, the target's too).
With a release folder it cannot read, only build cache goes. What a killed run left under ``--out``
(``.<tag>.partial``, ..., and its temporary checksums record, an older unibake's too) is removed, and so
are the temporary files of the writes a killed run left (``files.write_atomic``'s, in the places it writes).
Release folders and images unibake did not make are never touched.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from .builder import CACHE_REPOSITORY
from .engine import Engine, ImageSummary
from .errors import InputError, UnibakeError
from .files import ATOMIC_TEMP_AGE, remove_tree
from .kit import KIT_REPOSITORY
from .manifest import ReleaseManifest
from .metadata import ImageMetadata
from .plan import INSTALL_ROOT
from .publish import SUMS, check_tag, find_releases, lock_release, record_temp, release_locks
from .released import REPRO_REPOSITORY

# The last three steps of unibake's Dockerfile (templates/Dockerfile.j2), as an engine's history
# records them: the classic builder prefixes "/bin/sh -c #(nop)  ", BuildKit does not.
_NOP = r"(?:/bin/sh -c #\(nop\) +)?"
_OWN_TAIL = (re.compile(rf"{_NOP}LABEL .*\bio\.unibake\.schema=.*", re.S),
             re.compile(rf'{_NOP}ENTRYPOINT \["{re.escape(INSTALL_ROOT)}/meta/entrypoint\.sh"\]'),
             re.compile(rf'{_NOP}CMD \["serve"\]'))
_OWN_LABELS = "io.unibake."


@dataclass(frozen=True, kw_only=True)
class Removal:
    ref: str  # a tag, or the ID of a dangling image
    why: str
    kept: str = ""  # set when the engine refused to let it go without force: why it stays
    releases: tuple[str, ...] = ()  # the release folders whose image it is: their locks are held while it goes
    image_id: str = ""  # the release's image it removes (its tag, or the image itself): checked again under the locks


def unreadable_releases(out: Path) -> list[tuple[Path, str]]:
    """The release folders under ``out`` whose manifest.json cannot be read, or is not the one their SHA256SUMS
    lists (its date may be forged, to rank it the newest and have a real release's image removed): what they
    need is unknown. Each with what is wrong."""
    found = []
    for release in find_releases(out):
        why = release.unvouched if release.manifest is not None else release.problem
        if why:
            found.append((release.folder, why))
    return found + _set_aside(out)


def _set_aside(out: Path) -> list[tuple[Path, str]]:
    """Releases a --force commit set aside, whose replacement never took the name (a run killed between the two
    renames): the last whole release of that tag, which the next run puts back. ``find_releases`` does not see
    them (a hidden name), so what they need is unknown to prune (before: a hotfix's base it needed was removed)."""
    found = []
    for entry in sorted(out.iterdir()) if out.is_dir() else ():
        tag = entry.name[1:-len(".old")] if entry.name.startswith(".") and entry.name.endswith(".old") else ""
        if tag and entry.is_dir() and not entry.is_symlink() and not os.path.lexists(out / tag):
            found.append((entry, f"release {tag} set aside by a --force run that was killed before its new release "
                                 f"took the name; the next run of {tag} puts it back"))
    return found


# what a run leaves under --out while it writes release TAG, until it ends: the staged release, the
# release a --force commit set aside, a push's copy
LEFTOVERS = (".partial", ".old", ".amend")


def remove_leftovers(out: Path, *, dry_run: bool = False) -> list[Path]:
    """What a run killed before it ended (SIGKILL, a power cut) left under ``out``: ``.<tag>.partial``
    (a staged release, an archive of gigabytes), ``.<tag>.amend`` (a push's copy) and ``.<tag>.old``
    beside its release ``<tag>`` (the replaced one, once the new one took its name); removed (unless
    ``dry_run``) while their tag's lock is held, so never under a run writing them. A ``.<tag>.old``
    without ``<tag>`` is the last whole release: the next run of that tag puts it back, so it stays."""
    found = []
    for entry in sorted(out.iterdir()) if out.is_dir() else ():
        suffix = next((s for s in LEFTOVERS if entry.name.startswith(".") and entry.name.endswith(s)), None)
        if suffix is None or entry.is_symlink() or not entry.is_dir():
            continue
        tag = entry.name[1:-len(suffix)]
        if not tag or (suffix == ".old" and not os.path.isdir(out / tag)):
            continue
        # (a folder this user cannot change, or nested too deep for rmtree: left, as before)
        if _remove_unless_in_use(out, tag, lambda: dry_run or remove_tree(entry), (OSError, RecursionError)):
            found.append(entry)
    return found + _record_leftovers(out, dry_run=dry_run)


# files.write_atomic's temporary file: ".NAME." (or, for a long NAME, 16 hex digits of its hash), tempfile's 8
# characters, ".tmp"; a SIGKILL or a power cut between its making and its rename leaves it beside NAME
ATOMIC_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")


@dataclass(frozen=True, kw_only=True)
class Place:
    """A folder unibake writes with write_atomic, and which names it writes there (None: any, a cache of its own)."""

    folder: Path
    top: Path  # the folder taken as it is (the project's root, the user's cache): no link below it is followed
    names: frozenset[str] | None = None
    pattern: re.Pattern = ATOMIC_TEMP_RE

    def linked(self) -> bool:
        """Whether ``folder``, or a folder between ``top`` and it, is a symbolic link."""
        return any(os.path.islink(part) for part in (self.folder, *self.folder.parents) if self.top in part.parents)


def remove_temporary_files(places: list[Place], *, dry_run: bool = False, now: float | None = None,
                           min_age: float = ATOMIC_TEMP_AGE) -> list[Path]:
    """The temporary files killed writes left in ``places``: only a regular file of this user's whose name is one
    of those writers' temporary names for a file they write there (``.inputs.lock.k3x_9q2a.tmp``), last changed
    ``min_age`` seconds ago or more (its writer is gone: see :data:`unibake.files.ATOMIC_TEMP_AGE`); removed unless
    ``dry_run``. A folder that is a link, or under one, is not looked into (its files are not the project's)."""
    now = time.time() if now is None else now
    found = []
    for place in places:
        if place.linked():
            continue
        try:
            with os.scandir(place.folder) as listed:
                entries = sorted(listed, key=lambda e: e.name)
        except OSError:  # none (nothing written there yet), or not readable: nothing of ours to find
            continue
        for entry in entries:
            match = place.pattern.fullmatch(entry.name)
            if match is None or (place.names is not None and match.group("name") not in place.names):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            # (the later of its times: utime can set the mtime back, not the ctime)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or \
                    now - max(info.st_mtime, info.st_ctime) < min_age:
                continue
            try:
                if not dry_run:
                    os.unlink(entry.path)  # (a name: a link put there meanwhile is not followed)
            except FileNotFoundError:
                continue
            except OSError:  # a folder this user cannot change: left
                continue
            found.append(Path(entry.path))
    return found


def _remove_unless_in_use(out: Path, tag: str, remove: Callable[[], object],
                          left: tuple[type[BaseException], ...]) -> bool:
    """``remove()`` (what a killed run of release ``tag`` left) while that release's lock is held, without
    waiting: False when a run holds it (it is that run's), or when ``remove`` fails with one of ``left``."""
    try:
        lock = lock_release(out, tag, create=False)
    except UnibakeError:
        return False  # a run is writing it
    try:
        remove()
        return True
    except left:
        return False
    finally:
        if lock is not None:
            lock.close()


def _record_leftovers(out: Path, *, dry_run: bool) -> list[Path]:
    """The temporary checksums records a run on ``out`` killed before its commit left beside it
    (``checksums/.<tag>.SHA256SUMS.<key>.tmp``, the key naming the release folder ``out/<tag>``):
    removed (unless ``dry_run``) under their tag's lock; another --out's are its own. The one an older
    unibake's killed run left (``checksums/.<tag>.SHA256SUMS.tmp``) names no --out: removed when it is a
    plain file, under the tag's lock of every --out beside checksums/ that ever wrote that tag."""
    checksums = out.parent / "checksums"
    found = []
    for entry in sorted(checksums.iterdir()) if checksums.is_dir() else ():
        if entry.name.startswith(".") and entry.name.endswith(f".{SUMS}.tmp"):
            tag = entry.name[1:-len(f".{SUMS}.tmp")]
            outs = _outs_of(out.parent, tag) if _is_tag(tag) and entry.is_file() and not entry.is_symlink() else None
            if outs is not None and _remove_unless_any_in_use(outs, tag, lambda: dry_run or entry.unlink()):
                found.append(entry)
            continue
        tag = entry.name[1:].rsplit(f".{SUMS}.", 1)[0]
        if not entry.name.startswith(".") or not tag or record_temp(checksums / f"{tag}.{SUMS}", out / tag) != entry:
            continue
        # (unlinked: a name, so a link planted there is not followed)
        if _remove_unless_in_use(out, tag, lambda: dry_run or entry.unlink(), (OSError,)):
            found.append(entry)
    return found


def _is_tag(tag: str) -> bool:
    try:
        check_tag(tag)
        return True
    except InputError:
        return False


def _outs_of(parent: Path, tag: str) -> list[Path] | None:
    """The folders under ``parent`` (the --outs that share ``parent/checksums``) where a run ever locked
    release ``tag`` (``.<tag>.lock``); None when ``parent`` cannot be listed (they are not known)."""
    try:
        return [entry for entry in sorted(parent.iterdir())
                if entry.is_dir() and os.path.lexists(entry / f".{tag}.lock")]
    except OSError:
        return None


def _remove_unless_any_in_use(outs: list[Path], tag: str, remove: Callable[[], object]) -> bool:
    """``remove()`` while release ``tag``'s lock is held under each of ``outs``, without waiting: False
    when a run holds any of them (it may be that run's), or when ``remove`` fails."""
    with ExitStack() as locks:
        for where in outs:
            try:
                lock = lock_release(where, tag, create=False)
            except UnibakeError:
                return False
            if lock is not None:
                locks.callback(lock.close)
        try:
            remove()
            return True
        except OSError:
            return False


def plan_removals(engine: Engine, out: Path, *, keep: int) -> list[Removal]:
    """What prune would remove, without removing anything. With a release folder whose manifest
    cannot be read, only build cache: that release may be the newest, or a hotfix whose base image
    (an older release's, or a dangling one) no other folder says is needed."""
    releases = find_releases(out)
    needed = _needed_now(out, keep, releases)
    removals: list[Removal] = []
    if needed is None:
        return [_leftover_removal(tag) for image in engine.list_images() for tag in image.tags if _leftover(tag)]
    manifests = [found.manifest for found in releases]
    folders: dict[str, tuple[str, ...]] = {}  # an image ID: the folders that released it
    for found in releases:
        folders[found.manifest.image_id] = (*folders.get(found.manifest.image_id, ()), found.folder.name)
    for m in manifests:
        if m.image_id in needed:
            continue
        info = engine.inspect_image(m.tag)
        if info is not None and info.id == m.image_id and _made_by_unibake(info.labels, m):
            removals.append(Removal(ref=m.tag, why=f"release {m.release} of {m.product}, older than the "
                                                   f"newest {keep}", releases=folders[m.image_id], image_id=m.image_id))
        kit_ref = f"{KIT_REPOSITORY}/{m.product}:{m.release}"  # build.py rebuild's tag would keep the image
        info = engine.inspect_image(kit_ref)
        if info is not None and info.id == m.image_id and _made_by_unibake(info.labels, m):
            removals.append(Removal(ref=kit_ref, why=f"the kit's rebuild of release {m.release} of {m.product}, "
                                                     f"older than the newest {keep}", releases=folders[m.image_id],
                                    image_id=m.image_id))
    for image in engine.list_images():
        for tag in image.tags:
            if _leftover(tag):
                removals.append(_leftover_removal(tag))
    released = {m.image_id: m for m in manifests}
    for image in engine.list_images(dangling=True):
        if image.id in needed:
            continue
        m = released.get(image.id)
        if m is not None:
            if _made_by_unibake(image.labels, m):
                removals.append(Removal(ref=image.id, why=f"the image of release {m.release} of {m.product}, "
                                                          f"older than the newest {keep}; no tag names it",
                                        releases=folders[image.id], image_id=image.id))
        elif _built_by_unibake(engine, image):
            removals.append(Removal(ref=image.id, why="a dangling image unibake built"))
    # each once: copies of one release folder under --out named its tag once per copy (listed and counted so)
    return list({removal.ref: removal for removal in reversed(removals)}.values())[::-1]


# the token of a run's own tag (builder._hold's, an assembled hotfix's, a kit rebuild's, repro's): its process ID,
# "x", 6 hex digits, and (a hold's) the image's place
_RUN_TOKEN_RE = re.compile(r"(?<![0-9])([0-9]{1,9})x[0-9a-f]{6}(?:-[0-9]+)?$")


def _leftover_removal(tag: str) -> Removal:
    """``tag``'s removal; kept, and said, when it is the own tag of a run still going on this machine (it holds an
    image that run is reading: a hold's, a small image an assembled hotfix exports, a repro's build). A run
    elsewhere (an engine that another machine uses too) cannot be told: its tags go, as before."""
    found = _RUN_TOKEN_RE.search(tag.rpartition(":")[2])
    kept = ""
    if found is not None and int(found.group(1)) not in (0, os.getpid()):
        try:
            os.kill(int(found.group(1)), 0)
            kept = f"the run of process {found.group(1)} holds it, and that process is running"
        except PermissionError:  # (another user's)
            kept = f"the run of process {found.group(1)} holds it, and that process is running"
        except (ProcessLookupError, OverflowError, OSError):
            pass
    return Removal(ref=tag, why=_leftover(tag), kept=kept)


def _leftover(tag: str) -> str:
    """Why ``tag`` is a run's leftover prune removes (build cache; a repro build's tag, which a run removes when it
    ends, one killed left, each run's its own), or "" when it is not one."""
    if tag.startswith(f"{CACHE_REPOSITORY}/"):
        return "build cache"
    if tag.startswith(f"{REPRO_REPOSITORY}/"):
        return "a repro build's tag (a repro run removes its own: a killed one left it)"
    return ""


def _needed_now(out: Path, keep: int, releases: list | None = None) -> set[str] | None:
    """The image IDs the releases under ``out`` need now (:func:`_needed_images`); None when one cannot be read (or is
    not vouched for by its SHA256SUMS, or was set aside by a killed --force run): what it needs is unknown.
    Only this user's release folders rank: a folder another user put under a shared ``--out`` (a newer release, or
    an old one naming another product's image) keeps its image and its base, and never has one removed."""
    releases = find_releases(out) if releases is None else releases
    if _set_aside(out) or any(found.manifest is None or found.unvouched for found in releases):
        return None
    own = [found.manifest for found in releases if _owner(found.folder) == os.geteuid()]
    others = [found.manifest for found in releases if _owner(found.folder) != os.geteuid()]
    kept = _needed_images(own, keep) | {m.image_id for m in others}
    todo = list(kept)
    while todo:  # the base of every hotfix kept, transitively, through anyone's folders (theirs on ours, ours on theirs)
        image = todo.pop()
        for m in [*own, *others]:
            if m.hotfix and m.image_id == image and m.hotfix.base_image_id not in kept:
                kept.add(m.hotfix.base_image_id)
                todo.append(m.hotfix.base_image_id)
    return kept


def _owner(folder: Path) -> int | None:
    try:
        return folder.stat().st_uid
    except OSError:
        return None


def _needed_images(manifests: list[ReleaseManifest], keep: int) -> set[str]:
    """The image IDs prune keeps: those of the ``keep`` versions of each product released last (all the
    folders of a version: its platforms are published in the same second, and a count of folders
    would keep one platform of a version and drop another), and the base of every kept hotfix,
    transitively (``verify --load`` and apply.sh need it in the engine)."""
    versions: dict[str, dict[str, list[ReleaseManifest]]] = {}
    for m in manifests:  # first released first, so a version's place is that of its first folder
        versions.setdefault(m.product, {}).setdefault(m.version, []).append(m)
    needed: set[str] = set()
    for by_version in versions.values():
        for folders in list(by_version.values())[-keep:] if keep else []:  # all of them when fewer than keep
            needed.update(m.image_id for m in folders)
    bases = [m.hotfix.base_image_id for m in manifests if m.hotfix and m.image_id in needed]
    while bases:
        base = bases.pop()
        if base not in needed:
            needed.add(base)
            bases += [m.hotfix.base_image_id for m in manifests if m.hotfix and m.image_id == base]
    return needed


def _made_by_unibake(labels: dict[str, str], manifest) -> bool:
    """A folder under --out only says which image it released; the image itself must say unibake
    built it as that release (its metadata label naming the same product and tag), or it is left
    alone: a folder naming, say, postgres:15 removes nothing."""
    try:
        metadata = ImageMetadata.from_labels(labels or {}, manifest.tag)
    except UnibakeError:
        return False
    return metadata is not None and (metadata.product, metadata.tag) == (manifest.product, manifest.tag)


def _built_by_unibake(engine: Engine, image: ImageSummary) -> bool:
    """A dangling image is a build of unibake's Dockerfile when its metadata label reads and its
    history ends with that Dockerfile's last three steps, the only step that set unibake's labels
    among them: an image built FROM a release (``RUN ...``, or even those same steps again) has
    steps of its own after them."""
    try:
        if ImageMetadata.from_labels(image.labels or {}, image.id) is None:
            return False
    except UnibakeError:
        return False
    history = engine.history(image.id)
    if len(history) < len(_OWN_TAIL) or sum(_OWN_LABELS in step for step in history) != 1:
        return False
    return all(pattern.fullmatch(step.strip()) for pattern, step in zip(_OWN_TAIL, history[-len(_OWN_TAIL):]))


def prune(engine: Engine, out: Path, *, keep: int, dry_run: bool = False,
          on_line: Callable[[str], None] = lambda line: None,
          on_warning: Callable[[str], None] = lambda line: None) -> list[Removal]:
    """The removals planned, each removed (unless ``dry_run``) without force: one the engine keeps
    because a container uses it comes back with ``kept`` saying so."""
    for folder, why in unreadable_releases(out):
        on_warning(f"the release folder {folder} has a manifest.json that cannot be read, or that its SHA256SUMS does "
                   f"not list: prune cannot tell which images it needs, so it removes build cache only; check it with "
                   f"python build.py verify {folder}, then fix or move it ({why[:300]})")
    for found in find_releases(out):
        owner = _owner(found.folder)
        if owner is not None and owner != os.geteuid():
            on_warning(f"the release folder {found.folder} is another user's (uid {owner}): its image and its base are "
                       "kept, and it counts toward no --keep here; that user's prune removes what it no longer needs")
    done = []
    held: set[tuple[Path, str]] = set()
    with ExitStack() as locks:
        planned = []
        for r in plan_removals(engine, out, keep=keep):
            try:  # a run writing that release (--force), or a hotfix made on it, needs its image till it ends
                for where, release in [lock for name in sorted(r.releases) for lock in release_locks(out, name)]:
                    if (where, release) in held:
                        continue
                    lock = lock_release(where, release, create=not dry_run)
                    if lock is not None:
                        locks.callback(lock.close)
                    held.add((where, release))
            except UnibakeError as exc:
                r = replace(r, kept=str(exc))
            planned.append(r)
        # the releases read again once every lock is held: a hotfix that ended meanwhile (it published on a release
        # whose lock prune waited for) needs its base now
        needed = _needed_now(out, keep) if any(r.image_id and not r.kept for r in planned) else set()
        for r in planned:
            if not r.kept and r.image_id and (needed is None or r.image_id in needed):
                r = replace(r, kept="a release published, or changed, while prune ran needs it")
            if r.kept:
                on_line(f"    kept {r.ref} ({r.why}; {r.kept})")
            elif dry_run:
                on_line(f"    would remove {r.ref} ({r.why})")
            else:
                gone = engine.remove_if_unused(r.ref) if r.ref.startswith("sha256:") else engine.untag(r.ref)
                if not gone:
                    r = replace(r, kept="a container or another image uses it")
                on_line(f"    {f'kept {r.ref} ({r.why}; {r.kept})' if r.kept else f'removing {r.ref} ({r.why})'}")
            done.append(r)
    return done
