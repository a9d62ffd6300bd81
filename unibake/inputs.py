"""Every baked input, hashed; and ``inputs.lock``, the assembly ledger that a build must match.

A source is a file or a folder inside the project root. Paths that leave the root (``..``,
absolute paths, symlinks that point out) are refused; ``__pycache__`` folders and ``*.pyc`` files
are never baked.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .digestmemo import file_sha256
from .errors import InputError, UnibakeError
from .files import decode_text, open_regular, read_small_file, visible_name
from .schema import describe_character, hidden_character
from .sums import parse_sums, render_sums

LOCK_FILE = "inputs.lock"
# a lock holding this line records which inputs are baked executable (a '*' before the name); an older
# one without it is still read, its inputs' modes not checked
MODES_NOTE = "# A '*' before a name: the file is baked executable (sha256sum -c reads it as binary mode: the same)."
LOCK_HEADER = (
    "# The sha256 of every input baked into the image (sha256sum format, paths from the project root).\n"
    "# A build refuses inputs that differ. Review the change, then rewrite with: python build.py lock\n"
    f"{MODES_NOTE}\n"
)
SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True, kw_only=True)
class InputFile:
    """One file that is baked in: where it is, its sha256, size and mode."""

    path: str  # project-relative, POSIX
    absolute: Path
    sha256: str
    size: int
    mode: int  # 0o755 or 0o644

    @property
    def executable(self) -> bool:
        return self.mode == 0o755


@dataclass(frozen=True, kw_only=True)
class Source:
    """A baked file or folder: its files (sorted) and one digest over names and contents."""

    path: str
    files: tuple[InputFile, ...]
    digest: str
    is_dir: bool
    empty_folders: tuple[str, ...] = ()  # inside it, holding nothing baked: the image has files only

    def relative(self, f: InputFile) -> str:
        """A file's path inside this source (its name, for a single-file source)."""
        if not self.is_dir:
            return Path(f.path).name
        return f.path[len(self.path.rstrip("/")) + 1:]


def sha256_file(path: Path, error: type[UnibakeError] = InputError) -> str:
    h = hashlib.sha256()
    with open_regular(path, error) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _inside(root: Path, path: Path) -> bool:
    return path == root or path.is_relative_to(root)


def real_path(path: Path, shown: str, where: str) -> Path:
    """``path`` with every symlink followed; one that loops or leads nowhere is named as written,
    not as Python's RuntimeError (3.11) or the missing target would name it. An empty ``shown``: the
    file ``where`` names itself."""
    what = f"{where}: '{shown}' is" if shown else f"{where}:"
    try:
        return path.resolve(strict=True)
    except RuntimeError:
        raise InputError(f"{what} a symlink loop; point it at a file") from None
    except FileNotFoundError:
        raise InputError(f"{what} a symlink that points nowhere; point it at a file or remove it") from None
    except OSError as exc:
        raise InputError(f"{what} unreadable ({exc.strerror})") from None


def file_and_folder(paths: Iterable[str]) -> tuple[str, str] | None:
    """Two of ``paths`` that no file system holds together, the first a file and a folder of the
    second ('a/b' and 'a/b/c'); None when there are none."""
    files = set(paths)
    for path in sorted(files):
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                return "/".join(parts[:i]), path
    return None


