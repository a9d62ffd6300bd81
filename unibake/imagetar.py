"""Every tar this tool reads or rewrites, through one walker.

* :class:`TarWalker` parses a tar stream block by block as chunks arrive (push, not pull), without
  copying the members' content: ``docker save`` streams, our own archives, and the layers inside
  them (normalise rewrites their headers, repro lists their entries). Python's ``tarfile`` copies
  every byte three times on its way and cannot rewrite a stream in place, hence this walker;
  the field rules of each 512-byte header stay the standard library's: :func:`parse_header` reads
  the common case itself and hands every other header to :meth:`tarfile.TarInfo.frombuf`.
* :func:`pax_records` is the one PAX parser; :func:`tar_header` the one header writer.
* :class:`LayerRewriter` sets every time in a layer's headers to an epoch and empties owner names,
  keeping every header's length, so a rewritten layer is exactly as long as the original.
* :func:`read_members` reads a ``docker save`` stream, or one of our archives, in one pass:
  every member hashed, small metadata kept, large members routed elsewhere (a compressor, a
  rewriter); :func:`interpret` then recomputes the image's identity from what was read, in both
  layouts: Engine 20.10's (``manifest.json``, ``<id>.json``, ``<id>/layer.tar``) and the OCI
  layout of Engine 25+ (``oci-layout``, ``index.json``, ``blobs/sha256/<hex>``).
"""

from __future__ import annotations

import hashlib
import json
import operator
import posixpath
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import zstandard

from .errors import ArchiveError, LayerFormatError, VerificationError
from .platforms import of_config
from .threads import hashing_thread

BLOCK = tarfile.BLOCKSIZE
CHUNK = 1 << 20
MAX_TRAILING = 1 << 20  # zeros after a tar's first end-of-archive block
ZSTD_MAX_RATIO = 1100  # gzip's is 1032: a zstd member decompressing to more is no layer (and no zstd layer loads)
KEEP_LIMIT = 16 << 20  # metadata files (configs, manifests) and extended headers are kept up to this size
KEEP_TOTAL = 64 << 20  # and all of them together: a tiny archive of many "metadata" members stays cheap
# how deep a metadata file's arrays and objects may nest: Go's encoding/json (the engine's) reads 10000
# levels, Python's json fewer (its recursion limit, which depends on the caller); both verifiers refuse more
# than this, which no image's metadata comes near
MAX_NESTING = 256
MAX_EXTENDED = 16  # extended headers (PAX, GNU long names) before one member: writers make one to three
# a JSON string, or one that never closes (then to the end: the text is no JSON anyway, and json.loads says so);
# without that end, each '"' of an unclosed string began a match that scanned to the end: quadratic (a 100 kB
# manifest of '\\"' took 30 s, 1 MB an hour)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# entries of an image archive (a layer is 4 in the docker layout: 127 layers make about 520): each one read
# is remembered (about 1 KiB), so a tiny archive of a million empty entries would take a GiB
MAX_ENTRIES = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# what Engine 20.10's load also decompresses a layer from (moby's archive.DetectCompression: bzip2 by its first
# three bytes alone, xz by six), and unibake neither writes nor reads
OTHER_COMPRESSION = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
PAX_TIME_KEYS = ("mtime", "atime", "ctime")
DIGITS_RE = re.compile(r"^[0-9]{1,20}$")


# ---------------------------------------------------------------------------------------------
# The walker


@dataclass(frozen=True, kw_only=True)
class TarEntry:
    """One entry as the walker saw it: its parsed fields and its raw header blocks."""

    name: str  # after GNU long names and PAX paths; not yet checked for safety
    type: bytes
    size: int  # bytes of content that follow the header (0 for links, folders and devices)
    linkname: str
    mode: int
    uid: int
    gid: int
    mtime: int
    extended: tuple[tuple[bytes, bytes], ...]  # (header block, padded data) of each extended header
    header: bytes  # the entry's own header block


class TarVisitor(Protocol):
    def begin(self, entry: TarEntry) -> None: ...

    def data(self, piece: memoryview) -> None: ...

    def end(self) -> None: ...

    def raw(self, piece: memoryview) -> None:
        """Bytes that are neither a header nor content: padding and the end-of-archive blocks."""


def pax_records(data: bytes, what: str = "the archive") -> dict[str, str]:
    """The records of a PAX extended header (``LENGTH KEY=VALUE\\n``...); strict."""
    records, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos, pos + 21)
        if space < 0 or not data[pos:space].isdigit():
            raise ArchiveError(f"{what} has a malformed PAX header: corrupted archive")
        length = int(data[pos:space])
        record = data[space + 1:pos + length]
        if length <= space - pos + 1 or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError(f"{what} has a malformed PAX header: corrupted archive")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


@dataclass(frozen=True, slots=True)
class Header:
    """The fields of one header block that the walker uses, as ``tarfile`` reads them."""

    name: str
    type: bytes
    size: int
    linkname: str
    mode: int
    uid: int
    gid: int
    mtime: int


_NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337), (337, 345))
_UTF8 = ("utf-8", "surrogateescape")


