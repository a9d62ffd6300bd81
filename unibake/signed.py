"""Small JSON records this user's runs keep in the project's build memo (``.cache/build-memo``), each
signed with an HMAC under this user's key (:func:`unibake.buildmemo.secret`).

A checkout can bring a ``.cache`` folder too: a record it planted must not make a run skip work it
owes (hash an input, decode a frame). So a record is a JSON object ``{"version", "entries", "mac"}``
whose ``mac`` is the HMAC-SHA256 of its file name, version and entries (a record signed as one kind is
no record of another); one without a valid MAC reads as empty, and nothing is written through a
symlinked folder the record lives in (or the two above it).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from pathlib import Path

from .errors import UnibakeError
from .files import linked_above, read_small_file, write_atomic


def mac(key: bytes, name: str, version: int, entries: dict) -> str:
    text = json.dumps({"record": name, "version": version, "entries": entries}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def read_signed(folder: Path, name: str, key: bytes, version: int, *, limit: int) -> dict:
    """The entries of the record ``folder/name``; empty when there is none, or it is unreadable, of
    another version or not signed with ``key``."""
    try:
        raw = json.loads(read_small_file(folder / name, UnibakeError, limit=limit, follow=False))
        entries, signature = raw["entries"], raw["mac"]
        if raw.get("version") != version or not isinstance(entries, dict) or not isinstance(signature, str) \
                or not hmac.compare_digest(signature, mac(key, name, version, entries)):
            return {}
        return entries
    except (UnibakeError, OSError, ValueError, KeyError, TypeError, RecursionError):  # none yet, unreadable, not signed
        # (RecursionError: JSON nested deeper than the stack, which json.loads raises before any check)
        return {}


def write_signed(folder: Path, name: str, key: bytes, version: int, entries: dict, *, limit: int) -> None:
    """The record ``folder/name`` written, signed, through a temporary file; refused (``UnibakeError``) when
    ``folder`` or one of the two folders above it is a symlink (a checkout's link would have it written
    wherever the link points). ``entries`` in their order, the newest first: as many of them as the record can
    hold within ``limit`` bytes, the size :func:`read_signed` reads (past it, the whole record was read as none)."""
    linked = linked_above(folder)
    if linked is not None:
        raise UnibakeError(f"{linked} is a symlink")
    folder.mkdir(parents=True, exist_ok=True)

    def text(count: int) -> str:  # (its MAC is of the entries' sorted form)
        kept = dict(itertools.islice(entries.items(), count))
        return json.dumps({"version": version, "entries": kept, "mac": mac(key, name, version, kept)})

    written = text(len(entries))
    if len(written.encode()) > limit:  # the most of the newest that fit, found by halving
        low, high = 0, len(entries)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if len(text(middle).encode()) <= limit else (low, middle - 1)
        written = text(low)
    write_atomic(folder, name, written)
