"""The release folder: manifest, notes, validation, run.sh, sums; nothing half-written.

Everything is written into ``<out>/.<tag>.partial/`` under temporary names, each file renamed
when complete and fsynced, ``SHA256SUMS`` last; the folder then takes its final name in one
rename. A lock (``<out>/.<tag>.lock``) refuses a second run on the same tag; a finished release is
replaced only with ``--force``; what an interrupted run left is removed by the next one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from . import __version__
from .archive import Archive
from .archive_reader import ReadBack
from .errors import DiskFull, InputError, NoLocks, UnibakeError, VerificationError
from .files import (decode_text, fresh_folder, fsync_dir, open_lock, open_new, read_small_file, remove_tree,
                    same_file, write_atomic)
from .manifest import (MANIFEST, SCHEMA_VERSION, VALIDATION, ArchiveFile, ArchiveRecord,
                       AttachmentRecord, Compression, ExternalRecord, HotfixRecord, ReleaseManifest, SupplyChain, Tool,
                       Validation, read_manifest)
from .metadata import ImageMetadata, first_error
from .notes import Notes
from .platforms import recorded_by
from .sums import parse_sums, render_sums
from .templates import render_template

SUMS = "SHA256SUMS"
SUMS_LIMIT = 1 << 20  # a release's SHA256SUMS (and its checksums record) lists a few files
TAG_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def release_tag(image_ref: str) -> str:
    """The tag part of an image reference (``latest`` when it has none): the release folder's name."""
    return image_ref.rsplit(":", 1)[1] if ":" in image_ref.rsplit("/", 1)[-1] else "latest"


def repository(image_ref: str) -> str:
    """The repository part of an image reference (``demo-llm`` of ``demo-llm:1.3.1``)."""
    return image_ref.rsplit(":", 1)[0] if ":" in image_ref.rsplit("/", 1)[-1] else image_ref


def check_tag(tag: str) -> str:
    if not tag or not set(tag) <= TAG_CHARS or tag.startswith((".", "-")) or len(tag) > 128:
        raise InputError(f"release tag {tag!r} is not valid: letters, digits, '.', '_' and '-', not starting "
                         "with '.' or '-'")
    return tag


HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# the release folders this process committed: a run interrupted after one says it was published
COMMITTED: list[Path] = []