def _text(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode(*_UTF8)


# a header's numbers: where they are, and how long
NUMBERS = (("mode", 100, 8), ("uid", 108, 8), ("gid", 116, 8), ("size", 124, 12), ("mtime", 136, 12),
           ("checksum", 148, 8), ("devmajor", 329, 8), ("devminor", 337, 8))


def _go_number(field: bytes) -> int | None:
    """The number Go's archive/tar (the engine's, GNU tar's alike) reads from a header field, as its
    ``parseNumeric`` does: base-256 when the first byte's high bit is set; else octal digits once blanks
    and NULs are trimmed from both ends, up to a NUL. None where it reads none (the engine then refuses the
    whole tar). ``tarfile`` reads otherwise: it cuts the field at its first NUL, so b"\\0" + b"0000001000"
    is 0 to it and 512 to the engine, and it reads more ("+7", "0o7", a tab)."""
    if field[:1] and field[0] & 0x80:
        inverse = 0xFF if field[0] & 0x40 else 0
        value = 0
        for i, c in enumerate(field):
            c ^= inverse
            if i == 0:
                c &= 0x7F
            if value >> 56:
                return None
            value = value << 8 | c
        if value >> 63:
            return None
        return ~value if inverse else value
    digits = field.strip(b" \0").split(b"\0", 1)[0]
    if not all(0x30 <= c <= 0x37 for c in digits):
        return None
    return int(digits or b"0", 8)


_FIRST_BYTES = operator.itemgetter(*(at for _, at, _ in NUMBERS))


def engine_reads_otherwise(block: bytes) -> str:
    """Which number field of a header block the engine reads as another number than ``tarfile`` (and so
    :func:`parse_header`) does, or reads as none: a header whose size is 0 to us and 512 to the engine hides
    the members it takes as that content from every check, and shows the engine members no check saw. ""
    when it reads every one alike. Every field beginning with an octal digit (as every writer's do) is read
    alike, so only other headers are read twice."""
    firsts = _FIRST_BYTES(block)
    if 0x30 <= min(firsts) and max(firsts) <= 0x37:
        return ""
    for (what, at, length), first in zip(NUMBERS, firsts):
        if 0x30 <= first <= 0x37:
            continue
        field = block[at:at + length]
        if not field.strip(b" \0"):
            continue  # blanks and NULs alone (Python's tarfile writes a file's devmajor so): 0 to both
        try:
            ours: int | None = tarfile.nti(field)
        except (tarfile.HeaderError, ValueError):
            ours = None
        theirs = _go_number(field)
        if theirs != ours:
            return (f"its {what} field {field!r}, which the engine reads as "
                    f"{'no number' if theirs is None else theirs} and Python's tarfile as "
                    f"{'no number' if ours is None else ours}")
    return ""


def parse_header(block: bytes) -> Header:
    """One header block's fields, exactly as :meth:`tarfile.TarInfo.frombuf` gives them.

    Written here because ``frombuf`` is what a layer's walk spends most of its Python time on
    (51,000 headers in a 2.5 GB image of libraries: 2.3 CPU-seconds, about 45 us each: it parses
    every field and sums the block twice through tuples). This reads the same fields for the
    common header (octal numbers, the unsigned checksum) in about a third of that; any other
    header (base-256 numbers, a signed checksum, GNU sparse, anything odd) goes to ``frombuf``
    itself, so its rules and its errors (:class:`tarfile.HeaderError`) stay the only ones.
    ``tests/unit/test_fuzz.py`` holds the two to the same answers on generated headers.
    """
    try:
        numbers = []
        for start, stop in _NUMBERS:
            field = block[start:stop]
            end = field.find(b"\0")
            numbers.append(int((field if end < 0 else field[:end]) or b"0", 8))
        field = block[148:156]
        end = field.find(b"\0")
        checksum = int((field if end < 0 else field[:end]) or b"0", 8)
        fast = (len(block) == BLOCK and block[156:157] != tarfile.GNUTYPE_SPARSE
                and checksum == 256 + sum(block) - sum(field))
    except ValueError:  # not plain octal: frombuf decides (int() reads bytes as frombuf reads the text)
        fast = False
    if not fast:
        info = tarfile.TarInfo.frombuf(block, *_UTF8)
        return Header(name=info.name, type=info.type, size=info.size, linkname=info.linkname, mode=info.mode,
                      uid=info.uid, gid=info.gid, mtime=int(info.mtime))
    kind = block[156:157]
    name = _text(block[0:100])
    if kind == tarfile.AREGTYPE and name.endswith("/"):
        kind = tarfile.DIRTYPE
    if kind == tarfile.DIRTYPE:
        name = name.rstrip("/")
    prefix = _text(block[345:500])
    if prefix and kind not in tarfile.GNU_TYPES:
        name = prefix + "/" + name
    mode, uid, gid, size, mtime = numbers[:5]
    return Header(name=name, type=kind, size=size, linkname=_text(block[157:257]), mode=mode, uid=uid, gid=gid,
                  mtime=mtime)


def _has_content(kind: bytes) -> bool:
    """Whether the header's size counts content bytes: as tarfile and Go's archive/tar read it."""
    return kind in tarfile.REGULAR_TYPES or kind not in tarfile.SUPPORTED_TYPES


@dataclass(frozen=True)
class Skipped:
    """Bytes of a tar stream not given, only counted: the rest of one member's content, which the reader
    knows by other means (a frame an earlier read back decoded: :mod:`unibake.archive_reader`)."""

    size: int
    name: str = ""  # the member whose content they are said to be
    at: int = 0  # where they lie in the compressed archive (for the error that they are not)

    def __len__(self) -> int:
        return self.size


class TarWalker:
    """Feed a tar stream's bytes in pieces of any size; the visitor hears every entry."""

    def __init__(self, visitor: TarVisitor, what: str = "the archive"):
        self.visitor, self.what = visitor, what
        self._header = bytearray()
        self._extended: list[tuple[bytes, bytes]] = []
        self._meta: bytearray | None = None  # an extended header's data being read (padded)
        self._meta_header = b""
        self._meta_size = 0
        self._meta_total = 0  # with its padding
        self._pax: dict[str, str] = {}
        self._long: dict[bytes, str] = {}
        self._remaining = 0  # content bytes of the current entry still to come
        self._pad = 0  # padding still to pass
        self._in_entry = False
        self._zeros = False  # past the first end-of-archive block: only zeros may follow
        self._trailing = 0  # and how many, after the block that began them
        self.headers = 0
        self.fed = 0  # bytes fed before the current piece
        self.content_at = 0  # where in the stream the content of the entry last begun begins

    def feed(self, chunk) -> None:
        view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
        pos, end = 0, len(view)
        try:
            self._walk(view, pos, end)
        finally:
            self.fed += end

    def skip(self, skipped: Skipped) -> None:
        """Pass over bytes not given: the whole content of the entry whose header was just read, none of it
        fed yet. The visitor's ``skipped`` hears it instead of ``data`` (and refuses what it cannot take)."""
        size = skipped.size
        whole = bool(self._remaining) and size == self._remaining and self.fed == self.content_at
        self.visitor.skipped(skipped, whole)
        self._remaining = 0
        self.fed += size
        self._finish_entry()

    def _walk(self, view: memoryview, pos: int, end: int) -> None:
        visitor = self.visitor
        while pos < end:
            if self._remaining:
                n = min(self._remaining, end - pos)
                visitor.data(view[pos:pos + n])
                self._remaining -= n
                pos += n
                if not self._remaining:
                    self._finish_entry()
            elif self._pad:
                n = min(self._pad, end - pos)
                visitor.raw(view[pos:pos + n])
                self._pad -= n
                pos += n
            elif self._meta is not None:
                n = min(self._meta_total - len(self._meta), end - pos)
                self._meta += view[pos:pos + n]
                pos += n
                if len(self._meta) == self._meta_total:
                    self._finish_meta()
            elif self._zeros:
                rest = view[pos:end]
                if bytes(rest).strip(b"\0"):
                    raise ArchiveError(f"{self.what} has a damaged member header after {self.headers} headers "
                                       "(or data past its end): corrupted archive")
                # a few kB of zeros end a tar (tar programs pad to 10 kB); gigabytes of them, which compress to
                # almost nothing, would be decompressed and read whole before any refusal
                self._trailing += len(rest)
                if self._trailing > MAX_TRAILING:
                    raise ArchiveError(f"{self.what} has more than {MAX_TRAILING >> 20} MiB of zeros after its end: "
                                       "no tar an engine or a tar program writes")
                visitor.raw(rest)
                pos = end
            else:
                n = min(BLOCK - len(self._header), end - pos)
                self._header += view[pos:pos + n]
                pos += n
                if len(self._header) == BLOCK:
                    block, self._header = bytes(self._header), bytearray()
                    self.content_at = self.fed + pos
                    self._on_header(block)

    def _on_header(self, block: bytes) -> None:
        if not block.strip(b"\0"):
            if self._extended:
                raise ArchiveError(f"{self.what} has an extended header that describes no member: corrupted archive")
            self._zeros = True
            self.visitor.raw(memoryview(block))
            return
        try:
            info = parse_header(block)
        except tarfile.HeaderError:
            if not self.headers:
                raise ArchiveError(f"{self.what} is not a valid tar stream: its first block is not a "
                                   "tar header") from None
            raise ArchiveError(f"{self.what} has a damaged member header after {self.headers} headers: "
                               "corrupted archive") from None
        if info.size < 0:  # tarfile reads "-12" (and base-256) as negative: the walk would go backwards
            raise ArchiveError(f"{self.what} has a member header with a negative size ({info.size}) after "
                               f"{self.headers} headers: corrupted archive")
        otherwise = engine_reads_otherwise(block)
        if otherwise:  # the engine would walk another way: other members than every check here saw
            raise ArchiveError(f"{self.what} has a member header (after {self.headers} headers) whose fields the "
                               f"engine reads otherwise: {otherwise}; refused, as the engine would unpack "
                               "other members than those checked")
        self.headers += 1
        if info.type in EXTENDED_TYPES:
            if info.size > KEEP_LIMIT:
                raise ArchiveError(f"{self.what} has an oversized extended header: corrupted archive")
            # each is kept until the member it describes: stacked without end, they were all held (64 of 16 MiB,
            # 37 kB compressed, took a GiB); a member has a PAX header, a global one, a GNU long name and link
            if len(self._extended) >= MAX_EXTENDED or sum(len(d) for _, d in self._extended) + info.size > KEEP_LIMIT:
                raise ArchiveError(f"{self.what} has more than {MAX_EXTENDED} extended headers, or more than "
                                   f"{KEEP_LIMIT >> 20} MiB of them, before one member (after {self.headers} headers), "
                                   "which no tar writer makes: corrupted archive")
            self._meta, self._meta_header, self._meta_size = bytearray(), block, info.size
            self._meta_total = info.size + (-info.size % BLOCK)
            if not info.size:
                self._finish_meta()
            return
        pax, self._pax = self._pax, {}
        size = info.size
        if "size" in pax:
            if not DIGITS_RE.fullmatch(pax["size"]):
                raise ArchiveError(f"{self.what} has a PAX size {pax['size'][:30]!r} that is not a whole "
                                   "number: corrupted archive")
            size = int(pax["size"])
        name = self._long.pop(tarfile.GNUTYPE_LONGNAME, None) or pax.get("path") or info.name
        linkname = self._long.pop(tarfile.GNUTYPE_LONGLINK, None) or pax.get("linkpath") or info.linkname
        if not _has_content(info.type):
            size = 0
        entry = TarEntry(name=name, type=info.type, size=size, linkname=linkname, mode=info.mode, uid=info.uid,
                         gid=info.gid, mtime=info.mtime, extended=tuple(self._extended), header=block)
        self._extended = []
        self._in_entry = True
        self.visitor.begin(entry)
        self._remaining = size
        self._pad = -size % BLOCK
        if not size:
            self._finish_entry()

    def _finish_meta(self) -> None:
        data, self._meta = bytes(self._meta), None
        kind = self._meta_header[156:157]
        self._extended.append((self._meta_header, data))
        content = data[:self._meta_size]
        if kind == tarfile.XHDTYPE:
            self._pax = pax_records(content, self.what)
        elif kind in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            self._long[kind] = content.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")

    def _finish_entry(self) -> None:
        self._in_entry = False
        self.visitor.end()

    def close(self) -> None:
        """The stream ended: refuse a cut member or a missing end-of-archive marker."""
        if self._remaining or self._meta is not None:
            missing = self._remaining if self._meta is None else self._meta_total - len(self._meta)
            raise ArchiveError(f"{self.what} ends in the middle of a member ({missing} bytes missing): "
                               "truncated download?")
        if self._header or not self._zeros:
            raise ArchiveError(f"{self.what} ends early (no end-of-archive marker): truncated download?")


# ---------------------------------------------------------------------------------------------
# Writing headers, and rewriting them in place


USTAR_SIZES = 8 ** 11  # ustar's size field holds 11 octal digits: members of 8 GiB and more need another form


def tar_header(name: str, size: int, *, directory: bool = False) -> bytes:
    """Our one header form: root, no owner names, mtime 0, PAX for a name ustar cannot hold.

    A size of 8 GiB or more (a big layer) goes in the size field itself as a base-256 number
    (GNU's form, which Go's archive/tar in the engine, GNU tar, busybox tar and Python all read in
    any header), not in a PAX record: busybox tar ignores a PAX size, so such a member would list
    otherwise there, and the shell verifier refuses every header its tar's listing does not show.
    Hand-patched because ``tarfile`` writes base-256 only in its GNU form, whose long names differ."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if directory else (tarfile.REGTYPE, 0o644)
    if size < USTAR_SIZES:
        return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
    info.size = 0
    block = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
    header = bytearray(block[-BLOCK:])  # the member's own header, after any PAX record of its name
    header[124:136] = tarfile.itn(size, 12, tarfile.GNU_FORMAT)
    header[148:156] = b" " * 8
    header[148:155] = b"%06o\0" % sum(header)  # the checksum as tarfile writes it, its eighth byte a space
    return block[:-BLOCK] + bytes(header)


def tar_padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


def without_members(source: Iterable[bytes], drop: frozenset[str]) -> Iterator[bytes]:
    """The tar stream ``source`` less the regular files named in ``drop`` (header, content, padding).

    For a load into an engine that already holds those files' layers (a manifest may name a layer
    the engine holds without carrying it). At the first header it does not read, everything from
    there on passes as it is (:func:`filter_members`), so the stream stays a valid tar and at worst
    leaves out less.
    """
    return filter_members(source, lambda name: DROP if name in drop else PASS)


PASS, DROP, CAPTURE = "pass", "drop", "capture"


def filter_members(source: Iterable[bytes], choose: Callable[[str], str], *, strict: str = "",
                   captured: dict[str, bytes] | None = None, capture_limit: int = 0) -> Iterator[bytes]:
    """The tar stream ``source`` with each file, folder or link passed on as it is (header, content,
    padding), left out, or left out with its content put in ``captured``, as ``choose(name)`` says
    (PASS, DROP, CAPTURE; a capture over ``capture_limit`` bytes is an error).

    Only plain headers are read. Without ``strict``: at the first extended header (PAX, GNU long
    name), a header that does not parse, or the end-of-archive blocks, everything from there on passes
    as it is. With ``strict`` (what the stream is, for the error): those are errors, as are links; the
    end-of-archive blocks end the stream without being passed on (the caller writes more members after),
    and a stream that ends without them fails.
    Hand-written: ``tarfile`` cannot pass on a member it reads without holding or re-reading it.
    """
    buf = bytearray()
    todo = size = 0  # bytes of the current member still to pass on or skip; its content's size
    choice, name = PASS, ""
    grabbed = bytearray()
    filtering = True
    plain = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE) + (() if strict else (tarfile.SYMTYPE, tarfile.LNKTYPE))
    for chunk in source:
        if not filtering:
            yield chunk
            continue
        buf += chunk
        out = bytearray()
        while True:
            if todo:
                n = min(todo, len(buf))
                if choice == PASS:
                    out += buf[:n]
                elif choice == CAPTURE:
                    grabbed += buf[:n]
                del buf[:n]
                todo -= n
                if todo:
                    break
                if choice == CAPTURE:
                    captured[name] = bytes(grabbed[:size])
                continue
            if len(buf) < BLOCK:
                break
            block = bytes(buf[:BLOCK])
            try:
                header = parse_header(block) if any(block) else None
            except tarfile.HeaderError:
                if strict:
                    raise ArchiveError(f"{strict} has a header that does not parse") from None
                header = None
            if header is None and strict:
                if out:
                    yield bytes(out)
                return  # the end of the archive
            if header is None or header.type not in plain:
                if strict:
                    raise ArchiveError(f"{strict} holds {header.name!r}, which is no file or folder")
                filtering = False
                out += buf
                buf.clear()
                break
            name = header.name
            size = header.size if _has_content(header.type) else 0
            choice = choose(name)
            if choice == CAPTURE:
                if size > capture_limit:
                    raise ArchiveError(f"{strict or 'the stream'}'s {name} is over {capture_limit} bytes")
                grabbed = bytearray()
            elif choice == PASS:
                out += block
            del buf[:BLOCK]
            todo = size + -size % BLOCK
            if choice == CAPTURE and not todo:
                captured[name] = b""
        if out:
            yield bytes(out)
    if strict:
        raise ArchiveError(f"{strict} ends without its end-of-archive blocks")
    if buf:
        yield bytes(buf)


def rewrite_header(block: bytes, epoch: int) -> bytes:
    """A header block with its mtime set to ``epoch``, owner names emptied, checksum recomputed."""
    h = bytearray(block)
    h[136:148] = b"%011o\0" % epoch
    h[265:297] = bytes(32)  # uname
    h[297:329] = bytes(32)  # gname
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def rewrite_pax_times(data: bytes, size: int, epoch: int) -> tuple[bytes, int]:
    """PAX records (``data``: ``size`` bytes of records, then padding) with every time set to
    ``epoch``; returns the new data, padded as before, and the new size of the records.

    A record keeps its length where the time fits (leading zeros); one that must grow may, as long
    as the records still fit in the padded blocks they had, so the layer keeps its length."""
    records = pax_records(data[:size], "a layer")
    out = bytearray()
    for key, value in records.items():
        if key in PAX_TIME_KEYS:
            wanted = str(epoch)
            value = wanted.rjust(len(value), "0") if len(value) >= len(wanted) else wanted
        out += _pax_record(key, value)
    if len(out) > len(data):
        raise LayerFormatError(f"the PAX times of an entry cannot be set to {epoch} without growing the layer")
    return bytes(out) + bytes(len(data) - len(out)), len(out)


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode("utf-8", "surrogateescape")
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def rewrite_extended(header: bytes, data: bytes, epoch: int) -> bytes:
    """An extended header block and its padded data, normalised: PAX times set (the header's size
    follows the records), the header's own time and owner names too."""
    kind = header[156:157]
    if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE):
        data, size = rewrite_pax_times(data, _size(header), epoch)
        header = header[:124] + b"%011o\0" % size + header[136:]
    return rewrite_header(header, epoch) + data


