"""The input files' sha256, remembered by what ``stat`` says of each file.

The plan hashes every input (a 0.43 GB library takes 0.3 s; an engine folder of gigabytes, seconds)
before every release, though between two releases most inputs are the same files, untouched. As
git's index and ccache's direct mode do, a file whose device, inode, size, modification time and
change time (to the nanosecond) are those recorded when it was last hashed is taken to hold what it
held then, and is not read again. The change time is the kernel's: writing, truncating, renaming onto
the path, ``touch -d`` and ``utime`` all set it to the present, and no program may set it back.

A file changed in the two seconds before it was hashed is not remembered (``SETTLE_NS``): a write in
the same tick of the file system's clock could leave its times as they were hashed ("racily clean",
in git's words). Nothing is remembered of a file that changed while it was read.

The record lives in the project (``.cache/build-memo/inputs/digests.json``), which a checkout could
bring too: one that says a changed file is unchanged would have a release built from inputs its notes do
not describe. So the record carries an HMAC under this user's key (the build memo's,
:func:`buildmemo.secret`); one without it is ignored, and the files are hashed. Nothing else stands behind
a file not read again but its times: a change that leaves the change time as it was (the clock set back
by root, a file system that does not keep times) is not seen, as git would not see it. ``--no-cache``
reads no record (every input is hashed) and writes what it hashed.

No library keeps a stat-keyed digest cache for arbitrary files (hashlib hashes, nothing remembers), so
this one is written here: a JSON object of at most ``KEPT`` entries.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from .signed import read_signed, write_signed

FOLDER = "inputs"  # under the build memo's folder
FILE = "digests.json"
VERSION = 1
LIMIT = 32 << 20  # the record's own size
KEPT = 50_000  # entries: a project's inputs, and those of its other configurations
SETTLE_NS = 2_000_000_000
_HEX = frozenset("0123456789abcdef")

Signature = tuple[int, int, int, int, int]


def signature(info: os.stat_result) -> Signature:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _valid(entry) -> bool:
    return (isinstance(entry, list) and len(entry) == 6 and all(type(v) is int and v >= 0 for v in entry[:5])
            and isinstance(entry[5], str) and len(entry[5]) == 64 and set(entry[5]) <= _HEX)


class DigestMemo:
    """One plan's view of the record in ``folder``: :meth:`sha256` answers from it or hashes, and
    :meth:`save` writes what this plan hashed or found, with the older entries it did not see."""

    def __init__(self, folder: Path, key: bytes, *, read: bool = True, now: Callable[[], int] = time.time_ns):
        self.folder, self.key, self.now = folder, key, now
        self.old: dict[str, list] = self._load() if read else {}
        self.seen: dict[str, list] = {}
        self.remembered = 0  # files answered from the record
        self.remembered_bytes = 0
        self.changed = not read

    def _load(self) -> dict[str, list]:
        entries = read_signed(self.folder, FILE, self.key, VERSION, limit=LIMIT)
        return {path: entry for path, entry in entries.items() if _valid(entry)}

    def sha256(self, path: Path, info: os.stat_result, hash_file: Callable[[Path], str]) -> str:
        """The sha256 of the file at ``path`` (a real path), which ``info`` describes: the record's when
        it describes the file so, else ``hash_file(path)``'s, remembered unless the file changed while it
        was read or too short a time before."""
        name = os.fsdecode(path)
        sig = signature(info)
        old = self.old.get(name)
        if old is not None and tuple(old[:5]) == sig:
            self.seen[name] = old
            self.remembered += 1
            self.remembered_bytes += info.st_size
            return old[5]
        if self.old.pop(name, None) is not None:  # (out of date: not written again)
            self.changed = True
        start = self.now()
        digest = hash_file(path)
        try:
            after = signature(os.stat(path))
        except OSError:
            return digest
        if after == sig and max(info.st_mtime_ns, info.st_ctime_ns) < start - SETTLE_NS:
            self.seen[name] = [*sig, digest]
            self.changed = True
        return digest

    def save(self) -> None:
        """The record written (through a temporary file, signed), when this plan changed it."""
        if not self.changed:
            return
        entries = dict(itertools.islice(self.seen.items(), KEPT))  # (a plan of more inputs keeps KEPT of them)
        for name, entry in self.old.items():
            if len(entries) >= KEPT:
                break
            entries.setdefault(name, entry)
        write_signed(self.folder, FILE, self.key, VERSION, entries, limit=LIMIT)


_ACTIVE: ContextVar[DigestMemo | None] = ContextVar("digest memo", default=None)


@contextmanager
def remembering(memo: DigestMemo | None) -> Iterator[DigestMemo | None]:
    """Within: :func:`file_sha256` answers from ``memo`` (None: every file hashed)."""
    token = _ACTIVE.set(memo)
    try:
        yield memo
    finally:
        _ACTIVE.reset(token)


def file_sha256(path: Path, info: os.stat_result, hash_file: Callable[[Path], str]) -> str:
    memo = _ACTIVE.get()
    return hash_file(path) if memo is None else memo.sha256(path, info, hash_file)