@contextmanager
def held_signals():
    """SIGINT, SIGTERM and SIGHUP recorded, not acted on, inside the block; the first one recorded
    is raised again after it. The handlers are swapped, not the thread's signal mask: the kernel
    hands a signal to any thread that does not block it (the scratch engine's stopping thread runs
    while a release is published), and Python runs its handler in the main thread whatever that
    thread's mask. From another thread (where handlers cannot be set) the block runs unheld."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous: dict = {}
    try:  # a signal as the handlers are swapped: those swapped so far are put back, and the block is not run
        for sig in HELD:
            previous[sig] = signal.getsignal(sig)  # (known before the swap: a signal right after it loses nothing)
            signal.signal(sig, lambda signum, frame: pending.append(signum))
        yield
    finally:
        interrupted = None
        for sig, handler in previous.items():
            while True:  # every handler put back, whatever comes meanwhile: one left recording would swallow
                try:  # that signal for the rest of the run (its clean-up's "interrupt once more" among them)
                    signal.signal(sig, handler)
                    break
                except KeyboardInterrupt as exc:  # (a signal whose handler is back already: raised after)
                    interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
        if pending:
            signal.raise_signal(pending[0])


def refuse_existing(final: Path) -> None:
    """InputError when the release folder ``final`` exists (a run without ``--force``)."""
    if os.path.lexists(final):
        raise InputError(f"release {final} already exists; use --force to replace it, or another release name "
                         "(--version; for archive, --tag)")


class ReleaseFolder:
    """``<out>/<tag>/``, staged and locked; a context manager that never leaves a half release."""

    def __init__(self, out: Path, tag: str, *, force: bool):
        self.out, self.tag, self.force = out, check_tag(tag), force
        self.final = out / tag
        self.staging = out / f".{tag}.partial"
        self.committed = False  # the release is published (the run may still fail after, at clean-up)
        self.made: os.stat_result | None = None  # the staging folder as this run made it (set on enter)
        self.first_release: str | None = None  # set on enter: when the release --force replaces was first published
        self.first_release_problem = ""  # set on enter: why the replaced release's first_published is not carried over
        self.first_release_sums = b""  # set on enter: the replaced release's SHA256SUMS that listed its manifest
        self.group: CommitGroup | None = None  # set: commit() waits for the group's
        self._abandon: list[Callable[[], object]] = []
        self._lock = None

    def __enter__(self) -> "ReleaseFolder":
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            lock = open_lock(self.out / f".{self.tag}.lock")
        except (FileExistsError, NotADirectoryError):  # --out (or a folder above it) is a file: a bad argument
            raise InputError(f"--out {self.out}: not a folder (a file of that name, or above it, exists)") from None
        except OSError as exc:
            raise UnibakeError(f"cannot use the release folder {self.out}: {exc.strerror}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(lock)
            try:  # only a run making a release on this one (a hotfix, --from, the newest at its epoch) holds it shared
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                reading = True
            except BlockingIOError:
                reading = False
            lock.close()
            if reading:
                raise UnibakeError(f"a hotfix or another release is being made on release {self.final} (pid "
                                   f"{holder}): it needs that release as it is until it ends; wait for it or choose "
                                   "another version") from None
            raise UnibakeError(f"another run is writing release {self.final} (pid {holder}); wait for it or "
                               "choose another version") from None
        except OSError as exc:  # (ENOLCK: a file system that takes no locks; it said "a file: No locks available")
            lock.close()
            raise NoLocks(f"cannot lock {self.out / f'.{self.tag}.lock'} ({exc.strerror}): --out must be on a "
                          "file system that takes locks (flock)") from None
        _sign(lock)
        self._lock = lock
        try:
            self._restore_old()
        except OSError as exc:
            self._unlock()
            raise UnibakeError(f"cannot put back the release {self.final} a killed run set aside: {exc.strerror}") \
                from None
        except RecursionError:  # shutil.rmtree recurses once per level: no release nests folders so deep
            self._unlock()
            raise UnibakeError(f"{self.out / f'.{self.tag}.old'} holds folders nested too deep to remove here (not a "
                               "release a run set aside): remove it (rm -rf), then run again") from None
        if self.final.exists() and not self.force:
            self._unlock()
            refuse_existing(self.final)
        if os.path.islink(self.final):  # replaced, it would be a real folder here and the link's target left as it was
            self._unlock()
            raise InputError(f"release {self.final} is a link (to {os.readlink(self.final)}): the new release would take "
                             "its place as a folder here, not where the link points; give --out the "
                             "folder that holds the release itself, or remove the link first; nothing was replaced")
        self.first_release, self.first_release_problem, self.first_release_sums = self._replaced_first_release()
        try:
            fresh_folder(self.staging, "a release's staging folder")
            self.made = os.lstat(self.staging)
        except UnibakeError:  # (a link, a file, a folder it cannot remove: no run's, left as it is, and said)
            self._unlock()
            raise
        except BaseException:  # an interrupt as it was made: this run's, removed (it was left, empty)
            try:
                remove_tree(self.staging, ignore_errors=True)
            finally:
                self._unlock()
            raise
        return self

    def _replaced_first_release(self) -> tuple[str | None, str, bytes]:
        """When the release this run replaces (``--force``) was first published, or None (this release
        is then its first) with why: there is none (no reason), or its manifest cannot be read, or its
        own ``SHA256SUMS`` does not list that very manifest (a folder changed after it was published:
        a well-formed but forged ``first_published`` would rank this release for ever). With it, the
        bytes of that ``SHA256SUMS``: a signed run carries the time over only when its key signed them
        (:func:`carried_first_release`)."""
        if not self.force or not os.path.lexists(self.final / MANIFEST):
            return None, "", b""
        found = vouched_manifest(self.final)
        if isinstance(found, str):
            return None, found, b""
        manifest, listing = found
        return manifest.first_release, "", listing

    def _restore_old(self) -> None:
        """A replaced release (``--force``) whose replacement never took its place (a run killed
        between the two renames of a commit) goes back: it is the last release that was whole."""
        old = self.out / f".{self.tag}.old"
        if os.path.isdir(old) and not os.path.islink(old) and not os.path.lexists(self.final):
            os.replace(old, self.final)
        if os.path.islink(old) or (os.path.lexists(old) and not os.path.isdir(old)):
            os.unlink(old)  # no release (a link a --force on a linked release left): in the way of the next commit
        remove_tree(old, ignore_errors=True)

    def commit(self, then: Callable[[], object] | None = None,
               abandon: Callable[[], object] | None = None) -> Path:
        """The staged folder takes its final name (a replaced one set aside first, removed after),
        and ``then`` runs (the checksums record), with SIGINT, SIGTERM and SIGHUP held until both are
        done: an interrupt lands before the commit (nothing published, the old release in place) or
        after it (the release published, the tag kept), never between the renames. A folder of a
        :class:`CommitGroup` only joins it here: the group commits all its folders at once.
        ``abandon``: what removes what ``then`` would have put in place (the checksums record's
        temporary file), called on exit when the folder was never published."""
        if abandon is not None:
            self._abandon.append(abandon)
        if self.group is not None:
            self.group.pending.append((self, then))
            return self.final
        with held_signals():
            left = ""
            try:
                self._swap()
                self._published()
                if then is not None:
                    then()
                fsync_dir(self.out)
            finally:
                left = self._let_old_go()
            if left:
                raise UnibakeError(left)
        return self.final

    def _swap(self) -> None:
        """The old release set aside, the staged one in its place; on a failure, the old one back."""
        if self.made is not None and not same_file(self.staging, self.made):
            # (an --out others can write: their folder, put in its place during the build, would be published)
            raise UnibakeError(f"{self.staging} was replaced while this run made it (someone else can write "
                               f"{self.out}): nothing was published; make --out writable by you alone, then run again")
        if self.final.exists():
            os.replace(self.final, self.out / f".{self.tag}.old")
        try:
            os.replace(self.staging, self.final)
        except BaseException:
            self._restore_old()
            raise

    def _unswap(self) -> None:
        """A swap undone: the new release back in staging (removed on exit), the old one in its place."""
        os.replace(self.final, self.staging)
        self._restore_old()

    def _published(self) -> None:
        self.committed = True
        COMMITTED.append(self.final)

    def _let_old_go(self) -> str:
        """The replaced release (set aside) removed once this one is published; what could not be, said."""
        old = self.out / f".{self.tag}.old"
        if self.committed:  # a whole copy of the old release is never left behind
            try:
                remove_tree(old, ignore_errors=True)
            except RecursionError:  # shutil.rmtree recurses once per level: no release nests folders so deep
                return (f"release {self.final} was published, but the release it replaced, set aside as {old}, holds "
                        "folders nested too deep to remove here (not a release's): remove it (rm -rf) before this "
                        "release is made again")
        return ""

    def _unlock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __exit__(self, *exc) -> None:
        if self._lock is None:  # never entered (an enter that failed let go of all it took), or exited already:
            return  # the staging folder is not this run's to remove
        try:
            remove_tree(self.staging, ignore_errors=True)
        except RecursionError:  # the staging folder swapped for a tree nested too deep while the run went on:
            pass  # left (no run's); the next run of this tag names it and says to remove it
        try:
            if not self.committed:
                for abandon in self._abandon:
                    try:
                        abandon()
                    except OSError:
                        pass
        finally:
            self._unlock()


def _holder(lock) -> str:
    """The pids the lock file holds, as said in a message: whoever can write ``--out`` can write
    anything there (bytes that are not UTF-8, gigabytes, a terminal's escape sequences)."""
    text = os.pread(lock.fileno(), 256, 0).decode("ascii", "replace")
    return ", ".join(word for word in text.split() if word.isdigit() and len(word) <= 10) or "another process"


def _sign(lock) -> None:
    """The holder's pid in the lock file, for the message of a run it refuses. Written past Python's
    buffer: on a full disk it is left out (the lock is held all the same, and a run it refuses says
    "another process"), and the stage that needs the space names it; a buffered write failed here as
    "a file: No space left on device", and again when the lock was closed."""
    try:
        os.ftruncate(lock.fileno(), 0)
        os.pwrite(lock.fileno(), f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


def hold_release(out: Path, tag: str):
    """A shared hold on release ``tag``'s lock (``<out>/.<tag>.lock``), for a run that reads that
    release until it ends (a hotfix made on it): a run that would write it (``--force``) is refused
    while it is held, as one writing it refuses this. Returns the open lock file: closing it lets go."""
    path = out / f".{check_tag(tag)}.lock"
    try:
        lock = open_lock(path)
    except PermissionError:  # another user's release (its lock file theirs): read, as flock needs no write
        try:
            lock = open_lock(path, create=False, write=False)
        except OSError as exc:
            raise UnibakeError(f"cannot lock the release {out / tag}: {exc.strerror}") from None
    except OSError as exc:
        raise UnibakeError(f"cannot lock the release {out / tag}: {exc.strerror}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(lock)
        lock.close()
        raise UnibakeError(f"another run is writing release {out / tag} (pid {holder}); wait for it, then make "
                           "the hotfix") from None
    except OSError as exc:  # (ENOLCK: a file system that takes no locks)
        lock.close()
        raise NoLocks(f"cannot lock {path} ({exc.strerror}): the release folder must be on a file system that takes "
                      "locks (flock)") from None
    if lock.writable():
        _sign(lock)
    return lock


def release_locks(out: Path, name: str) -> list[tuple[Path, str]]:
    """The locks (``<folder>/.<name>.lock``) of the release folder ``out/name``: its own and, for a link
    to a release folder elsewhere (``1.0 -> /mnt/big/1.0``), that folder's too, the one a run with
    that --out holds (a hotfix made on it, a --force run writing it)."""
    locks = [(out, name)]
    if os.path.islink(out / name):
        real = Path(os.path.realpath(out / name))
        if real == Path(os.path.realpath(out), name):  # a link that loops back to itself: its own lock, once
            return locks
        try:
            check_tag(real.name)
        except InputError:
            return locks  # a folder no run can write (not a release's name): nothing to hold it against
        locks.append((real.parent, real.name))
    return locks


def lock_release(out: Path, name: str, *, create: bool = True):
    """The lock of the release folder ``name`` under ``out`` held exclusively, as a run writing that
    release holds it, without waiting (prune, while it removes the release's image). Returns the open
    lock file (closing it lets go), or None when there is no lock file and ``create`` is False or it
    cannot be made (no run holds it). Raises UnibakeError naming the holder when another run holds
    it: one writing the release, or a hotfix made on it."""
    path = out / f".{name}.lock"  # the folder's own name, whatever it is: one entry of out
    lock = None
    if create:
        try:
            lock = open_lock(path)
        except OSError:  # a folder this user cannot write: a lock file there is still read (flock needs no write)
            pass
    try:
        lock = lock if lock is not None else open_lock(path, create=False, write=False)
    except FileNotFoundError:
        return None  # nobody ever locked it
    except OSError as exc:
        raise UnibakeError(f"cannot lock the release {out / name}: {exc.strerror}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(lock)
        lock.close()
        raise UnibakeError(f"a run is using release {out / name} (pid {holder})") from None
    except OSError as exc:
        lock.close()
        raise NoLocks(f"cannot lock {path} ({exc.strerror}): the release folder must be on a file system that "
                      "takes locks (flock)") from None
    if lock.writable():  # a run it refuses meanwhile names this one
        _sign(lock)
    return lock


class CommitGroup:
    """Release folders published together (one per platform of a build): each written whole in its
    staging folder first, then all renamed in one short block with SIGINT, SIGTERM and SIGHUP held;
    a rename that fails puts back every folder already renamed (and the releases they replaced).
    All of them are published, or none; the ``then`` of each (its checksums record) runs after."""

    def __init__(self) -> None:
        self.pending: list[tuple[ReleaseFolder, Callable[[], object] | None]] = []
        # each folder's checksums folder, and the check of its record made again as they commit (publish)
        self.checks: list[tuple[Path, Callable[[], object] | None]] = []

    def commit(self) -> list[Path]:
        with records_locked(folder for folder, _ in self.checks):
            for _, check in self.checks:  # (a refusal: nothing renamed; each temporary record goes with its folder)
                if check is not None:
                    check()
            return self._commit()

    def _commit(self) -> list[Path]:
        with held_signals():
            swapped: list[ReleaseFolder] = []
            try:
                for folder, _ in self.pending:
                    folder._swap()
                    swapped.append(folder)
            except BaseException as exc:
                stuck = []
                for folder in reversed(swapped):
                    try:
                        folder._unswap()
                    except OSError as err:  # what cannot go back is published: the error line names it
                        folder._published()
                        stuck.append(f"{folder.final} ({err.strerror or err})")
                if stuck and isinstance(exc, OSError):
                    raise UnibakeError(f"cannot publish {exc.filename or 'a release folder'} ({exc.strerror or exc}); "
                                       f"{' and '.join(stuck)} took its place and could not be put back, so it is "
                                       "published without the rest of its group (check it: python build.py verify "
                                       f"{stuck[0].rsplit(' (', 1)[0]})") from None
                raise
            failed: list[str] = []
            try:
                for folder in swapped:
                    folder._published()
                for folder, then in self.pending:  # every record tried: one that fails stops no other
                    if then is not None:
                        try:
                            then()
                        except (OSError, UnibakeError) as exc:
                            failed.append(str(exc) if isinstance(exc, UnibakeError) else
                                          f"{folder.tag}'s checksums record: {exc.strerror or exc}")
                for out in dict.fromkeys(folder.out for folder in swapped):
                    fsync_dir(out)
            finally:
                for folder in swapped:
                    left = folder._let_old_go()
                    if left:
                        failed.append(left)
            if failed:
                raise UnibakeError("; ".join(failed))
        return [folder.final for folder, _ in self.pending]


@dataclass(frozen=True, kw_only=True)
class PublishedRelease:
    """A release folder found on disk, with its manifest parsed (or why it could not be)."""

    folder: Path
    manifest: ReleaseManifest | None
    problem: str = ""
    # set when the folder's SHA256SUMS does not list that very manifest (or cannot be read): the folder was
    # changed after it was published, and a well-formed but forged ``first_published`` would rank it the
    # newest release for ever (the one the next release follows, the one prune keeps in place of a real one)
    unvouched: str = ""


def find_releases(out: Path) -> list[PublishedRelease]:
    """Every folder under ``out`` with a manifest.json, oldest first (by when each was first published);
    unreadable ones last, with why.
    A link to a folder elsewhere (``1.0 -> /mnt/big/1.0``) is a release too (listed, and its image
    kept by prune; nothing is ever removed through it); one to a folder already listed (``latest ->
    1.3.1``) is not listed twice."""
    good, bad = [], []
    if not out.is_dir():
        return []
    entries, hidden = [], []
    for e in sorted(out.iterdir()):
        if e.name.startswith("."):
            continue
        try:
            if e.is_dir():
                entries.append(e)
        except PermissionError:  # a link into a folder this user cannot enter (Path.is_dir raises it): said below
            hidden.append(e)
    for e in hidden:  # as a folder this user cannot enter: never taken as no release (prune)
        if set(e.name) <= TAG_CHARS and not e.name.startswith("-"):
            bad.append(PublishedRelease(folder=e, manifest=None, problem=f"{e}: cannot read it (Permission denied)"))
    seen = {os.path.realpath(e) for e in entries if not e.is_symlink()}
    for folder in entries:
        if folder.is_symlink():
            target = os.path.realpath(folder)
            if target in seen:
                continue
            seen.add(target)
        try:
            os.lstat(folder / MANIFEST)
        except PermissionError:  # a folder this user cannot enter may be a release: never taken as none (prune)
            if not set(folder.name) <= TAG_CHARS or folder.name.startswith("-"):
                continue  # no release is named so (a disk's lost+found, private to root): not one
            bad.append(PublishedRelease(folder=folder, manifest=None,
                                        problem=f"{folder}: cannot read it (Permission denied)"))
            continue
        except OSError:
            continue
        try:
            manifest, data = read_manifest(folder)
            good.append(PublishedRelease(folder=folder, manifest=manifest, unvouched=_unvouched(folder, data)))
        except VerificationError as exc:
            bad.append(PublishedRelease(folder=folder, manifest=None, problem=str(exc)))
    good.sort(key=lambda r: r.manifest.first_release)  # a --force re-release keeps its place
    return good + bad


def vouched_manifest(folder: Path) -> tuple[ReleaseManifest, bytes] | str:
    """``folder``'s manifest and the bytes of its ``SHA256SUMS``, when those list that very manifest; else why
    not: it cannot be read, or the folder was changed after it was published (a well-formed but forged
    ``first_published`` would rank it as the newest release for ever: the one the next release follows, the one
    prune keeps in place of a real one)."""
    try:
        manifest, data = read_manifest(folder)
        listing = _vouching_sums(folder, data)
    except UnibakeError as exc:
        return str(exc)
    return manifest, listing


def _unvouched(folder: Path, manifest: bytes) -> str:
    """Why ``folder``'s ``SHA256SUMS`` does not vouch for the ``manifest`` bytes read from it; "" when it does."""
    try:
        _vouching_sums(folder, manifest)
    except UnibakeError as exc:
        return str(exc)
    return ""


def _vouching_sums(folder: Path, manifest: bytes) -> bytes:
    """The bytes of ``folder``'s ``SHA256SUMS``, which list the ``manifest`` bytes read from it as they are;
    VerificationError saying what is wrong otherwise."""
    sums = folder / SUMS
    listing = read_small_file(sums, VerificationError, limit=SUMS_LIMIT, follow=False)
    listed = {e.name: e.sha256 for e in parse_sums(decode_text(listing, sums, VerificationError), str(sums),
                                                   VerificationError)}
    if listed.get(MANIFEST) != hashlib.sha256(manifest).hexdigest():
        raise VerificationError((f"{sums} does not list {MANIFEST} as it is" if MANIFEST in listed
                                 else f"{sums} does not list {MANIFEST}")
                                + " (the folder was changed after it was published)")
    return listing


def previous_release(out: Path, product: str, tag: str, metadata: ImageMetadata | None = None,
                     first_release: str | None = None) -> ReleaseManifest | None:
    """The release under ``out`` this one follows: the newest of the same product (another tag) and,
    for an image unibake built, the same platform that holds its default profile, so the notes'
    roll-back (``IMAGE=previous ./run.sh DEFAULT``) runs; one of exactly the same profiles is
    preferred (``1.3.2-tp4`` follows ``1.3.1-tp4``, not the unified ``1.3.1``). None: the first.
    ``first_release``: when the release a --force run replaces was first published
    (:attr:`ReleaseFolder.first_release`); it keeps its place, following one first released before it
    (1.0 made again after 2.0 follows 0.9, not 2.0)."""
    # (a folder whose SHA256SUMS does not vouch for its manifest is none: its date may be forged)
    candidates = [r.manifest for r in find_releases(out)
                  if r.manifest is not None and r.manifest.product == product and r.manifest.release != tag
                  and (first_release is None or r.manifest.first_release < first_release)
                  and not r.unvouched]
    if metadata is not None:
        candidates = [m for m in candidates if m.platform == metadata.platform
                      and metadata.default_profile in m.profiles]
        same = [m for m in candidates if set(m.profiles) == set(metadata.profiles)]
        candidates = same or candidates
    return candidates[-1] if candidates else None


def runs_alike(previous: ReleaseManifest | None, manifest: ReleaseManifest) -> bool:
    """Whether this release's ``run.sh`` starts ``previous``'s image of the default profile as that release's own
    would: the same GPUs, vendor, devices and nodes, the same port, model name and mounts. Otherwise the roll-back
    (``IMAGE=previous ./run.sh``) gave the old image the new layout: 8 NVIDIA GPUs for an AMD image of 4, its
    weights mounted where the old engine does not look."""
    name = manifest.default_profile
    if previous is None or name not in manifest.profiles or name not in previous.profiles:
        return False
    new, old = manifest.profiles[name], previous.profiles[name]
    return (old.gpus, old.vendor, old.devices, old.topology, previous.launch) == \
        (new.gpus, new.vendor, new.devices, new.topology, manifest.launch)


def changes(previous: ReleaseManifest | None, manifest: ReleaseManifest) -> list[dict]:
    """Components that differ from the previous release, by kind, profile and name (overlays and env
    files by their names, never by position): added, removed or changed."""
    if previous is None:
        return []
    # a profile the previous release had and this one leaves out was not removed: this is another
    # selection of the same product (``--profile tp4`` after the unified image)
    kept = set(manifest.profiles)
    before = {(c.kind, c.profile, c.name): c for c in previous.components
              if not c.profile or not manifest.profiles or c.profile in kept}
    after = {(c.kind, c.profile, c.name): c for c in manifest.components}
    out = []
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        if b and a and (b.version, b.digest) == (a.version, a.digest):
            continue
        out.append({"kind": k[0], "profile": k[1], "name": k[2],
                    "before": f"{b.version} {b.digest[:12]}".strip() if b else "",
                    "after": f"{a.version} {a.digest[:12]}".strip() if a else ""})
    return out


def env_changes(previous: ReleaseManifest | None, manifest: ReleaseManifest) -> list[dict]:
    """Per profile of this release: the env's count and fingerprint before and after, and every key
    added, removed or changed (``recorded`` is False when the previous release kept no env: a manifest
    written before envs were recorded has no ``env`` field; an empty env a release recorded is an env;
    ``new``: the previous release had no such profile)."""
    if previous is None:
        return []
    out = []
    for name, p in manifest.profiles.items():
        old = previous.profiles.get(name)
        before = old.env if old is not None else {}
        recorded = old is not None and (bool(old.env) or "env" in old.model_fields_set)
        keys = [{"key": k, "before": before.get(k), "after": p.env.get(k)}
                for k in sorted(set(before) | set(p.env)) if before.get(k) != p.env.get(k)]
        out.append({"profile": name, "count": p.env_count, "sha256": p.env_sha256, "recorded": recorded,
                    "new": old is None,
                    "count_before": len(before), "sha256_before": old.env_sha256 if old is not None else "",
                    "keys": keys if recorded else []})
    return out


def _text(value: str, limit: int) -> str:
    """A label's value as a manifest field: control characters (C0, DEL, C1) and characters that hide or reorder
    what is around them (``\\u202e``: the notes show the field) replaced, cut to ``limit``."""
    from .console import replaced

    return replaced(value)[:limit]


def build_manifest(*, product: str, tag: str, image_ref: str, archive: Archive, digests: ReadBack,
                   metadata: ImageMetadata | None, labels: dict[str, str], previous: ReleaseManifest | None,
                   hotfix: ReleaseManifest | None = None, image_size: int = 0, notes: Notes | None = None,
                   attachments: dict[str, bytes] | None = None,
                   supply_chain: SupplyChain | None = None, first_release: str | None = None) -> ReleaseManifest:
    """``manifest.json`` of a release: the archive as written and read back, and what the image is.
    The labels of an image unibake did not build come from its builder: kept as they are in
    ``labels``, cleaned where they become fields of their own. ``first_release``: when the release this
    one replaces (``--force``) was first published (:attr:`ReleaseFolder.first_release`), kept as its own."""
    try:
        return _manifest(product=product, tag=tag, image_ref=image_ref, archive=archive, digests=digests,
                         metadata=metadata, labels=labels, previous=previous, hotfix=hotfix, image_size=image_size,
                         notes=notes, attachments=attachments, supply_chain=supply_chain,
                         first_release=first_release)
    except ValidationError as exc:
        raise VerificationError(f"cannot describe the release of {image_ref}: {first_error(exc)}") from None


def _manifest(*, product, tag, image_ref, archive, digests, metadata, labels, previous, hotfix,
              image_size, notes, attachments, supply_chain, first_release) -> ReleaseManifest:
    epoch = labels.get("io.unibake.source-date-epoch", "")
    published = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ReleaseManifest(
        schema_version=SCHEMA_VERSION,
        tool=Tool(name="unibake", version=__version__),
        product=product, release=tag,
        version=_text(labels.get("org.opencontainers.image.version", tag), 128),
        tag=image_ref, image_id=archive.image.image_id, image_size=image_size,
        diff_ids=archive.image.diff_ids, save_layout=archive.image.layout,
        default_profile=metadata.default_profile if metadata else None,
        profiles=dict(sorted(metadata.profiles.items())) if metadata else {},
        launch=metadata.launch if metadata else None,
        components=metadata.components if metadata else (),
        archive=ArchiveRecord(
            name=archive.name,
            files=tuple(ArchiveFile(name=f.name, bytes=f.bytes, sha256=digests.file_sha256[f.name])
                        for f in archive.files),
            bytes=archive.compressed_bytes, sha256=digests.compressed_sha256,
            uncompressed_bytes=archive.uncompressed_bytes, uncompressed_sha256=digests.uncompressed_sha256,
            compression=Compression(algorithm="zstd", level=archive.level, long_distance=archive.long_distance)),
        labels=dict(sorted(labels.items())),
        revision=_text(labels.get("org.opencontainers.image.revision", ""), 256),
        created=_text(labels.get("org.opencontainers.image.created", ""), 64),
        source_date_epoch=int(epoch) if epoch.isdigit() and epoch.isascii() and len(epoch) < 12 else None,
        # (a replaced release whose machine's clock ran ahead is no earlier first release than now)
        published=published, first_published=min(first_release or published, published),
        previous=previous.release if previous else None,
        platform=recorded_by(archive.image.config) or None,
        hotfix=None if hotfix is None else HotfixRecord(
            base_release=hotfix.release, base_tag=hotfix.tag, base_image_id=hotfix.image_id,
            base_archive_bytes=hotfix.archive.bytes, omitted_diff_ids=archive.omitted,
            shipped_diff_ids=archive.shipped),
        attachments=tuple(AttachmentRecord(name=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
                          for name, data in (attachments or {}).items()),
        external=tuple(ExternalRecord(name=e.name, bytes=e.bytes, sha256=e.sha256)
                       for e in (notes.external if notes else ())),
        supply_chain=supply_chain)


def render_files(manifest: ReleaseManifest, validation: Validation, previous: ReleaseManifest | None,
                 notes: Notes | None = None, kit_images: tuple[dict[str, str], ...] = ()) -> dict[str, str]:
    """The text files of a release folder, by name (the archive, attachments and SHA256SUMS aside).
    ``kit_images``: the images the kit's rebuild needs (``supply.kit_images``), named in the notes."""
    m = manifest.model_dump(mode="json", by_alias=True)
    v = validation.document()
    p = previous.model_dump(mode="json", by_alias=True) if previous else None
    values = dict(m=m, v=v, previous=p, changes=changes(previous, manifest), env=env_changes(previous, manifest),
                  runs_alike=runs_alike(previous, manifest),
                  kit_images=kit_images,
                  notes=notes or Notes(), env_of={name: {"count": x.env_count, "sha256": x.env_sha256}
                                                  for name, x in manifest.profiles.items()},
                  extra_devices={name: x.extra_devices for name, x in manifest.profiles.items()})
    files = {
        MANIFEST: manifest.to_json(),
        VALIDATION: validation.to_json(),
        "RELEASE_NOTES.md": render_template("RELEASE_NOTES.md.j2", **values),
        "IMAGE_ID": manifest.image_id + "\n",
    }
    if manifest.profiles:  # an image built elsewhere has no profiles to start
        files["run.sh"] = render_template("run.sh.j2", **values)
    if manifest.hotfix:
        files["apply.sh"] = render_template("apply.sh.j2", **values)
    files["README-DIST.md"] = render_template("README-DIST.md.j2", **values)
    return files


def record_temp(record: Path, folder: Path) -> Path:
    """The temporary name of the checksums record ``record`` (``checksums/<tag>.SHA256SUMS``) of the
    release folder ``folder``, private to the run holding that folder's lock: every --out of one
    parent shares checksums/, so two runs of one version under two of them (each holding its own
    lock) would otherwise write one temporary file, and one commit rename the other's listing. The
    same release folder's next run takes the same name (what a killed run left is replaced)."""
    where = os.path.join(os.path.realpath(folder.parent), folder.name)  # the lock is <parent>/.<name>.lock
    key = hashlib.sha256(os.fsencode(where)).hexdigest()[:16]
    return record.parent / f".{record.name}.{key}.tmp"


def publish(folder: ReleaseFolder, archive: Archive, digests: ReadBack, files: dict[str, str | bytes],
            checksums_dir: Path, extra: Mapping[str, str] | None = None,
            sign: Callable[[Path, bytes], object] | None = None,
            check_record: Callable[[Path], object] | None = None) -> Path:
    """Write the text files and attachments, then SHA256SUMS (last) and its signatures, and the
    checksums/ record under a temporary name; only then give the folder its final name: nothing is
    committed until everything that can fail (a full disk, a read-only folder, a signature) has run.

    ``extra``: files earlier stages wrote into the staging folder (name -> sha256), listed too;
    ``sign``: called on SHA256SUMS once written (its path and bytes), so that its signatures exist before the commit.
    ``check_record``: called on the checksums record's path just before the commit, under a lock on the records'
    folder (``checksums/`` itself), which is held until the record is in place: every --out of one parent
    shares the record, and two products' runs of one version (each holding its own --out's lock) both passed the
    check made before their builds, the later commit replacing the other's record without a word."""
    sums = {f.name: digests.file_sha256[f.name] for f in archive.files}
    sums.update(extra or {})
    final_record = checksums_dir / f"{folder.tag}.{SUMS}"
    record = record_temp(final_record, folder.final)
    try:
        for name, text in files.items():
            sums[name] = write_atomic(folder.staging, name, text, mode=0o755 if name.endswith(".sh") else 0o644)
        listing = render_sums(sums)
        write_atomic(folder.staging, SUMS, listing)
        if sign is not None:
            sign(folder.staging / SUMS, listing.encode("utf-8"))  # (the bytes written, not the file by name)
        fsync_dir(folder.staging)
        checksums_dir.mkdir(parents=True, exist_ok=True)
        with open_new(record) as fh:  # checksums/ may be others' to write: a link planted there is not followed
            fh.write(listing.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())  # complete before it takes its name: a power cut after leaves no empty record
    except OSError as exc:
        try:
            record.unlink(missing_ok=True)
        except OSError:
            pass  # never made: its folder could not be
        where = exc.filename or folder.staging
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(f"no space left in {where} while writing release {folder.tag}; nothing was "
                           "published") from None
        raise UnibakeError(f"cannot write {where} ({exc.strerror}); nothing was published") from None

    def put_in_place() -> None:
        try:
            os.replace(record, final_record)
        except OSError as exc:
            try:
                record.unlink(missing_ok=True)  # never left under checksums/
            except OSError:
                pass
            raise UnibakeError(f"release {folder.final} was published, but its checksums record {final_record} "
                               f"was not written ({exc.strerror}): copy its {SUMS} there") from None
        try:
            fsync_dir(checksums_dir)  # the rename itself kept, as the release folder's is
        except OSError:
            pass  # the record is in place; only its durability across a power cut is not certain

    check = (lambda: check_record(final_record)) if check_record is not None else None
    if folder.group is not None:  # checked as the group commits, under the lock, with the other platforms'
        folder.group.checks.append((checksums_dir, check))
        return folder.commit(then=put_in_place, abandon=lambda: record.unlink(missing_ok=True))
    with records_locked([checksums_dir]):
        if check is not None:
            try:
                check()
            except BaseException:
                record.unlink(missing_ok=True)
                raise
        return folder.commit(then=put_in_place, abandon=lambda: record.unlink(missing_ok=True))


@contextmanager
def records_locked(folders: Iterable[Path]) -> Iterator[None]:
    """Each checksums folder locked (``flock`` on the folder itself: no lock file beside the records) while a
    release's record is checked and put in place. A folder that cannot be locked so (NFS refuses a lock on a
    folder opened to read; one this user cannot read) is used unlocked, as before: the check still runs."""
    held: list[int] = []
    try:
        # once each folder, however spelled: a second flock on another open of one folder waits on the first for ever
        for folder in {os.path.realpath(f): f for f in folders}.values():
            try:
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # (held for a commit's renames: moments)
            except OSError:
                os.close(fd)
                continue
            held.append(fd)
        yield
    finally:
        for fd in held:
            os.close(fd)