def read_source(root: Path, rel: str, where: str, *, want: str = "any", limit: int | None = None) -> Source:
    """Hash the file or folder ``rel`` under ``root``; ``where`` names the YAML key for errors. ``limit``:
    a file of this many bytes or more is refused by its size, before it is read (see :func:`check_size`)."""
    root = root.resolve()
    rel = rel.rstrip("/")
    if rel.startswith("/") or ".." in Path(rel).parts:
        raise InputError(f"{where}: source '{rel}' is outside the project ({root}); use a path inside it")
    skipped = next((part for part in Path(rel).parts if part in SKIPPED_DIRS), None)
    if skipped is not None:  # inside a source they are left out; named, a .git folder baked the whole history
        raise InputError(f"{where}: source '{rel}' is {'a' if Path(rel).name == skipped else 'inside a'} {skipped} "
                         f"folder, which is never baked (a folder source leaves it out): a .git folder's objects are "
                         "compressed, so the secret scan cannot read the history it would bake; name other files")
    path = root / rel
    if not os.path.lexists(path):
        raise InputError(f"{where}: source '{rel}' does not exist under {root}")
    real = real_path(path, rel, where)
    if not _inside(root, real):
        raise InputError(f"{where}: source '{rel}' resolves outside the project (to {real}); "
                         "symlinks must point inside it")
    _check_not_skipped(root, real, rel, where)
    if want == "dir" and not real.is_dir():
        raise InputError(f"{where}: source '{rel}' must be a folder")
    if want == "file" and not real.is_file():
        raise InputError(f"{where}: source '{rel}' must be a file")
    files: list[InputFile] = []
    empty: list[str] = []
    def unreadable(exc: OSError) -> None:  # os.walk's default left such a folder out of the image without a word
        shown = os.path.relpath(exc.filename, root) if exc.filename else rel
        raise InputError(f"{where}: cannot read the folder '{visible_name(shown)}' ({exc.strerror}); every file of a "
                         "source is baked: make it readable, or move it out of the source")

    if real.is_dir():
        try:  # os.walk recurses in Python 3.11: a tree 1000 folders deep ends it
            for dirpath, dirnames, filenames in os.walk(path, onerror=unreadable):
                dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
                for d in dirnames:
                    if os.path.islink(os.path.join(dirpath, d)):
                        shown = os.path.relpath(os.path.join(dirpath, d), root)
                        raise InputError(f"{where}: '{shown}' is a symlinked folder; copy it in instead")
                kept = [name for name in sorted(filenames) if not name.endswith(SKIPPED_SUFFIXES)]
                if not dirnames and not kept and dirpath != str(path):
                    empty.append(os.path.relpath(dirpath, path).replace(os.sep, "/"))
                for name in kept:
                    files.append(_input_file(root, Path(dirpath) / name, where, limit))
        except RecursionError:
            raise InputError(f"{where}: source '{rel}' is nested too deeply; flatten it") from None
        if not files:
            raise InputError(f"{where}: source '{rel}' is an empty folder")
    else:
        files.append(_input_file(root, path, where, limit))
    _check_hard_links(root, files, where)
    files.sort(key=lambda f: f.path)
    listing = "".join(f"{f.sha256}  {f.path[len(rel) + 1:] if real.is_dir() else Path(f.path).name}\n"
                      for f in files)
    return Source(path=rel, files=tuple(files), digest=hashlib.sha256(listing.encode()).hexdigest(),
                  is_dir=real.is_dir(), empty_folders=tuple(sorted(empty)))


def _check_hard_links(root: Path, files: list[InputFile], where: str) -> None:
    """Refuse a file with a hard link outside the project, as a symlink out of it is: its bytes are a file
    elsewhere (a key, a file another user rewrites) that the project only names. Each file of more than one
    link has its links counted under ``root`` (the tree walked once, links not followed); one whose count
    falls short of its link count is named."""
    wanted: dict[tuple[int, int], tuple[InputFile, int]] = {}
    for f in sorted(files, key=lambda f: f.path):
        st = os.stat(f.absolute)
        if st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
            wanted.setdefault((st.st_dev, st.st_ino), (f, st.st_nlink))
    if not wanted:
        return
    found = dict.fromkeys(wanted, 0)
    inodes = {ino for _, ino in wanted}
    folders, left = [str(root)], sum(n for _, n in wanted.values())
    while folders and left:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:  # a folder this user cannot read: its links are not counted (so taken as outside)
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif entry.inode() in inodes:
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) in found:
                        found[(st.st_dev, st.st_ino)] += 1
                        left -= 1
            except OSError:
                continue
    for key, (f, links) in sorted(wanted.items(), key=lambda item: item[1][0].path):
        if found[key] < links:
            raise InputError(f"{where}: '{f.path}' is a hard link to a file outside the project ({links} links, "
                             f"{found[key]} of them under {root}); hard links, like symlinks, must stay inside it: "
                             f"make it a file of its own (cp {shlex.quote(f.path)} {shlex.quote(f.path + '.new')} && "
                             f"mv {shlex.quote(f.path + '.new')} {shlex.quote(f.path)})")