class LayerRewriter:
    """A layer's bytes in, the same layer out with every time ``epoch`` and owner names empty,
    when it belongs under ``owned``; otherwise nothing comes out.

    A layer belongs to unibake when its first entry that is not a parent folder of ``owned``
    (``opt/`` for ``opt/unibake``) lies under ``owned``. ``ours`` is known once that entry (or
    the end) has been seen; until then the entries are held (a few header blocks at most).
    ``emit`` receives the output, exactly as many bytes as came in.
    """

    def __init__(self, *, epoch: int, owned: str, emit: Callable[[bytes | memoryview], None]):
        self.epoch, self.emit = epoch, emit
        self.owned = owned.strip("/")
        self._parents = {"/".join(self.owned.split("/")[:i]) for i in range(1, self.owned.count("/") + 1)}
        self.ours: bool | None = None
        self._held: list[bytes | memoryview] = []
        self._walker = TarWalker(self, "a layer")

    def write(self, piece: memoryview) -> None:
        if self.ours is False:
            return
        try:
            self._walker.feed(piece)
        except ArchiveError as exc:
            raise LayerFormatError(str(exc)) from None

    def close(self) -> None:
        if self.ours is None:
            self.ours, self._held = False, []
        if self.ours:
            try:
                self._walker.close()
            except ArchiveError as exc:
                raise LayerFormatError(str(exc)) from None

    def _out(self, data: bytes | memoryview) -> None:
        if self.ours:
            self.emit(data)
        elif self.ours is None:
            self._held.append(bytes(data))

    def _decide(self, ours: bool) -> None:
        self.ours = ours
        held, self._held = self._held, []
        if ours:
            for piece in held:
                self.emit(piece)

    def begin(self, entry: TarEntry) -> None:
        path = entry.name.removeprefix("./").rstrip("/")
        if self.ours is None and not (path in self._parents and not entry.size):
            # held entries were written unchanged; rewrite them now that the layer is ours
            self._decide(path == self.owned or path.startswith(self.owned + "/"))
            if not self.ours:
                return
        if self.ours is False:
            return
        out = b"".join(rewrite_extended(h, d, self.epoch) for h, d in entry.extended)
        self._out(out + rewrite_header(entry.header, self.epoch))

    def data(self, piece: memoryview) -> None:
        self._out(piece)

    def end(self) -> None:
        pass

    def raw(self, piece: memoryview) -> None:
        if self.ours is None and not bytes(piece).strip(b"\0"):
            self._decide(False)  # the end of the layer before any entry of ours
            return
        self._out(piece)


