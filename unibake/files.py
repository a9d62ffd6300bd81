"""Small files, read and written safely: only regular files are read (never a FIFO, a device or a
huge file), and a file only ever appears under its name complete and fsynced."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

from .errors import InputError, UnibakeError


def resolved(path: Path) -> Path:
    """``path.resolve()``; a loop of symbolic links on its way (``release -> release``) is InputError
    naming it, not pathlib's RuntimeError (a traceback)."""
    try:
        return path.resolve()
    except RuntimeError:
        raise InputError(f"{path}: a loop of symbolic links (a link that leads back to itself); give a folder") \
            from None


def visible_name(name: str) -> str:
    """A name the file system or a tar gave, as text every file and JSON reader takes: a byte that
    is not UTF-8 (held by Python as a lone surrogate) written as ``\\xff``; another lone surrogate
    (one a JSON ``\\ud800`` gave, no byte of a name) as ``\\ud800``; others unchanged."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        pass
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def open_lock(path: Path, *, create: bool = True, write: bool = True):
    """A release's lock file (``<out>/.<tag>.lock``), opened for ``flock``: never through a symlink,
    and only a regular file. Whoever can write ``--out`` could plant ``.1.0.lock`` as a link to a
    file of the releasing user's (often root's): a run writes its pid into its lock file. Raises
    FileNotFoundError when ``create`` is False and there is none; UnibakeError naming it when it is
    not a regular file."""
    flags = (os.O_RDWR if write else os.O_RDONLY) | (os.O_CREAT if create else 0) | os.O_NOFOLLOW | os.O_CLOEXEC | \
        os.O_NONBLOCK  # a FIFO opened to read would wait for a writer
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        fd = None
    if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
        return os.fdopen(fd, "r+" if write else "r")
    if fd is not None:
        os.close(fd)
    raise UnibakeError(f"{path} is not a regular file (a symlink, a folder or a FIFO): a release's lock file is "
                       "never followed; remove it, then run again")


def read_small_file(path: Path, error: type[UnibakeError], *, limit: int, what: str = "",
                    follow: bool = True, shown: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``error`` (naming ``path``, or ``shown``) otherwise.

    ``follow=False`` refuses a symlink as the last component.
    """
    suffix = f"; {what}" if what else ""
    named = shown or path  # (the name the messages give)
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{named}: missing{suffix}") from None
    except OSError as exc:
        reason = "a symlink" if exc.errno == 40 else exc.strerror  # ELOOP: O_NOFOLLOW met a link
        raise error(f"{named}: cannot be read ({reason}){suffix}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen: it refuses a folder with an error naming no file
        os.close(fd)
        raise error(f"{named}: not a regular file{suffix}")
    with os.fdopen(fd, "rb") as fh:
        if info.st_size > limit:
            raise error(f"{named}: {info.st_size} bytes, more than the {limit} it may hold{suffix}")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{named}: more than the {limit} bytes it may hold{suffix}")
    return data


def open_regular(path: Path, error: type[UnibakeError] = InputError, shown: str | None = None):
    """``path`` opened to be read (binary), only while it is a regular file. An input the plan hashed
    is opened again to be rendered, scanned and sent: one swapped meanwhile for a FIFO held the run for
    ever (a device, without end); it is refused, naming it, without waiting on it (``O_NONBLOCK``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen: it would take a FIFO or a device as it is
        os.close(fd)
        raise error(f"{shown or path}: not a regular file now (it was replaced since it was hashed, by a FIFO, a "
                    "device or a folder); put the file back, then run again")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_small_text(path: Path, error: type[UnibakeError], *, limit: int, what: str = "",
                    follow: bool = True) -> str:
    return decode_text(read_small_file(path, error, limit=limit, what=what, follow=follow), path, error)


def decode_text(data: bytes, path: Path, error: type[UnibakeError], shown: str | None = None) -> str:
    """``data`` (read from ``path``) as UTF-8 text; ``error`` naming the file and the byte otherwise. ``shown``:
    the file's name as the user gave it, and then the line is named too (as a YAML error names it)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # a Windows editor's "Unicode" is UTF-16, marked by its byte-order mark: said, not just "byte 0"
        utf16 = "; it is UTF-16 (its first bytes are a UTF-16 byte-order mark): save it as UTF-8" \
            if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        where = f"{shown}:{data.count(10, 0, exc.start) + 1}" if shown else str(path)  # (10: a line feed)
        raise error(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}){utf16}") from None


