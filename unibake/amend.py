"""Changing a published release folder after the fact (``build.py push`` records where the image
went), without ever showing a half-changed folder.

The new folder is made beside the old one (``<out>/.<tag>.amend/``): every unchanged file hard-linked
(the archive is never copied), the changed texts written and fsynced, ``SHA256SUMS`` last; then the
two folders are exchanged in one ``renameat2(RENAME_EXCHANGE)``, so a reader sees the old folder or
the new one, never a mix; an interrupted run leaves the old folder as it was. Where the file system
cannot exchange, the new files are renamed into the folder one by one, ``SHA256SUMS`` last. The
release's lock (``<out>/.<tag>.lock``, the one publishing takes) keeps two runs apart.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from .errors import InputError, NoLocks, UnibakeError, VerificationError
from .files import fresh_folder, fsync_dir, open_lock, read_small_file, remove_tree, same_file, write_atomic
from .manifest import MANIFEST, ReleaseManifest, load_manifest
from .publish import SUMS, SUMS_LIMIT, _holder, _sign, held_signals, record_temp
from .signing import ASC, MINISIG
from .sums import render_sums
from .templates import render_template

MARKER = "<!-- unibake: registry -->"
SUMS_SIGNATURES = (SUMS + ASC, SUMS + MINISIG)  # a release's signatures, of its SHA256SUMS
NOTES = ("RELEASE_NOTES.md", "README-DIST.md")
NOTES_LIMIT = 16 << 20  # a release's notes are kilobytes
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def registry_section(manifest: ReleaseManifest, name: str) -> str:
    """The notes' registry section (from ``MARKER`` to the end), as the templates render it."""
    return render_template("registry.md.j2", m=manifest.model_dump(mode="json", by_alias=True), file=name)


def splice(text: str, section: str, *, has_section: bool) -> str:
    """``text`` with its registry section replaced by ``section``. ``has_section``: the release already
    records a push, so ``text`` ends with the section unibake wrote. Only that last ``MARKER`` is ours:
    a changelog may quote the marker, and it always comes before the section; a text without a
    section is kept whole, whatever markers people wrote in it."""
    head = text.rsplit(MARKER, 1)[0] if has_section else text
    head = head.rstrip("\n")
    return f"{head}\n\n{section}" if section else head + "\n"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically; False when this system or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(a))


def _keep_access(path: Path, like: os.stat_result) -> None:
    """``path`` gets ``like``'s mode and group, and its owner where this user may give it: an amended
    release keeps the access its owner gave the folder and each file."""
    try:  # before the chmod: a chown clears the set-ID bits
        os.chown(path, like.st_uid, like.st_gid, follow_symlinks=False)
    except PermissionError:
        try:
            os.chown(path, -1, like.st_gid, follow_symlinks=False)
        except PermissionError:
            pass  # a group this user is not in: the group stays this user's own
    # (through a descriptor opened without following a link: a staging folder someone else can write (a shared --out)
    # could hold a link planted there, and a chmod by name gave the file it names the release file's mode)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fchmod(fd, stat.S_IMODE(like.st_mode))
    finally:
        os.close(fd)


def _old_stat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