def looks_like_layer(name: str, head: bytes) -> bool:
    """Whether a save stream's member is a layer: by its name, or (OCI blobs) by a tar header first."""
    if name.endswith("/layer.tar"):
        return True
    if name.startswith("blobs/sha256/") and len(head) == BLOCK:
        try:
            tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
            return True
        except tarfile.HeaderError:
            return False
    return False


def _size(header: bytes) -> int:
    return tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape").size


# ---------------------------------------------------------------------------------------------
# A layer's entries (repro)


LayerListing = dict  # path -> (type, mode, uid, gid, mtime, size, sha256, linkname)


class LayerLister:
    """A layer's bytes in; ``close()`` gives every entry with the digest of its content, when the
    layer's own digest is ``wanted`` (``sha256:...``), else None: one listing in memory at a time."""

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted
        self.listing: LayerListing = {}
        self.digest = hashlib.sha256()
        self._current: tuple[TarEntry, object] | None = None
        self._walker = TarWalker(self, "a layer")

    def write(self, piece: memoryview) -> None:
        self.digest.update(piece)
        self._walker.feed(piece)

    def close(self) -> LayerListing | None:
        if f"sha256:{self.digest.hexdigest()}" != self.wanted:
            return None
        self._walker.close()
        return self.listing

    def begin(self, entry: TarEntry) -> None:
        self._current = (entry, hashlib.sha256())

    def data(self, piece: memoryview) -> None:
        self._current[1].update(piece)

    def end(self) -> None:
        entry, h = self._current
        digest = h.hexdigest() if entry.type in tarfile.REGULAR_TYPES else ""
        self.listing[entry.name.removeprefix("./")] = (entry.type.decode(), oct(entry.mode), entry.uid, entry.gid,
                                                       entry.mtime, entry.size, digest, entry.linkname)

    def raw(self, piece: memoryview) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# docker save archives


class Sink(Protocol):
    def write(self, piece: memoryview) -> None: ...

    def close(self) -> object: ...


Route = Callable[[str, int, bytes], "Sink | None"]
Keep = Callable[[str, int, bytes], bool]


def keep_json(name: str, size: int, head: bytes) -> bool:
    """Keep what can be metadata (JSON, which may start with blanks, as the engine reads it); hash the rest."""
    first = head.lstrip(b" \t\r\n")
    return first[:1] in (b"{", b"[") or not first


@dataclass(frozen=True, kw_only=True)
class Member:
    name: str
    size: int
    sha256: str  # of the bytes as stored
    content_sha256: str  # of the uncompressed content (the diffID for a layer)
    data: bytes | None  # kept when small and not routed
    link: str | None = None  # for a symlink or hard link: the member it points at
    routed: object = None  # what the route's sink returned when the member was complete
    zstd: bool = False  # a zstd stream, as far as it was read (its content_sha256 what that decompresses to)
    compression: str = ""  # another format an engine decompresses a layer from, by its first bytes ("xz", "bzip2")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where an image's parts are in an archive: the layout, the config and the layers, by name."""

    layout: str  # "docker" or "oci"
    config_name: str
    layer_names: tuple[str, ...]
    repo_tags: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SavedImage:
    """What an archive says about its image, recomputed from its bytes."""

    layout: str  # "docker" or "oci"
    image_id: str  # sha256:<hex> of the config
    diff_ids: tuple[str, ...]
    repo_tags: tuple[str, ...]
    config: dict
    members: int
    config_bytes: bytes = b""
    layer_members: tuple[Member | None, ...] = ()  # each layer's member, links resolved; None if omitted


def safe_name(name: str) -> str:
    if name.startswith("/") or "\\" in name:
        raise ArchiveError(f"archive member {name!r} has an absolute or unsafe path")
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        raise ArchiveError(f"archive member {name!r} points outside the archive")
    return "" if norm == "." else norm


@dataclass
class _Open:
    """A member being read."""

    name: str
    size: int
    raw: object = field(default_factory=hashlib.sha256)
    content: object = None  # a second hash, of the uncompressed content, for compressed blobs
    decomp: object = None
    kept: list | None = None
    sink: Sink | None = None
    head: bytearray = field(default_factory=bytearray)
    started: bool = False
    zstd: bool = False
    compression: str = ""
    at: int = 0  # where its content begins in the stream
    hashed: bool = True
    fed: int = 0  # bytes given to the decompressor