def read_hashed(f: InputFile, limit: int) -> bytes:
    """The bytes of an input file hashed just before (an env file, a patch, the notes' texts), checked
    against that hash: an edit in between would be what is baked or shown while the lock and the
    provenance pin the file as it was hashed."""
    data = read_small_file(f.absolute, InputError, limit=limit)
    if hashlib.sha256(data).hexdigest() != f.sha256:
        raise InputError(f"input '{f.path}' changed while it was read (after it was hashed); run again")
    return data


def read_external(path: str, where: str, limit: int | None = None) -> Source:
    """A file outside the project, named by its absolute path (a large prebuilt binary): hashed like
    any input and locked under its absolute path."""
    _check_utf8_name(path, where)
    real = Path(path)
    if not real.is_absolute() or ".." in real.parts:
        raise InputError(f"{where}: {path!r} must be an absolute path without '..'")
    if not os.path.lexists(real):
        raise InputError(f"{where}: {path} does not exist")
    if not real_path(real, path, where).is_file():
        raise InputError(f"{where}: {path} is not a regular file")
    if any(ord(c) < 0x20 or c in "\\\x7f" for c in path):
        raise InputError(f"{where}: the file name {path!r} holds a control character or backslash; rename it")
    _check_hidden_name(path, where)
    st = os.stat(real)
    check_size(path, st.st_size, where, limit)
    f = InputFile(path=path, absolute=real.resolve(), sha256=sha256_file(real), size=st.st_size,
                  mode=0o755 if st.st_mode & 0o111 else 0o644)
    return Source(path=path, files=(f,), digest=hashlib.sha256(f"{f.sha256}  {real.name}\n".encode()).hexdigest(),
                  is_dir=False)


def _check_utf8_name(name: str, where: str) -> None:
    """A name the file system gave that is not UTF-8 (Python holds its bad bytes as surrogates): no
    ledger, lock or Dockerfile can name it."""
    shown = visible_name(name)
    if shown != name:
        raise InputError(f"{where}: the file name '{shown[:200]}' is not UTF-8; rename it")


def _check_not_skipped(root: Path, real: Path, rel: str, where: str) -> None:
    """A symlink into a .git (or __pycache__) folder of the project: what a source leaves out, baked through
    a link (.git/config, with a token in a remote's URL; objects the secret scan cannot read)."""
    inside = real.relative_to(root).parts
    # the folders on the way, and the target itself only when it is a folder: a file named .git (a submodule's
    # 'gitdir:' line, which a folder source bakes as any file) is no .git folder
    skipped = next((part for part in inside[:-1] if part in SKIPPED_DIRS), None)
    if skipped is None and inside and inside[-1] in SKIPPED_DIRS and real.is_dir():
        skipped = inside[-1]
    if skipped is not None:
        raise InputError(f"{where}: '{rel}' is a symlink into a {skipped} folder (to {real}), which is never baked; "
                         "copy the file it names in instead")


def _check_hidden_name(name: str, where: str) -> None:
    """A name holding a C1 control or an invisible format character (a bidi override): the lock, the
    ledgers and the notes a reviewer reads would show another name than the one baked."""
    bad = hidden_character(name)
    if bad is not None:
        raise InputError(f"{where}: the file name {name!r} holds {describe_character(bad)}, a control or invisible "
                         "format character that shows the name otherwise in the lock and the ledgers; rename it")


def check_size(shown: str, size: int, where: str, limit: int | None) -> None:
    """Refuse a file of ``limit`` bytes or more (a publishing run's: no reconstruct kit carries a file of 8 GiB
    or more) by its size, before it is hashed: hashing one took minutes only to refuse it after."""
    if limit is not None and size >= limit:
        raise InputError(f"{where}: '{shown}' is {size} bytes: a file of 8 GiB or more would get a pax "
                         "size record in the reconstruct kit's context.tar, which its verify.sh and rebuild refuse; "
                         "no kit can carry it: mount such a file at run time instead of baking it")


