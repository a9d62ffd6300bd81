"""Which zstd frames an earlier read back decoded, and to what: what lets a release made ``--from`` an
earlier one leave the layers it copied from that one's archive unhashed.

A release's read back decodes its whole archive, hashes every layer for its diffID, and hashes each
big layer's own frame as compressed bytes too (:func:`unibake.archive_reader.read_back`): a frame of
those compressed bytes decodes to that layer, wherever it lies. A release made ``--from`` R copies R's
frames for the layers the two share; its read back takes a copied layer's diffID from this record when
the frame it finds there has the recorded sha256, instead of hashing the layer again (about 0.7
CPU-seconds a GB), and decodes the frame only for the decoded stream's sha256 (covering every byte) where
it cannot resume that sha256 after the frame (below).

Each frame's entry also says where the frame ended in the archive read, where the libcrypto the
resumable sha256 needs is there (:mod:`unibake.sha256state`): the sha256 of the compressed bytes before
it and up to its end, the decoded stream's length there and its sha256 state. A release whose archive
begins with the same compressed bytes up to that frame (the big layers come first, after the same
headers) passes over it without decoding it (``ReadBack.passed_over``).

The record (``.cache/build-memo/frames/frames.json``) is signed with this user's key
(:mod:`unibake.signed`): a checkout's planted record reads as empty, and every layer is hashed.
``--no-cache`` reads none; every read back of the one-pass export writes what it found.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .archive_reader import FrameSeen, Resume
from .sha256state import STATE_SIZE
from .signed import read_signed, write_signed

FOLDER = "frames"  # under the build memo's folder
FILE = "frames.json"
VERSION = 2  # (1: without where each frame ended)
LIMIT = 16 << 20  # (20 000 frames of about 620 bytes each: 12 MB)
KEPT = 20_000  # frames: every big layer of a product's recent releases
_HEX = frozenset("0123456789abcdef")


def _hex(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _resume(value) -> Resume:
    if not (isinstance(value, list) and len(value) == 4 and _hex(value[0]) and _hex(value[1])
            and type(value[2]) is int and value[2] > 0 and isinstance(value[3], str)
            and len(value[3]) == 2 * STATE_SIZE and set(value[3]) <= _HEX):
        raise ValueError("not where a frame ended")
    return Resume(prefix=value[0], through=value[1], decoded_end=value[2], state=value[3])


def _entry(blob: str, value) -> FrameSeen | None:
    if not (_hex(blob) and isinstance(value, list) and len(value) == 5 and _hex(value[0])
            and all(type(v) is int and v > 0 for v in value[1:3]) and isinstance(value[3], str)):
        return None
    try:
        resume = None if value[4] is None else _resume(value[4])
    except ValueError:
        return None
    return FrameSeen(blob=blob, frame_sha256=value[0], length=value[1], size=value[2], compressor=value[3],
                     resume=resume)


def _value(f: FrameSeen) -> list:
    r = f.resume
    return [f.frame_sha256, f.length, f.size, f.compressor,
            None if r is None else [r.prefix, r.through, r.decoded_end, r.state]]


def known_frames(folder: Path, key: bytes) -> dict[str, FrameSeen]:
    """The frames recorded in ``folder`` under ``key``, by the digest of the blob each decodes to."""
    entries = read_signed(folder, FILE, key, VERSION, limit=LIMIT)
    return {blob: seen for blob, value in entries.items() if (seen := _entry(blob, value)) is not None}


KIT_FILE = "kit-frames.json"  # the reconstruct kits' frames of large context files, beside the archives'
KIT_KEPT = 2_000


def known_kit_frames(folder: Path, key: bytes) -> dict[str, tuple[str, int, int]]:
    """The kit frames recorded in ``folder`` under ``key``: by the sha256 of the bytes each decodes to, (the sha256
    of its compressed bytes, its length, that size)."""
    entries = read_signed(folder, KIT_FILE, key, VERSION, limit=LIMIT)
    return {sha: (v[0], v[1], v[2]) for sha, v in entries.items() if _kit_entry(sha, v)}


def _kit_entry(sha, value) -> bool:
    return (_hex(sha) and isinstance(value, list) and len(value) == 3 and _hex(value[0])
            and all(type(x) is int and x > 0 for x in value[1:]))


def _merged(folder: Path, key: bytes, name: str, new: dict, kept: int, valid) -> int:
    """``new`` entries added to the signed record ``name`` (the newest first, then the older ones ``valid`` keeps,
    at most ``kept`` in all), written only when one of them is new or changed; how many were."""
    old = read_signed(folder, name, key, VERSION, limit=LIMIT)
    added = sum(1 for k, value in new.items() if old.get(k) != value)
    if not added:
        return 0
    entries = dict(new)
    for k, value in old.items():
        if len(entries) >= kept:
            break
        if valid(k, value):
            entries.setdefault(k, value)
    write_signed(folder, name, key, VERSION, entries, limit=LIMIT)
    return added


def remember_kit_frames(folder: Path, key: bytes, frames: Iterable[tuple[str, str, int, int]]) -> int:
    """A finished kit's frames (:meth:`unibake.kit.KitDraft.made_frames`) added to the record (the newest first, at
    most ``KIT_KEPT``); how many were new. A kit decodes a copied frame only when this record lacks it."""
    return _merged(folder, key, KIT_FILE, {sha: [zsha, length, size] for sha, zsha, length, size in frames}, KIT_KEPT,
                   _kit_entry)


def remember_frames(folder: Path, key: bytes, seen: Iterable[FrameSeen]) -> int:
    """``seen`` added to the record (the newest first, at most ``KEPT`` in all); how many were new."""
    return _merged(folder, key, FILE, {f.blob: _value(f) for f in seen}, KEPT,
                   lambda blob, value: _entry(blob, value) is not None)