class _MemberReader:
    """The visitor behind :func:`read_members`."""

    def __init__(self, route: Route | None, keep: Keep, hasher, unhashed: Mapping[str, str]):
        self.route, self.keep, self.hasher, self.unhashed = route, keep, hasher, unhashed
        self.walker: TarWalker | None = None
        self.done: list[tuple[_Open, object]] = []
        self.links: dict[str, str] = {}
        self.seen: set[str] = set()
        self.directories: set[str] = set()
        self.entries = 0
        self.kept_bytes = 0
        self.current: _Open | None = None
        self.odd = ""
        self.after = 0  # bytes of padding and end blocks since the last entry's content
        self.last_size = 0

    def _form(self, entry: TarEntry) -> str:
        """What makes an entry's headers other than the one plain ustar header our writer gives it (a
        tar that reads an extended header, a name prefix or a name another way loads something else)."""
        if entry.extended:
            return "an extended header (PAX or GNU)"
        block = entry.header
        for what, at, length in NUMBERS:
            if _go_number(block[at:at + length]) is None:
                return f"a header whose {what} field {block[at:at + length]!r} is no number the engine reads"
        if entry.type == tarfile.DIRTYPE and tarfile.nti(block[124:136]):  # (content the engine reads as headers
            # after a '\0' kind, which GNU and busybox tar skip)
            return "a folder header with a size"
        prefix = _text(block[345:500])
        if prefix and block[257:265] != b"ustar\x0000":
            return f"a name prefix {prefix[:40]!r} under another magic than ustar's, which GNU tar reads as none"
        written = f"{prefix}/{_text(block[0:100])}" if prefix else _text(block[0:100])
        try:
            plain = safe_name(written) + ("/" if entry.type == tarfile.DIRTYPE else "")
        except ArchiveError:
            return ""  # named by the caller
        return "" if written == plain else f"the name {written[:100]!r}, not written plainly"

    def end_form(self) -> str:
        end = self.after - (-self.last_size % BLOCK)
        return "" if end == 2 * BLOCK else f"{end} bytes after its last entry, not the two zero blocks of a tar's end"

    def begin(self, entry: TarEntry) -> None:
        self.entries += 1
        self.odd = self.odd or self._form(entry)
        self.after, self.last_size = 0, entry.size
        if self.entries > MAX_ENTRIES:  # each is remembered: a tiny archive of empty entries must not eat memory
            raise ArchiveError(f"the archive holds more than {MAX_ENTRIES} entries: not an image archive")
        name = safe_name(entry.name)
        if entry.type == tarfile.DIRTYPE and name:
            if name in self.seen:
                raise ArchiveError(f"archive member {name!r} appears twice (as a file and as a folder)")
            if name in self.directories:  # as the shell verifier refuses it: a member twice
                raise ArchiveError(f"archive member {name!r} appears twice")
            self.directories.add(name)
        elif name:
            if name in self.seen or name in self.directories:  # a reader and an engine could take different
                raise ArchiveError(f"archive member {name!r} appears twice")  # copies: neither is taken
            self.seen.add(name)
        if entry.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            if entry.linkname.startswith("/"):
                raise ArchiveError(f"archive member {name!r} links to an absolute path {entry.linkname!r}")
            target = entry.linkname if entry.type == tarfile.LNKTYPE else \
                posixpath.join(posixpath.dirname(name), entry.linkname)
            self.links[name] = safe_name(target)
            return
        if entry.type == tarfile.DIRTYPE or not name:
            return
        if entry.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):  # docker load refuses a contiguous file ('7') too
            raise ArchiveError(f"archive member {name!r} is not a regular file, folder or link")
        self.current = _Open(name=name, size=entry.size, at=self.walker.content_at if self.walker else -1)

    def skipped(self, skipped: Skipped, whole: bool) -> None:
        """The current member's content passed over (``whole``: all of it, none fed before): it must be the
        member the caller vouched for there, neither routed nor kept (the record it vouches by is of a plain
        layer that no read back keeps)."""
        m = self.current
        if not whole or m is None or m.started or m.name != skipped.name or m.name not in self.unhashed \
                or self.route is not None or m.size != skipped.size:
            raise VerificationError(f"the archive written does not hold, at byte {skipped.at}, the frame of "
                                    f"{skipped.name} an earlier read back decoded (the member there is another, or its "
                                    "content begins elsewhere)")
        m.started, m.hashed = True, False

    def data(self, piece: memoryview) -> None:
        m = self.current
        if m is None:
            return
        if not m.started:
            m.head += piece
            if len(m.head) < min(BLOCK, m.size):
                return
            self._start(m)
            piece = memoryview(bytes(m.head))
        self._deliver(m, piece)

    def _start(self, m: _Open) -> None:
        """The first bytes decide where the member goes: routed, kept; compressed or not."""
        m.started = True
        first = bytes(m.head[:BLOCK])
        if self.route is not None:
            m.sink = self.route(m.name, m.size, first)
        if m.sink is None and m.size <= KEEP_LIMIT and self.keep(m.name, m.size, first):
            self.kept_bytes += m.size
            if self.kept_bytes > KEEP_TOTAL:
                raise ArchiveError(f"the archive's metadata members add up to more than {KEEP_TOTAL >> 20} MiB: "
                                   "not an image archive")
            m.kept = []
        # a member the caller vouches for is not hashed, when it is what it can vouch for: a plain tar
        m.hashed = m.name not in self.unhashed or first.startswith((GZIP_MAGIC, ZSTD_MAGIC))
        if first.startswith(GZIP_MAGIC):
            m.content = hashlib.sha256()
            m.decomp = _Gunzip(m.content)
        elif first.startswith(ZSTD_MAGIC):
            m.zstd = True
            m.content = hashlib.sha256()
            m.decomp = zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_writer(
                _Updating(m.content, m), write_size=CHUNK, write_return_read=True)
        else:
            m.compression = next((name for magic, name in OTHER_COMPRESSION if first.startswith(magic)), "")

    def _deliver(self, m: _Open, piece: memoryview) -> None:
        if m.hashed:
            self.hasher.put((m.raw, piece))
        if m.sink is not None:
            m.sink.write(piece)
        if m.kept is not None:
            m.kept.append(bytes(piece))
        if m.decomp is not None:
            m.fed += len(piece)
            try:
                m.decomp.write(piece)  # decompressed into m.content a bounded piece at a time
            except (zlib.error, zstandard.ZstdError):
                # not a compressed layer after all: a tar whose first name begins with the magic bytes is
                # the tar Engine 20.10 loads
                m.decomp = m.content = None
                m.zstd = False

    def end(self) -> None:
        m, self.current = self.current, None
        if m is None:
            return
        if not m.started:  # shorter than the bytes looked at first
            self._start(m)
            self._deliver(m, memoryview(bytes(m.head)))
        if isinstance(m.decomp, _Gunzip) and not m.decomp.whole():
            m.decomp = m.content = None  # a gzip stream cut short: not a compressed layer, as an engine reads it
        routed = m.sink.close() if m.sink is not None else None
        self.done.append((m, routed))

    def raw(self, piece: memoryview) -> None:
        self.after += len(piece)


class _Updating:
    """The file a zstd stream writer writes to: each piece it decompresses goes to a hash (``written``: how
    many bytes)."""

    def __init__(self, sink, member: _Open):
        self.sink, self.member = sink, member
        self.written = 0

    def write(self, data) -> int:
        self.sink.update(data)
        self.written += len(data)
        # zstd frames of zeros: a few hundred bytes decompress to hundreds of GiB, all in one write of them,
        # decoded for nothing (a zstd member is refused as a layer, and unreferenced): refused once past what
        # any layer compresses to
        m = self.member
        if self.written > ZSTD_MAX_RATIO * m.fed + CHUNK:
            raise ArchiveError(f"the archive's member {m.name!r} is zstd that decompresses to more than "
                               f"{ZSTD_MAX_RATIO} times its size: no layer (Engine 20.10 loads no zstd layer)")
        return len(data)