class _Lock:
    def __init__(self, out: Path, tag: str, *, optional: bool = False):
        self.path = out / f".{tag}.lock"
        self.optional = optional  # a link's folder this user cannot write: its lock read if it is there

    def __enter__(self) -> "_Lock":
        try:
            self.fh = open_lock(self.path)
        except PermissionError:
            if not self.optional:
                raise
            try:  # flock needs no write; no lock file there: no run ever held it
                self.fh = open_lock(self.path, create=False, write=False)
            except FileNotFoundError:
                self.fh = None
                return self
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:  # only a run making a release on this one (a hotfix, --from, the newest at its epoch) holds it shared
                fcntl.flock(self.fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                what = "a hotfix or another release is being made on the release"
            except BlockingIOError:
                what = "another run is writing the release"
            holder = _holder(self.fh)
            self.fh.close()
            raise UnibakeError(f"{what} beside {self.path} (pid {holder}); wait for it and run again") from None
        except OSError as exc:  # (ENOLCK: a file system that takes no locks)
            self.fh.close()
            raise NoLocks(f"cannot lock {self.path} ({exc.strerror}): the release folder must be on a file "
                          "system that takes locks (flock)") from None
        if self.fh.writable():  # a run refused meanwhile names this one, not the last that wrote the release
            _sign(self.fh)
        return self

    def __exit__(self, *exc) -> None:
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()


def check_keepable(folder: Path) -> None:
    """The new folder takes over the old one's files (hard links); a folder or symbolic link put in
    the release folder (an unpacked kit, say) would go with the old folder: refused, before anything.
    So are notes that cannot be read as text to splice the registry section in (not UTF-8, huge)."""
    other = sorted(f"{e.name}/" if e.is_dir(follow_symlinks=False) else e.name
                   for e in os.scandir(folder) if not e.is_file(follow_symlinks=False))
    if other:
        raise InputError(f"{folder} holds {', '.join(other)[:300]}, which is not a file: recording the push would "
                         "drop it; move it out of the release folder and push again")
    for name in NOTES:
        if os.path.lexists(folder / name):
            _read_notes(folder / name)


def _read_notes(path: Path, listed: str | None = None) -> str:
    """A release's notes as text, which recording a push rewrites; InputError naming the file otherwise, and
    VerificationError when they are not the bytes ``listed`` (if given) (their sha256 in the folder's checked ``SHA256SUMS``):
    the new ``SHA256SUMS``, signed again by the publisher's key, would vouch for notes nobody checked."""
    what = "recording the push rewrites its registry section: fix it, then push again"
    data = read_small_file(path, InputError, limit=NOTES_LIMIT, follow=False, what=what)
    if listed is not None and hashlib.sha256(data).hexdigest() != listed:
        raise VerificationError(f"{path} is not the file {SUMS} lists (it changed after the release was checked): "
                                f"nothing was recorded, so the new {SUMS} vouches for no file that was not checked; "
                                "put back the published file, then push again (the blobs are in the registry: "
                                "nothing is uploaded again)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); {what}") from None


def _is_record_of(record: Path, listing: bytes) -> tuple[bool, str]:
    """Whether the checksums record ``record`` is the folder's own (holds ``listing``, its old
    ``SHA256SUMS``), read no further than that; with what it is instead when no run writes such a
    file (a link, a FIFO, a folder, more than a listing holds), which is said. Another file there is not
    ours, unsaid: another --out's release of the same tag shares the name."""
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, ""
    except OSError as exc:
        return False, "is a link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return False, "is not a regular file"
        if info.st_size > SUMS_LIMIT:
            return False, f"holds {info.st_size} bytes, more than a checksums record ({SUMS_LIMIT})"
        try:
            return fh.read(len(listing) + 1) == listing, ""
        except OSError as exc:
            return False, f"cannot be read ({exc.strerror})"


def amend_release(folder: Path, manifest: ReleaseManifest, sums: dict[str, str], checksums_dir: Path,
                  sign: Callable[[Path, bytes], dict[str, str]] | None = None, *, was: ReleaseManifest | None = None,
                  named: Path | None = None, on_warning: Callable[[str], None] = lambda line: None) -> None:
    """Replace ``manifest.json`` and the notes' registry section of the published ``folder``, then
    ``SHA256SUMS`` (and ``checksums/<tag>.SHA256SUMS`` when it is the folder's record); ``sums`` is the
    folder's current ``SHA256SUMS``, already checked. ``sign``: writes the new ``SHA256SUMS``'s detached
    signatures beside it (in the staging folder, so they replace the old ones with it). ``was``: the
    manifest ``manifest`` was made from; a folder whose manifest is no longer that one (another push
    recorded itself meanwhile) is left as it is, an error, rather than losing what that one wrote.
    ``named``: the link the folder was given as (``release/1.0 -> /mnt/big/1.0``): its lock is held
    too (the one a build or a hotfix of that release takes), and its record is ``checksums_dir``'s
    ``<its name>.SHA256SUMS`` (the one beside the folder's own parent updated too, when it is ours).
    ``on_warning``: told of a record that is no file a run writes (a link, a FIFO, one of megabytes)."""
    out, tag = folder.parent, folder.name
    check_keepable(folder)
    old_listing = read_small_file(folder / SUMS, UnibakeError, limit=SUMS_LIMIT, follow=False)
    with contextlib.ExitStack() as locks:
        if named is not None and named != folder:
            locks.enter_context(_Lock(named.parent, named.name, optional=True))
        locks.enter_context(_Lock(out, tag))
        if was is not None and load_manifest(folder) != was:
            raise UnibakeError(f"{folder} changed while this push ran (another push recorded itself in it): nothing "
                               "was recorded, so as not to drop what that one wrote; push again (the blobs are in "
                               "the registry: nothing is uploaded again)")
        texts = {MANIFEST: manifest.to_json()}
        has_section = bool(load_manifest(folder).registry)  # the notes end with a registry section iff it records one
        for name in NOTES:  # read under the locks, as they are when the new SHA256SUMS lists them
            path = folder / name
            if path.is_file() and name in sums:
                texts[name] = splice(_read_notes(path, sums[name]), registry_section(manifest, name),
                                     has_section=has_section)
        staging = out / f".{tag}.amend"
        # private while it is made; the folder's own mode and group at the end
        fresh_folder(staging, "a push's copy of a release", mode=0o700)
        made = os.lstat(staging)
        try:
            new_sums = dict(sums)
            old_signatures = []  # the old SHA256SUMS's: each kind signed again goes with the new one, any other is stale
            for entry in os.scandir(folder):
                if entry.name in SUMS_SIGNATURES:
                    old_signatures.append(entry.name)
                elif entry.name not in texts and entry.name != SUMS and entry.is_file(follow_symlinks=False):
                    os.link(entry.path, staging / entry.name)
            for name, text in texts.items():
                new_sums[name] = write_atomic(staging, name, text)
            listing = render_sums(new_sums)
            write_atomic(staging, SUMS, listing)
            signatures = list(sign(staging / SUMS, listing.encode("utf-8"))) if sign is not None else []
            stale = sorted(set(old_signatures) - set(signatures))
            for name in stale:  # (before: linked into the new folder, a signature that no longer matched, unsaid)
                on_warning(f"{folder / name} signed the old {SUMS}, and no key of its kind signed the new one: it is "
                           "left out of the release folder (sign the release again with that key to have one)")
            for name in [*texts, SUMS, *signatures]:  # each new file as the one it replaces
                old = _old_stat(folder / name)
                if old is not None:
                    _keep_access(staging / name, old)
            _keep_access(staging, folder.stat())
            fsync_dir(staging)
            if not same_file(staging, made):  # (--out writable by others: their folder would take the release's place)
                raise UnibakeError(f"{staging} was replaced while this push made it (someone else can write {out}): "
                                   "nothing was recorded; make --out writable by you alone, then push again")
            # an interrupt lands before the folder changes or once it and its checksums records are all new:
            # the renames one by one would leave manifest.json new and SHA256SUMS old, and a record left old
            # is never updated by a later push (the folder records the push already)
            locks.enter_context(held_signals())  # let go first, before the locks
            if _exchange(staging, folder):
                fsync_dir(out)
            else:  # one file at a time, SHA256SUMS last
                for name in [*texts, SUMS, *signatures]:
                    os.replace(staging / name, folder / name)
                for name in stale:
                    (folder / name).unlink(missing_ok=True)
                fsync_dir(folder)
        finally:
            remove_tree(staging, ignore_errors=True)
        # still under the locks: a build --force committing meanwhile would have its record overwritten
        records = {checksums_dir / f"{tag}.{SUMS}": folder}  # each record, and the folder whose lock guards it
        if named is not None and named != folder:
            records = {checksums_dir / f"{named.name}.{SUMS}": named,
                       out.parent / "checksums" / f"{tag}.{SUMS}": folder}
        for record, of in records.items():
            is_ours, problem = _is_record_of(record, old_listing)
            if problem:
                on_warning(f"{record} {problem}: it is not release {tag}'s checksums record, so it is left as it "
                           f"is (the folder's new {SUMS} is {folder / SUMS}); remove it, or copy that file there")
            if is_ours:
                old = record.stat()
                try:
                    write_atomic(record.parent, record.name, listing, mode=stat.S_IMODE(old.st_mode),
                                 temp=record_temp(record, of).name)
                except OSError as exc:  # the folder records the push: a later push leaves this record as it is
                    raise UnibakeError(f"the push was recorded in {folder}, but its checksums record {record} was "
                                       f"not updated ({exc.strerror or exc}): copy {folder / SUMS} there") from None
                _keep_access(record, old)