def _input_file(root: Path, path: Path, where: str, limit: int | None = None) -> InputFile:
    rel = path.relative_to(root).as_posix()
    _check_utf8_name(rel, where)
    if any(ord(c) < 0x20 or c in "\\\x7f" for c in rel):
        raise InputError(f"{where}: the file name {rel!r} holds a control character or backslash; rename it")
    _check_hidden_name(rel, where)
    real = real_path(path, rel, where)
    if not _inside(root, real):
        raise InputError(f"{where}: '{rel}' is a symlink that points outside the project (to {real})")
    _check_not_skipped(root, real, rel, where)
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{where}: '{rel}' is not a regular file")
    mode = 0o755 if st.st_mode & 0o111 else 0o644
    check_size(rel, st.st_size, where, limit)
    try:
        sha256 = file_sha256(real, st, sha256_file)  # (unchanged since an earlier plan: that plan's, unibake.digestmemo)
    except PermissionError as exc:  # was exit 1 naming only the path, as if the disk had failed
        raise InputError(f"{where}: cannot read '{rel}' ({exc.strerror}); make it readable to this user, or move it "
                         "out of the source") from None
    return InputFile(path=rel, absolute=real, sha256=sha256, size=st.st_size, mode=mode)


# ---------------------------------------------------------------------------------------------
# inputs.lock


LOCK_LIMIT = 64 << 20


@dataclass(frozen=True, kw_only=True)
class Lock:
    """What ``inputs.lock`` pins: each input's sha256 and, unless the lock predates it, which are executable."""

    digests: dict[str, str]
    executable: frozenset[str] | None  # None: a lock without MODES_NOTE, written before modes were locked
    raw: bytes | None = None  # the bytes read, when read from a file

    def mode_differs(self, f: InputFile) -> bool:
        """Whether ``f`` is (not) executable where the lock, recording modes, says otherwise."""
        return self.executable is not None and f.path in self.digests and (f.path in self.executable) != f.executable


def read_lock(lock_path: Path, display: str) -> Lock:
    """The lock in ``lock_path``; a missing lock is an empty one."""
    if not os.path.lexists(lock_path):
        return Lock(digests={}, executable=frozenset())
    real = real_path(lock_path, "", display)
    if not real.is_relative_to(lock_path.parent.resolve()):  # its lines are quoted in errors: never read a file
        raise InputError(f"{display}: a symlink that points outside the profiles folder (to {real}); the lock "
                         "must live in the folder")
    raw = read_small_file(lock_path, InputError, limit=LOCK_LIMIT)
    text = decode_text(raw, lock_path, InputError)
    entries = parse_sums(text, display, InputError, comments=True)
    modes = MODES_NOTE in text.split("\n") or any(e.binary for e in entries)
    return Lock(digests={e.name: e.sha256 for e in entries},
                executable=frozenset(e.name for e in entries if e.binary) if modes else None, raw=raw)


def render_lock(files: list[InputFile]) -> str:
    return render_sums({f.path: f.sha256 for f in files}, LOCK_HEADER,
                       binary=frozenset(f.path for f in files if f.executable))


def _mode_word(executable: bool) -> str:
    return "executable" if executable else "not executable"


def check_lock(files: list[InputFile], lock: Lock, display: str,
               sources: tuple[str, ...] = (), command: str = "python build.py lock") -> None:
    """Refuse inputs that are new, differ from the lock (in content or, when it records modes, in being
    executable), or are locked under one of ``sources`` but gone; name the first and count the rest."""
    problems: list[str] = []
    locked = lock.digests
    present = {f.path for f in files}
    for path in sorted(locked):
        if path != posixpath.normpath(path) or path.startswith(("../", "//")) or path in (".", ".."):
            # (no input is named so: a line added by hand, '../../etc/passwd', was read as vouching for nothing and
            # passed without a word, where a reviewer takes the lock for the list of what is baked; a file outside
            # the project is locked by its absolute path, without '..')
            problems.append(f"{display} names '{path}', which no input can be (a path with '..', or not written as "
                            "the lock writes it)")
        under = any(path == src or path.startswith(src.rstrip("/") + "/") for src in sources)
        if under and path not in present:
            problems.append(f"input '{path}' is in {display} but missing")
    for f in sorted({f.path: f for f in files}.values(), key=lambda f: f.path):
        want = locked.get(f.path)
        if want is None:
            problems.append(f"input '{f.path}' is not in {display}")
        elif want != f.sha256:
            problems.append(f"input '{f.path}' differs from {display} "
                            f"(locked {want[:12]}, now {f.sha256[:12]})")
        elif lock.mode_differs(f):
            problems.append(f"input '{f.path}' differs from {display} in its mode (locked "
                            f"{_mode_word(not f.executable)}, now {_mode_word(f.executable)})")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(f"{problems[0]}{more}; review the change, then run: {command}")