class _Gunzip:
    """A gzip blob decompressed into ``sink`` a bounded piece at a time (no decompression bomb in
    memory), as an engine reads a layer: member after member, zero bytes after the last allowed;
    anything else after a member raises ``zlib.error``, and a stream cut short is not ``whole()``."""

    def __init__(self, sink):
        self.sink = sink
        self.member = zlib.decompressobj(wbits=31)
        self.held = b""  # after a member: a byte too few to tell whether another member starts
        self.zeros = False

    def write(self, block) -> None:
        data = bytes(block)
        while data:
            if self.member is None:
                data, self.held = self.held + data, b""
                if self.zeros or data[:1] == b"\0":
                    if data.strip(b"\0"):
                        raise zlib.error("data after the gzip stream's zero bytes")
                    self.zeros = True
                    return
                if len(data) < len(GZIP_MAGIC):
                    self.held = data
                    return
                if not data.startswith(GZIP_MAGIC):
                    raise zlib.error("data after the gzip stream that is not another gzip member")
                self.member = zlib.decompressobj(wbits=31)
            self.sink.update(self.member.decompress(data, CHUNK))
            # until the member's end: after it, zlib keeps the bytes that follow in unconsumed_tail (and adds them
            # to unused_data at each call), so a member of more than CHUNK with bytes after it looped for ever
            while self.member.unconsumed_tail and not self.member.eof:
                self.sink.update(self.member.decompress(self.member.unconsumed_tail, CHUNK))
            data = b""
            if self.member.eof:
                data, self.member = self.member.unused_data, None

    def whole(self) -> bool:
        return self.member is None and not self.held


class Members(dict):
    """An archive's members by name (``read_members``), and the folders it lists beside them."""

    directories: frozenset[str] = frozenset()
    # the first header not in the plain form our writer gives every entry, as check_release_form names it
    odd: str = ""
    offsets: Mapping[str, int] = {}  # where each file member's content begins in the stream
    unhashed: frozenset[str] = frozenset()  # members given the sha256 the caller vouched for, not hashed


def read_members(source: Iterable[bytes], route: Route | None = None, keep: Keep = keep_json, *,
                 unhashed: Mapping[str, str] = {}) -> Members:
    """Every member of a tar stream (an iterable of chunks), hashed; refuses unsafe names, links
    that escape and names that appear twice. Small members that ``keep`` accepts (by default what
    can be JSON metadata; at most 64 MiB in all) are kept. ``route(name, size, first_block)`` may
    return a sink for a member: its bytes go there instead of being kept, and what its ``close()``
    returns is the member's ``routed``. The hashing runs in its own thread.

    ``unhashed``: members (by name) given the sha256 there instead of hashing their bytes, unless they
    begin as a compressed stream: the caller checks by other means that their bytes are those
    (``Members.offsets`` says where each began; ``Members.unhashed`` names those not hashed). The source may
    give such a member's whole content as one :class:`Skipped` instead of its bytes."""
    hasher = hashing_thread()
    reader = _MemberReader(route, keep, hasher, unhashed)
    walker = TarWalker(reader)
    reader.walker = walker
    try:
        for chunk in source:
            if isinstance(chunk, Skipped):
                walker.skip(chunk)
            else:
                walker.feed(chunk)
        walker.close()
    except BaseException:
        hasher.abort()
        raise
    hasher.close()
    members = Members()
    members.directories = frozenset(reader.directories)
    members.odd = reader.odd or reader.end_form()
    members.offsets = {m.name: m.at for m, _ in reader.done}
    members.unhashed = frozenset(m.name for m, _ in reader.done if not m.hashed)
    for m, routed in reader.done:
        raw = m.raw.hexdigest() if m.hashed else unhashed[m.name]
        members[m.name] = Member(name=m.name, size=m.size, sha256=raw,
                                 content_sha256=m.content.hexdigest() if m.content is not None else raw,
                                 data=b"".join(m.kept) if m.kept is not None else None, routed=routed, zstd=m.zstd,
                                 compression=m.compression)
    for name, target in reader.links.items():
        members[name] = Member(name=name, size=0, sha256="", content_sha256="", data=None, link=target)
    return members


MAX_LINKS = 40  # links followed for one name, as Linux's path lookup follows at most 40


def resolve(members: dict[str, Member], name: str) -> Member:
    """The member ``name`` refers to, links followed (a loop, or a chain longer than MAX_LINKS, refused: a chain of
    1500 was a RecursionError traceback in verify, before the release form refused any link)."""
    seen: set[str] = set()
    while True:
        name = safe_name(name)
        member = members.get(name)
        if member is None:
            raise ArchiveError(f"the archive has no {name!r}, which its manifest names")
        if member.link is None:
            return member
        if name in seen:
            raise ArchiveError(f"archive member {name!r} is part of a link loop")
        if len(seen) >= MAX_LINKS:
            raise ArchiveError(f"archive member {name!r} is reached through more than {MAX_LINKS} links")
        seen.add(name)
        name = member.link


def member_json(members: dict[str, Member], name: str, object_pairs_hook=None) -> object:
    member = resolve(members, name)
    if member.data is None and member.size <= KEEP_LIMIT:  # (a byte order mark first, say)
        raise ArchiveError(f"archive member {name!r} is not valid JSON: it does not begin with '{{' or '['")
    if member.data is None:
        raise ArchiveError(f"archive member {name!r} is too large for a metadata file ({member.size} bytes)")
    try:
        # read as Go's encoding/json (the engine's) reads it: UTF-8 only (no BOM, no UTF-16 or UTF-32, which
        # Python's json guesses from the bytes), a string's invalid UTF-8 as U+FFFD
        text = member.data.decode("utf-8", errors="replace")
        if _nesting(text) > MAX_NESTING:
            raise ArchiveError(f"archive member {name!r} is nested more than {MAX_NESTING} levels deep, which no "
                               "image's metadata is: refused before any load")
        return json.loads(text, object_pairs_hook=object_pairs_hook, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise ArchiveError(f"archive member {name!r} is not valid JSON: {str(exc)[:100]}") from None


def _nesting(text: str) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest (what its strings hold aside)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return 0
    depth = deepest = 0
    for c in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _not_json(constant: str) -> object:
    """NaN and Infinity, which Python's json reads and JSON (Go's, the engine's; the shell verifier's) does not."""
    raise ValueError(f"{constant} is no JSON value")


class _Written(dict):
    """A JSON object that remembers its keys as they were written (a key written twice too)."""

    keys_written: tuple[str, ...] = ()
    pairs: tuple[tuple[str, object], ...] = ()  # each key with its value, as written (a key twice: both)


def _written(pairs: list[tuple[str, object]]) -> _Written:
    obj = _Written(pairs)
    obj.keys_written = tuple(key for key, _ in pairs)
    obj.pairs = tuple(pairs)
    return obj


# The image config as Engine 20.10 decodes it (Go's encoding/json into image.Image, a key in any case): its
# top-level fields, and those it decodes numbers into, each a 64-bit integer: Size, and config's and
# container_config's StopTimeout and Healthcheck durations and retries (each path in lower case, " " between)
CONFIG_FIELDS = frozenset({"id", "parent", "comment", "created", "container", "container_config", "docker_version",
                           "author", "config", "architecture", "variant", "os", "os.version", "os.features", "size",
                           "rootfs", "history"})
INTEGER_FIELDS = frozenset({"size", *(f"{c} stoptimeout" for c in ("config", "container_config")),
                            *(f"{c} healthcheck {k}" for c in ("config", "container_config")
                              for k in ("interval", "timeout", "startperiod", "startinterval", "retries"))})


def check_config_numbers(config: object) -> None:
    """Each number of the image config where an engine decodes it: in one of :data:`INTEGER_FIELDS` a whole
    number of 64 bits (or null there, nothing else); under any other field of :data:`CONFIG_FIELDS` none.
    Go refuses 1e400, 1.5 or 1e3 for an integer, and any number where it reads text, so the engine would
    refuse the load of an archive both verifiers had passed (a key it does not know, it skips: not read
    here either). The shell verifier checks the same."""
    def walk(value: object, path: str | None, known: bool, shown: str) -> None:
        if path in INTEGER_FIELDS:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not -(1 << 63) <= value < 1 << 63):
                raise ArchiveError(f"the image config's {shown} is not a whole number of 64 bits, which an engine "
                                   "reads there (it would refuse the load): refused before any load")
            return
        if known and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ArchiveError(f"the image config's {shown} is a number, where an engine reads none (it would refuse "
                               "the load): refused before any load")
        if isinstance(value, _Written):
            for key, item in value.pairs:
                # (a key in another form than plain ASCII is no field's here: "healthchec\u212a" is not Healthcheck)
                step = key.lower() if key.isascii() and key.isprintable() and " " not in key else None
                walk(item, step if path == "" else None if path is None or step is None else f"{path} {step}",
                     known or (path == "" and step in CONFIG_FIELDS), f"{shown}.{key[:40]}" if shown else key[:40])
        elif isinstance(value, list):
            for item in value:
                walk(item, None, known, f"{shown}[]")

    walk(config, "", False, "")


