"""Which zstd frames an earlier read back decoded, and to what: what lets a release made ``--from`` an
earlier one leave the layers it copied from that one's archive unhashed.

A release's read back decodes its whole archive, hashes every layer for its diffID, and hashes each
big layer's own frame as compressed bytes too (:func:`unibake.archive_reader.read_back`): a frame of
those compressed bytes decodes to that layer, wherever it lies. A release made ``--from`` R copies R's
frames for the layers the two share; its read back still decodes them (the decoded stream's sha256
covers every byte), but takes a copied layer's diffID from this record when the frame it finds there
has the recorded sha256, instead of hashing the layer again (about 0.7 CPU-seconds a GB).

The record (``.cache/build-memo/frames/frames.json``) is signed with this user's key
(:mod:`unibake.signed`): a checkout's planted record reads as empty, and every layer is hashed.
``--no-cache`` reads none; every read back of the one-pass export writes what it found.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .archive_reader import FrameSeen
from .signed import read_signed, write_signed

FOLDER = "frames"  # under the build memo's folder
FILE = "frames.json"
VERSION = 1
LIMIT = 8 << 20
KEPT = 20_000  # frames: every big layer of a product's recent releases
_HEX = frozenset("0123456789abcdef")


def _hex(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _entry(blob: str, value) -> FrameSeen | None:
    if not (_hex(blob) and isinstance(value, list) and len(value) == 4 and _hex(value[0])
            and all(type(v) is int and v > 0 for v in value[1:3]) and isinstance(value[3], str)):
        return None
    return FrameSeen(blob=blob, frame_sha256=value[0], length=value[1], size=value[2], compressor=value[3])


def known_frames(folder: Path, key: bytes) -> dict[str, FrameSeen]:
    """The frames recorded in ``folder`` under ``key``, by the digest of the blob each decodes to."""
    entries = read_signed(folder, FILE, key, VERSION, limit=LIMIT)
    return {blob: seen for blob, value in entries.items() if (seen := _entry(blob, value)) is not None}


def remember_frames(folder: Path, key: bytes, seen: Iterable[FrameSeen]) -> int:
    """``seen`` added to the record (the newest first, at most ``KEPT`` in all); how many were new."""
    new = {f.blob: [f.frame_sha256, f.length, f.size, f.compressor] for f in seen}
    old = read_signed(folder, FILE, key, VERSION, limit=LIMIT)
    added = sum(1 for blob, value in new.items() if old.get(blob) != value)
    if not added:
        return 0
    entries = dict(new)
    for blob, value in old.items():
        if len(entries) >= KEPT:
            break
        if _entry(blob, value) is not None:
            entries.setdefault(blob, value)
    write_signed(folder, FILE, key, VERSION, entries)
    return added