def bounded_body(response, limit: int) -> tuple[bytes, bool]:
    """An HTTP answer's body (a ``requests`` response not yet read) read up to ``limit`` bytes, and whether it
    was longer: then the connection is closed and the rest never read (requests would read it whole, and an
    endless one without end). Set as the response's content, so that ``.content`` and ``.json()`` read it."""
    body, cut = bytearray(), False
    for chunk in response.iter_content(1 << 16):
        body += chunk
        if len(body) > limit:
            response.close()
            del body[limit:]
            cut = True
            break
    response._content, response._content_consumed = bytes(body), True
    return response._content, cut


def no_auth(request):
    """A ``requests`` session's own auth that adds nothing: set, requests looks for none in ``~/.netrc`` (which
    it adds, a ``default`` entry too, to every request without an Authorization header of its own; docker and
    its registries read no netrc)."""
    return request


def strip_auth(session, prepared, response) -> None:
    """``Session.rebuild_auth`` without its netrc: a redirect to another host drops the Authorization header."""
    if "Authorization" in prepared.headers and session.should_strip_auth(response.request.url, prepared.url):
        del prepared.headers["Authorization"]


def private_folder(path: Path) -> bool:
    """``path`` is a real folder (not a link) of this user's that no one else may enter or write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_new(path: Path, mode: int = 0o644):
    """``path`` made anew for writing (binary): what is there first is removed, never written through.
    A temporary name in a folder others can write (checksums/, beside --out) could have been planted
    as a link to a file of the releasing user's (often root's), as a lock file could."""
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "wb")


# a folder opened to be read and emptied: never through a link, and never anything but a folder; O_NONBLOCK: a
# FIFO put there after its lstat is refused by O_DIRECTORY, not waited on for a writer for ever
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOT_A_FOLDER = (errno.ENOTDIR, errno.ELOOP)


def _remove_in(folder: int, path: str, ignore_errors: bool) -> None:
    """Remove everything in the folder open as ``folder`` (``path``, for errors), depth first. Each entry
    is opened as a folder only with :data:`_FOLDER_FLAGS`: what was swapped for a link, a file or a FIFO
    since it was listed is unlinked, never followed nor opened. shutil.rmtree opened it with O_RDONLY
    alone, between its lstat and its open, and a FIFO put there in between held it for ever."""
    def failed(exc: OSError, name: str) -> None:
        if ignore_errors or isinstance(exc, FileNotFoundError):  # gone meanwhile: what was wanted
            return
        exc.filename = os.path.join(path, name)
        raise exc

    try:
        with os.scandir(folder) as found:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in found]
    except OSError as exc:
        failed(exc, "")
        return
    for name, is_dir in entries:
        if is_dir:
            try:
                inner = os.open(name, _FOLDER_FLAGS, dir_fd=folder)
            except OSError as exc:
                if exc.errno not in _NOT_A_FOLDER:
                    failed(exc, name)
                    continue
                is_dir = False  # no folder any more: unlinked below
            else:
                try:
                    _remove_in(inner, os.path.join(path, name), ignore_errors)
                finally:
                    os.close(inner)
                try:
                    os.rmdir(name, dir_fd=folder)
                except OSError as exc:
                    failed(exc, name)
        if not is_dir:
            try:
                os.unlink(name, dir_fd=folder)
            except OSError as exc:
                failed(exc, name)


def remove_tree(path: Path, *, ignore_errors: bool = False) -> None:
    """``shutil.rmtree(path)``, but what is at ``path``, or anywhere inside it, that is no folder (a link,
    a file, a FIFO: a run's own folder swapped for one while it ran) is unlinked, never followed nor
    opened: rmtree opens each folder to read it, and opening a FIFO waits for a writer for ever. Nothing
    there: done."""
    try:
        top = os.open(path, _FOLDER_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in _NOT_A_FOLDER:
            if ignore_errors:
                return
            raise
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            if not ignore_errors:
                raise
        return
    try:
        _remove_in(top, str(path), ignore_errors)
    finally:
        os.close(top)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        if not ignore_errors:
            raise


def fresh_folder(path: Path, what: str, *, mode: int = 0o777) -> None:
    """``path`` made anew as an empty folder (a run's staging folder, ``what``), under the lock that
    makes it that run's: what a killed run left there is removed first. Anything else there (a link,
    a file: no run makes those) is never followed nor removed, and neither is a folder this user
    cannot remove: an error says what it is and to remove it."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        kind = "a link" if os.path.islink(path) else "a file"
        raise UnibakeError(f"{path} is {kind} where a run makes {what} (a folder): no run's, so it is neither "
                           "followed nor removed; remove it, then run again")
    try:
        remove_tree(path)
    except OSError as exc:
        raise UnibakeError(f"{path} ({what} a killed run left) cannot be removed ({exc.strerror}): remove it "
                           "(as its owner), then run again") from None
    except RecursionError:  # remove_tree recurses once per level: no run nests folders so deep
        raise UnibakeError(f"{path} holds folders nested too deep to remove here (not {what} a run made): "
                           "remove it (rm -rf), then run again") from None
    path.mkdir(mode=mode)


# how long (since its last change) a temporary file of write_atomic must be left to be a killed writer's, which
# prune removes: a writer holds its file for one write, fsync and rename of a small file (a lock, a rendered copy, a
# memo, a release's text file), never minutes; the writers hold no lock to ask, and a pid in the name would not
# tell (another container's pid namespace, a pid reused since)
ATOMIC_TEMP_AGE = 15 * 60


def linked_above(folder: Path, depth: int = 2) -> Path | None:
    """``folder``, or one of the ``depth`` folders above it, when it is a symbolic link; else None. A record written
    there (and the older ones evicted) would land wherever a checkout's link points: a ``.cache`` linked to a
    folder of the user's had its ``*.json`` files removed."""
    return next((f for f in (folder, *list(folder.parents)[:depth]) if f.is_symlink()), None)


def same_file(path: Path, made: os.stat_result) -> bool:
    """``path`` is still the file or folder ``made`` was taken of (not one put in its place, not through a link)."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino)


def evict_oldest(folder: Path, pattern: str, kept: int) -> None:
    """Of ``folder``'s files matching ``pattern``, all but the newest ``kept`` (by mtime) removed: a memo folder
    that would otherwise grow by one file per build for ever. Best effort: a file that stays is only disk."""
    try:
        files = sorted(folder.glob(pattern), key=lambda f: f.stat(follow_symlinks=False).st_mtime, reverse=True)
        for old in files[kept:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def touch(path: Path) -> None:
    """A memo taken back: the newest, so that eviction (the oldest first) keeps the ones in use (before: a
    release's config record went after 16 later releases however often it was used, and every hotfix on it then
    read its archive whole again, 7-10 s against 3 s on the benchmark's product)."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass  # (only its place in the eviction order)


def write_atomic(folder: Path, name: str, text: str | bytes, *, mode: int = 0o644, temp: str = "") -> str:
    """Write ``folder/name`` via a temporary file of this writer's own in ``folder`` (``.NAME.XXXXXXXX.tmp``,
    made by tempfile; ``temp``: that name instead), fsynced; returns its sha256. Two runs writing one file
    (two ``lock`` runs) each write their own: neither removes or renames the other's half-written one, as
    when both wrote ``.NAME.tmp``."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    path = None
    try:
        if temp:
            path = folder / temp
            fh = open_new(path)
        else:  # (a long name's own would pass 255 bytes: a hash of it stands in)
            raw = os.fsencode(name)
            prefix = f".{name}." if len(raw) <= 200 else f".{hashlib.sha256(raw).hexdigest()[:16]}."
            from .publish import held_signals  # (here: publish imports this module)

            with held_signals():  # made and recorded as one step: an interrupt as it was made left the file
                fd, made = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)  # O_EXCL: never through a link
                path = Path(made)
            fh = os.fdopen(fd, "wb")
        with fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(path, folder / name)
    except OSError as exc:
        if path is not None:
            path.unlink(missing_ok=True)
        # a write or fsync that failed (a full disk), or the rename (an immutable file or folder), named as what was
        # being written: the temporary file it named is gone (found by probing: ".inputs.lock.lvi1kt3f.tmp")
        if exc.filename is None or (path is not None and exc.filename in (str(path), os.fspath(path))):
            raise OSError(exc.errno, exc.strerror, str(folder / name)) from None
        raise
    except BaseException:
        if path is not None:
            path.unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def unwritable_reason(path: Path, *, folder: bool = False) -> str | None:
    """Why a file (with ``folder``, a folder to write files in) cannot be made at ``path``, its
    folders made as needed; None if it can. Checked before the work that ends in writing it, leaving
    nothing (a refused run leaves no empty folder): what access() cannot tell (root in /proc or /sys,
    a security module's refusal) is tried with a probe of a unique name, removed at once."""
    # (os.path's tests, not Path's: under a folder this user cannot search, Path.is_dir raised PermissionError)
    if os.path.isdir(path) and not folder:
        return f"{path} is a folder, not a file"
    existing = path if folder else path.parent
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not os.path.isdir(existing):
        return f"{existing} is not a folder"
    # a name or a path too long for the file system: the probe below, of a short name, did not tell (found at the
    # end, after the work: "File name too long", exit 1)
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    made = path.relative_to(existing).parts if path != existing else ()
    longest = max(made, key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > name_max:
        return f"{path}: the name {longest[:40]}... is {len(os.fsencode(longest))} bytes, more than the {name_max} a " \
               "name may have there"
    if len(os.fsencode(str(path))) >= path_max:
        return f"{str(path)[:60]}...: the path is {len(os.fsencode(str(path)))} bytes, more than a path may have"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    makes_folder = existing != (path if folder else path.parent)  # the first step: a folder made, or a file
    try:
        if makes_folder:
            os.rmdir(tempfile.mkdtemp(prefix=".unibake-probe-", dir=existing))
        else:
            fd, probe = tempfile.mkstemp(prefix=".unibake-probe-", dir=existing)
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return f"{existing} takes no new {'folder' if makes_folder else 'file'}: {exc.strerror}"
    return None


def _host_token() -> str:
    """This machine's name, as 8 hex digits: a process ID names a process of this machine (of this container) only."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, OSError):  # (another user's process: running)
        return False
    return False


_WORK_LOCKS: dict[Path, int] = {}  # each work folder this process made: the open folder it holds a lock on
STALE_SECONDS = 24 * 3600  # a work folder that cannot be locked (NFS) is another's until unchanged for this long


def _left_by_a_killed_run(path: str) -> int | None:
    """The work folder ``path`` opened and locked, when no run holds it (its process gone, as the caller saw): its
    lock is free (a run holds it while the folder is its; a process ID alone is another PID namespace's too, a
    container sharing the host's name and temporary folder), or, where a folder cannot be locked, it is a day old.
    None when a run may hold it. The caller removes the folder, then closes what this gave (held till then: a run
    that took the lock in between would lose the folder it just locked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    except OSError:
        if time.time() - os.fstat(fd).st_mtime > STALE_SECONDS:
            return fd
    os.close(fd)
    return None


def work_folder_done(folder: Path) -> None:
    """The lock :func:`work_folder` holds on ``folder`` let go (as it is removed)."""
    fd = _WORK_LOCKS.pop(folder, None)
    if fd is not None:
        os.close(fd)


def work_folder(prefix: str, parent: Path | str | None = None) -> Path:
    """A new private temporary folder (``tempfile.mkdtemp``) named ``PREFIX<host>-<pid>-XXXXXXXX``, for a run's
    large temporary files (a push's compressed layers, repro's two archives: the size of the image), locked
    (``flock``) until :func:`work_folder_done`. Those a run of this user on this machine left when it was killed (SIGKILL,
    the OOM killer, a power cut: no clean-up ran), its process gone and its lock free, are removed first: each
    was as large as the image, and nothing else removed it."""
    where = Path(parent if parent is not None else tempfile.gettempdir())
    mine = f"{prefix}{_host_token()}-"
    try:
        entries = list(os.scandir(where))
    except OSError:
        entries = []
    for entry in entries:
        pid = entry.name[len(mine):].partition("-")[0]
        if not entry.name.startswith(mine) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        held = _left_by_a_killed_run(entry.path) if _process_gone(int(pid)) else None
        if held is not None:
            try:
                remove_tree(Path(entry.path), ignore_errors=True)
            finally:
                os.close(held)
    for _ in range(3):
        made = Path(tempfile.mkdtemp(prefix=f"{mine}{os.getpid()}-", dir=where))
        try:
            fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return made
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # (a file system that takes no lock on a folder: its age tells instead)
            os.close(fd)
            return made
        if os.fstat(fd).st_nlink:  # (0: another run's clean-up removed it before the lock was taken: made anew)
            _WORK_LOCKS[made] = fd
            return made
        os.close(fd)
    raise UnibakeError(f"cannot keep a work folder in {where}: each one made was removed at once (another run's "
                       "clean-up?)")