def check_config_keys(config: object) -> None:
    """The image config's own keys and its rootfs's, as the engine reads them: Go's encoding/json
    takes a key in any case ("Diff_IDs" for diff_ids; "diff_idſ" too, Unicode-folded) and keeps the
    last of two (as this reader finds rootfs and diff_ids too). Each must be ASCII and once in any
    case: a second diffID list beside the checked one would be the one an engine loads by (a layer it
    holds under that diffID taken in place of the archive's, read by no verifier)."""
    rootfs = _field(config, "rootfs")
    for what, obj in (("the image config", config), ("the image config's rootfs", rootfs)):
        seen: dict[str, str] = {}
        for key in obj.keys_written if isinstance(obj, _Written) else ():
            if not key.isascii():
                raise ArchiveError(f"{what} has the key {key[:40]!r}, not ASCII, which an engine may read as another "
                                   "key: refused before any load")
            if key.lower() in seen:
                raise ArchiveError(f"{what} has the keys {seen[key.lower()][:40]!r} and {key[:40]!r}, which an engine "
                                   "reads as one (the last): refused before any load")
            seen[key.lower()] = key


def _field(obj: object, name: str) -> object:
    """The value of the key ``name`` of the JSON object ``obj`` as Go's encoding/json (the engine's) finds
    it: in any case ("RootFS" for rootfs), the last of two; None if there is none."""
    found = None
    for key, value in obj.items() if isinstance(obj, dict) else ():
        if key.lower() == name:
            found = value
    return found


def blob_name(digest: object) -> str:
    algo, _, hexdigest = str(digest).partition(":")
    if algo != "sha256" or len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
        raise ArchiveError(f"unsupported digest {str(digest)[:80]!r} in the archive")
    return f"blobs/sha256/{hexdigest}"


def locate(members: dict[str, Member]) -> Layout:
    """Where the image's config and layers are: from ``manifest.json`` (both layouts) or ``index.json``."""
    layout = "oci" if "oci-layout" in members or "index.json" in members else "docker"
    if "manifest.json" in members:
        manifest = member_json(members, "manifest.json")
        if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
            raise ArchiveError("manifest.json must describe exactly one image")
        entry = manifest[0]
        config_name, layer_names = entry.get("Config"), entry.get("Layers")
        tags = entry.get("RepoTags") or []
        repo_tags = tuple(tags) if isinstance(tags, list) and all(isinstance(t, str) for t in tags) else None
        if repo_tags is None:
            raise ArchiveError("manifest.json has RepoTags that are not a list of names")
    elif layout == "oci":
        index = member_json(members, "index.json")
        manifests = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
            raise ArchiveError("index.json must name exactly one image manifest")
        oci_manifest = member_json(members, blob_name(manifests[0].get("digest")))
        if not isinstance(oci_manifest, dict) or not isinstance(oci_manifest.get("config"), dict) \
                or not isinstance(oci_manifest.get("layers"), list):
            raise ArchiveError("the OCI image manifest lacks its config or layers")
        config_name = blob_name(oci_manifest["config"].get("digest"))
        layer_names = [blob_name(layer.get("digest") if isinstance(layer, dict) else None)
                       for layer in oci_manifest["layers"]]
        annotations = manifests[0].get("annotations")
        ref = annotations.get("io.containerd.image.name") if isinstance(annotations, dict) else None
        repo_tags = (ref,) if isinstance(ref, str) else ()
    else:
        raise ArchiveError("the archive has neither manifest.json nor index.json: not a docker save archive")
    if not isinstance(config_name, str) or not isinstance(layer_names, list) \
            or not all(isinstance(n, str) for n in layer_names):
        raise ArchiveError("the image manifest lacks its Config or Layers")
    return Layout(layout=layout, config_name=config_name, layer_names=tuple(layer_names), repo_tags=repo_tags)


def interpret(members: dict[str, Member], omitted: frozenset[str] = frozenset()) -> SavedImage:
    """The image the members describe; checks content addresses and the config's diffIDs.

    ``omitted``: diffIDs whose layers may be absent (a hotfix archive leaves out the layers the
    previous release shipped); their diffIDs are taken from the config, every other one recomputed.
    """
    where = locate(members)
    if where.layout == "oci":
        for name, member in members.items():
            if name.startswith("blobs/sha256/") and member.link is None and member.sha256 != name.rsplit("/", 1)[1]:
                raise ArchiveError(f"blob {name} does not match its content address (its sha256 is "
                                   f"{member.sha256}): corrupted archive")
    config_member = resolve(members, where.config_name)
    config = member_json(members, where.config_name, _written)
    check_config_keys(config)
    check_config_numbers(config)
    image_id = f"sha256:{config_member.sha256}"
    stem = posixpath.basename(where.config_name).removesuffix(".json")
    if len(stem) == 64 and stem != config_member.sha256:
        raise ArchiveError(f"config {where.config_name} does not match its content address: corrupted archive")
    rootfs = _field(config, "rootfs")
    declared = _field(rootfs, "diff_ids")
    if not isinstance(declared, list) or not all(isinstance(d, str) for d in declared):
        raise ArchiveError("the image config has no list of diffIDs (rootfs.diff_ids)")
    if len(declared) != len(where.layer_names):
        raise ArchiveError(f"the image config lists {len(declared)} layers, the manifest {len(where.layer_names)}")
    diff_ids, layer_members = [], []
    for i, name in enumerate(where.layer_names):
        if safe_name(name) not in members and declared[i] in omitted:
            diff_ids.append(declared[i])
            layer_members.append(None)
            continue
        member = resolve(members, name)
        if member.compression:  # the engine's diffID is of what it decompresses: another layer than the one checked
            raise ArchiveError(f"layer {i + 1} ({name}) begins as {member.compression} does: Engine 20.10 loads it "
                               f"{member.compression}-compressed, which unibake neither writes nor reads (a layer is "
                               "a tar, or gzip); refused before any load")
        got = f"sha256:{member.content_sha256}"
        if got != declared[i]:
            raise ArchiveError(f"layer {i + 1} ({name}) has diffID {got}, but the image config says "
                               f"{declared[i]}: corrupted archive")
        diff_ids.append(got)
        layer_members.append(member)
    carried = next((i for i, m in enumerate(layer_members) if m is not None), len(layer_members))
    above = next((i for i in range(carried, len(layer_members)) if layer_members[i] is None), None)
    if above is not None:  # (an engine takes from the base only a bottom run of its layers, by their chain IDs)
        raise ArchiveError(f"layer {above + 1} ({where.layer_names[above]}) is left out of the archive above layer "
                           f"{carried + 1}, which it carries: a hotfix leaves out only a bottom run of layers, and a "
                           "load needs every one above them")
    return SavedImage(layout=where.layout, image_id=image_id, diff_ids=tuple(diff_ids), repo_tags=where.repo_tags,
                      config=config, members=len(members), config_bytes=config_member.data or b"",
                      layer_members=tuple(layer_members))


