"""Rewrite a layer tar's headers in a stream, without changing its length.

Used by the normalise stage: every time in the layers unibake adds becomes ``epoch`` and owner
names become empty, so identical inputs give identical layers however and whenever they were
built. Only headers (and PAX time records) change, and each keeps its size, so the rewritten
layer is exactly as long as the original: it can be written into another tar stream before its
new digest is known, one block at a time, never held in memory. Python's ``tarfile`` can read
and write tars but not rewrite one in place as a stream, hence this small block-level walker.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

BLOCK = 512
CHUNK = 1 << 20
PAX_TIME_KEYS = (b"mtime", b"atime", b"ctime")
PAX_RECORD_RE = re.compile(rb"(\d+) ")


class LayerFormatError(ValueError):
    """The layer is not a tar this rewriter understands."""


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        data = stream.read(n - got)
        if not data:
            raise LayerFormatError(f"the layer ends early ({n - got} bytes missing)")
        parts.append(data)
        got += len(data)
    return b"".join(parts) if len(parts) != 1 else parts[0]


def _number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for values that do not fit in octal
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1) - 1)) * 2 if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum_ok(header: bytes) -> bool:
    return _number(header[148:156]) == sum(header[:148]) + 8 * 32 + sum(header[156:])


def _rewrite_header(header: bytes, epoch: int) -> bytes:
    h = bytearray(header)
    h[136:148] = b"%011o\0" % epoch
    h[265:297] = bytes(32)  # uname
    h[297:329] = bytes(32)  # gname
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _rewrite_pax(data: bytes, size: int, epoch: int) -> bytes:
    """PAX records with every time set to ``epoch``; each record keeps its length (leading zeros)."""
    out, pos = bytearray(), 0
    while pos < size:
        m = PAX_RECORD_RE.match(data, pos)
        if not m:
            raise LayerFormatError("malformed PAX header")
        length = int(m.group(1))
        record = data[pos:pos + length]
        key, _, value = record[len(m.group(0)):-1].partition(b"=")
        if key in PAX_TIME_KEYS:
            wanted = str(epoch).encode()
            if len(wanted) > len(value):
                raise LayerFormatError(f"a PAX {key.decode()} record is too short to hold {epoch}")
            record = record[:len(m.group(0))] + key + b"=" + wanted.rjust(len(value), b"0") + b"\n"
        out += record
        pos += length
    return bytes(out) + data[size:]


def _path(header: bytes, long_name: bytes | None) -> str:
    if long_name is not None:
        return long_name.decode("utf-8", "replace")
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0" and header[345]:
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return name.decode("utf-8", "replace")


def _pax_path(data: bytes, size: int) -> bytes | None:
    pos = 0
    while pos < size:
        m = PAX_RECORD_RE.match(data, pos)
        if not m:
            return None
        length = int(m.group(1))
        key, _, value = data[pos + len(m.group(0)):pos + length - 1].partition(b"=")
        if key == b"path":
            return value
        pos += length
    return None


def _entry(header: bytes, data: bytes, epoch: int, rewrite: bool) -> bytes:
    """A header and its metadata (PAX, long name) as they go out: normalised, or untouched."""
    if not rewrite:
        return header + data
    if header[156:157] in (b"x", b"g"):
        data = _rewrite_pax(data, _number(header[124:136]), epoch)
    return _rewrite_header(header, epoch) + data


class LayerRewrite:
    """Iterate to get the layer of ``size`` bytes from ``stream``, normalised if it belongs under ``owned``.

    A layer belongs to unibake when its first entry that is not a parent folder of ``owned``
    (``opt/`` for ``opt/unibake``) lies under ``owned``; other layers (the base image's) pass
    through byte for byte. ``ours`` is known once the first chunk has been yielded. Yields
    exactly ``size`` bytes.
    """

    def __init__(self, stream: BinaryIO, size: int, *, epoch: int, owned: str):
        self.stream, self.size, self.epoch = stream, size, epoch
        self.owned = owned.strip("/")
        self.ours: bool | None = None

    def __iter__(self) -> Iterator[bytes]:
        owned, stream, epoch = self.owned, self.stream, self.epoch
        parents = {"/".join(owned.split("/")[:i]) for i in range(1, owned.count("/") + 1)}
        remaining = self.size
        held: list[tuple[bytes, bytes]] = []  # entries seen before the layer's owner is known
        long_name: bytes | None = None

        def emit(data: bytes) -> bytes:
            nonlocal remaining
            remaining -= len(data)
            if remaining < 0:
                raise LayerFormatError("the layer is longer than its archive entry says")
            return data

        while remaining > 0:
            if self.ours is False or (held and held[-1][0] == bytes(BLOCK)):
                self.ours = bool(self.ours)
                for header, data in held:
                    yield emit(header + data)
                held = []
                while remaining > 0:  # not ours, or the end-of-archive zeros: copy the rest as it is
                    yield emit(_read_exact(stream, min(CHUNK, remaining)))
                break
            header = _read_exact(stream, BLOCK)
            if header == bytes(BLOCK):
                held.append((header, b""))
                continue
            if not _checksum_ok(header):
                raise LayerFormatError("a layer header has a bad checksum")
            kind = header[156:157]
            member_size = _number(header[124:136])
            padded = (member_size + BLOCK - 1) // BLOCK * BLOCK
            if kind in (b"x", b"g", b"L", b"K"):  # metadata for the next entry: small, read whole
                data = _read_exact(stream, padded)
                if kind == b"L":
                    long_name = data[:member_size].rstrip(b"\0")
                elif kind == b"x":
                    long_name = _pax_path(data, member_size) or long_name
                if self.ours is None:
                    held.append((header, data))
                else:
                    yield emit(_entry(header, data, epoch, self.ours))
                continue
            path = _path(header, long_name).removeprefix("./").rstrip("/")
            long_name = None
            if self.ours is None:
                if path in parents and not padded:
                    held.append((header, b""))
                    continue
                self.ours = path == owned or path.startswith(owned + "/")
                for h, d in held:
                    yield emit(_entry(h, d, epoch, self.ours))
                held = []
            yield emit(_rewrite_header(header, epoch) if self.ours else header)
            left = padded
            while left:
                block = _read_exact(stream, min(CHUNK, left))
                left -= len(block)
                yield emit(block)
        if self.ours is None:
            self.ours = False
        for header, data in held:
            yield emit(header + data)