def full_reference(tag: str) -> str:
    """The fully qualified name the containerd image store uses for a tag."""
    first = tag.split("/", 1)[0]
    if "/" in tag and ("." in first or ":" in first or first == "localhost"):
        return tag
    return f"docker.io/{tag}" if "/" in tag else f"docker.io/library/{tag}"


CANONICAL_NAMES = frozenset({"index.json", "manifest.json", "oci-layout"})
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


def _canonical_descriptor(value: object, media_types: tuple[str, ...]) -> bool:
    return isinstance(value, dict) and set(value) == {"digest", "mediaType", "size"} and \
        value["mediaType"] in media_types and type(value["size"]) is int and value["size"] >= 0


def check_release_form(members: Members, tag: str) -> None:
    """A downloaded release archive is in our canonical form and names one image, ``tag``, in both
    layouts alike, and holds nothing else: what a load installs is exactly what was checked."""
    where = locate(members)
    if any(m.link is not None for m in members.values()):
        raise ArchiveError("the archive holds a link: a release archive has none")
    if not CANONICAL_NAMES <= set(members):
        raise ArchiveError(f"the archive lacks {', '.join(sorted(CANONICAL_NAMES - set(members)))}: not a release "
                           "archive")
    if where.repo_tags != (tag,):
        raise ArchiveError(f"the archive's manifest.json names {list(where.repo_tags)}, not only the release's "
                           f"tag {tag!r}: a load would tag other images")
    index = member_json(members, "index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
        raise ArchiveError("the archive's index.json must name exactly one image")
    annotations = manifests[0].get("annotations")
    want = {"io.containerd.image.name": full_reference(tag), "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[1]
            if ":" in tag.rsplit("/", 1)[-1] else "latest"}
    if annotations != want:
        raise ArchiveError(f"the archive's index.json names {annotations!r}, not only the release's tag {tag!r}")
    oci_name = blob_name(manifests[0].get("digest"))
    oci = member_json(members, oci_name)
    # in the form our writer gives it: the same digests under other keys or media types (a layer
    # called zstd, a second list) are what containerd reads, not what manifest.json says
    if not isinstance(oci, dict) or set(oci) != {"schemaVersion", "mediaType", "config", "layers"} or \
            oci["schemaVersion"] != 2 or oci["mediaType"] != OCI_MANIFEST or \
            not _canonical_descriptor(oci["config"], (OCI_CONFIG,)) or not isinstance(oci["layers"], list) or \
            not all(_canonical_descriptor(d, (OCI_LAYER, OCI_LAYER + "+gzip")) for d in oci["layers"]):
        raise ArchiveError(f"the archive's image manifest {oci_name} is not in the form unibake writes: "
                           "index.json and manifest.json describe different images")
    if blob_name(oci["config"]["digest"]) != where.config_name or \
            [blob_name(d["digest"]) for d in oci["layers"]] != list(where.layer_names):
        raise ArchiveError("the archive's index.json and manifest.json describe different images")
    # a layer is a tar, or gzip (which Engine 20.10 and the shell verifier read whatever its media type
    # says); zstd, which no media type here says, is read by neither: it would load as another layer
    for i, (name, descriptor) in enumerate(zip(where.layer_names, oci["layers"])):
        if name in members and members[name].zstd:
            raise ArchiveError(f"the archive's layer {i + 1} ({name}) is stored zstd-compressed, but its media "
                               f"type {descriptor['mediaType']} says a plain tar or gzip: Engine 20.10 and "
                               "verify-release.sh read it as another layer; refused before any load")
    # and each of the three byte for byte as our writer makes it (only an index's sizes and platform
    # its own): the engines read JSON with Go, which takes a key written twice, or a second one that
    # differs only in case ("repotags" after "RepoTags"), where this read took another
    descriptor = manifests[0]
    platform = descriptor.get("platform")
    if set(descriptor) - {"platform"} != {"annotations", "digest", "mediaType", "size"} or \
            type(descriptor["size"]) is not int or descriptor["size"] < 0 or ("platform" in descriptor and not (
                isinstance(platform, dict) and set(platform) in ({"architecture", "os"}, {"architecture", "os", "variant"})
                and all(isinstance(v, str) for v in platform.values()))):
        raise ArchiveError("the archive's index.json is not in the form unibake writes: refused before any load")
    # the platform it names is the image config's, as the writer takes it (another would have an engine that picks
    # by the index, containerd's store, take or refuse the image for a platform it is not for); an index that names
    # none is a release's from before the index named one (read, as ever, by the config's platform)
    recorded = of_config(member_json(members, where.config_name)) if "platform" in descriptor else None
    if platform != recorded:
        def shown(p: dict | None) -> str:
            return "/".join(p[k] for k in ("os", "architecture", "variant") if k in p)[:100] if p else "none"

        raise ArchiveError(f"the archive's index.json names the platform {shown(platform)!r}, but its image config is "
                           f"for {shown(recorded)!r}: refused before any load")
    written = {"manifest.json": [{"Config": where.config_name, "Layers": list(where.layer_names), "RepoTags": [tag]}],
               "index.json": {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
                   "mediaType": OCI_MANIFEST, "digest": descriptor["digest"], "size": descriptor["size"],
                   **({"platform": platform} if "platform" in descriptor else {}), "annotations": want}]},
               oci_name: oci}
    for name, value in written.items():
        if resolve(members, name).data.rstrip(b"\n") != json.dumps(value, sort_keys=True, separators=(",", ":")).encode():
            raise ArchiveError(f"the archive's {name} is not written as unibake writes it (a key twice, or in "
                               "another case, blanks, escapes): an engine may read it otherwise; refused before any load")
    referenced = CANONICAL_NAMES | {oci_name, where.config_name} | set(where.layer_names)
    folders = {name.rsplit("/", n)[0] for name in referenced for n in range(1, name.count("/") + 1)}
    stray = sorted(set(members) - referenced) + sorted(f"{d}/" for d in members.directories - folders)
    if stray:
        raise ArchiveError(f"the archive holds {len(stray)} member(s) nothing refers to, first {stray[0]!r}: "
                           "refused before any load")
    if members.odd:
        raise ArchiveError(f"the archive's tar holds {members.odd}: not the plain entries unibake writes, which "
                           "every tar reads alike; refused before any load")


def inspect_save_stream(source: Iterable[bytes], omitted: frozenset[str] = frozenset()) -> SavedImage:
    """Read a whole ``docker save`` stream (chunks) and recompute the image's identity."""
    return interpret(read_members(source), omitted)


def check_against(saved: SavedImage, *, image_id: str, diff_ids: tuple[str, ...] | list[str], what: str) -> None:
    """Refuse an archive whose recomputed identity differs from what ``what`` recorded."""
    if saved.image_id != image_id:
        raise ArchiveError(f"the archive's config digest {saved.image_id} differs from the image ID {image_id} "
                           f"that {what} records")
    if tuple(saved.diff_ids) != tuple(diff_ids):
        for i, (want, got) in enumerate(zip(diff_ids, saved.diff_ids)):
            if want != got:
                raise ArchiveError(f"layer {i + 1}: the archive's diffID {got} differs from {want} in {what}")
        raise ArchiveError(f"the archive holds {len(saved.diff_ids)} layers; {what} records {len(diff_ids)}")


def file_chunks(fh, size: int = CHUNK) -> Iterable[bytes]:
    """The chunks of a readable file."""
    return iter(lambda: fh.read(size), b"")
