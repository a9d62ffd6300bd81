"""The archive, written by our own canonical writer in one pass over the engine's save.

The save stream is read once: every member hashed, every layer's diffID and the config digest
recomputed and checked, each layer compressed with zstd into its own frame in a temporary file
next to the archive (no uncompressed tar touches the disk; memory stays flat). The archive is
then assembled in a fixed form, whatever layout or order the engine used:

    blobs/  blobs/sha256/  blobs/sha256/<digest>...  index.json  manifest.json  oci-layout

in a fixed order, every header fixed (root, no owner names, mtime 0), each piece a zstd frame;
``zstd -dc`` reads the frames as one stream. So the same image always gives the same
``.tar.zst``, byte for byte, and both image stores can load it: the classic one reads
``manifest.json``, the containerd one ``index.json``. A hotfix archive is the same form without
the layers the previous release already shipped.

The order is fixed by the image alone (the biggest layer first, then the other big ones in the image's
order of layers, bottom up, then the rest sorted by name), so that the biggest layer's frames, written while
the engine's stream arrived, become the archive in place and are never copied; the other spooled frames are
copied. A release that changes only small blobs leaves the archive's bytes up to the last big frame as they
were; one that changes its top layers, those up to the last frame of the layers below them. The digests of what was
written, compressed and uncompressed, come from the pass that reads the finished archive back
(:mod:`unibake.archive_reader`: the round trip's load, or a check without one), which every
release makes; they are its result, not this one's.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import stat
import zstandard
from pydantic import Field, ValidationError

from .contents import ImageContents, LayerInspector
from .errors import ArchiveError, DiskFull, UnibakeError
from .imagetar import (BLOCK, OCI_CONFIG, OCI_INDEX, OCI_LAYER, OCI_MANIFEST, SavedImage, full_reference, interpret,
                       looks_like_layer, read_members, tar_header, tar_padding)
from .metadata import Record, first_error
from .platforms import of_config
from .threads import read_ahead

DEFAULT_LEVEL = 3
SPOOL_THRESHOLD = 64 << 10  # members above this that are not JSON get a zstd frame of their own
# zstd's decoders accept a window up to 2^27 without --long; keep long-distance matching within it.
LDM_WINDOW_LOG = 27
COPY_PIECE = 1 << 20  # frames copied from a spool or an earlier archive in pieces of this size


@dataclass(frozen=True, kw_only=True)
class ArchiveFile:
    name: str
    bytes: int


@dataclass(frozen=True, kw_only=True)
class Archive:
    """The compressed archive on disk, and the image one pass over the save stream established."""

    folder: Path
    name: str  # the archive's name; with parts, they are name.part-000, ...
    files: tuple[ArchiveFile, ...]
    compressed_bytes: int
    uncompressed_bytes: int
    level: int
    long_distance: bool
    image: SavedImage
    seconds: float
    tag: str
    shipped: tuple[str, ...]  # diffIDs whose layers the archive carries
    omitted: tuple[str, ...]  # diffIDs left out (a hotfix: the previous release has them)
    contents: ImageContents | None = None  # what the layers hold, when an inspector read them (the SBOM)
    frames: tuple[BlobFrame, ...] = ()  # where each blob lies, as the archive's frame index says

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    @property
    def ratio(self) -> float:
        return self.uncompressed_bytes / self.compressed_bytes if self.compressed_bytes else 0.0


def part_name(name: str, index: int) -> str:
    return f"{name}.part-{index:03d}"


class PartWriter:
    """A write-only file that lands in ``folder`` as ``name`` (or ``name.part-NNN`` of ``split`` bytes each).

    Each file is written under a temporary dot-name and renamed only when complete and fsynced.
    ``adopt``: an existing file that becomes the start of the (single) output, so what it holds is
    not copied again. Digests are not taken here: the read-back pass hashes what was written.
    """

    def __init__(self, folder: Path, name: str, split: int | None = None, adopt: Path | None = None):
        self.folder, self.name, self.split = folder, name, split
        self.total = 0
        self.done: list[ArchiveFile] = []
        self.frames: tuple[BlobFrame, ...] = ()  # where each blob lies, as the archive's frame index says
        self._temps: list[Path] = []
        self._fh = None
        self._part_bytes = 0
        if adopt is not None:
            assert not split
            temp = folder / f".{name}.tmp"
            os.replace(adopt, temp)
            self._temps.append(temp)
            self._fh = open(temp, "r+b")  # not "ab": the kernel's copy refuses files opened to append
            self.total = self._part_bytes = self._fh.seek(0, os.SEEK_END)

    def _final_name(self, index: int) -> str:
        return part_name(self.name, index) if self.split else self.name

    def _open(self) -> None:
        temp = self.folder / f".{self._final_name(len(self.done))}.tmp"
        self._temps.append(temp)
        self._fh = open(temp, "wb")
        self._part_bytes = 0

    def _room(self, wanted: int) -> int:
        if self._fh is None:
            self._open()
        return wanted if not self.split else min(wanted, self.split - self._part_bytes)

    def _advance(self, n: int) -> None:
        self._part_bytes += n
        self.total += n
        if self.split and self._part_bytes >= self.split:
            self._close_part()

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while len(view):
            room = self._room(len(view))
            try:
                self._fh.write(view[:room])
            except OSError as exc:
                raise _disk_error(exc, self.folder) from None
            view = view[room:]
            self._advance(room)
        return len(data)

    def copy_from(self, path: Path, offset: int = 0) -> None:
        """Append ``path`` from ``offset`` on."""
        with open(path, "rb") as src:
            self.copy_fd(src.fileno(), offset, os.fstat(src.fileno()).st_size - offset, str(path))

    def copy_fd(self, fd: int, offset: int, length: int, what: str) -> None:
        """Append ``length`` bytes of the open file ``fd`` from ``offset`` on. Read and written in 1 MiB pieces:
        ``os.copy_file_range`` took 0.3-1.1 s for 312 MB here (ext4, page cache warm), these 0.1 s."""
        left = length
        while left > 0:
            try:
                data = os.pread(fd, min(left, COPY_PIECE), offset)
            except OSError as exc:
                raise UnibakeError(f"cannot read {what}: {exc.strerror}") from None
            if not data:
                raise UnibakeError(f"cannot copy {what} into the archive (it ended early)")
            self.write(data)
            offset += len(data)
            left -= len(data)

    def _close_part(self) -> None:
        fh, self._fh = self._fh, None
        try:  # (the last frames wait in the buffer: a full disk is said here, as at a write)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError as exc:
            try:
                fh.close()
            except OSError:
                pass
            raise _disk_error(exc, self.folder) from None
        fh.close()
        final = self._final_name(len(self.done))
        os.replace(self._temps[-1], self.folder / final)
        self.done.append(ArchiveFile(name=final, bytes=self._part_bytes))

    def finish(self) -> tuple[ArchiveFile, ...]:
        if self._fh is not None or not self.done:
            if self._fh is None:
                self._open()
            self._close_part()
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _disk_error(exc, self.folder) from None
        finally:
            os.close(fd)
        return tuple(self.done)

    def abort(self) -> None:
        try:
            if self._fh is not None:
                fh, self._fh = self._fh, None
                fh.close()  # (bytes still buffered are written as it closes: a full disk fails it again)
        except OSError:
            pass  # (the failure that stopped the writer is the one passed on)
        finally:
            for path in self._temps + [self.folder / f.name for f in self.done]:
                path.unlink(missing_ok=True)


def compressor(level: int, long_distance: bool, threads: int = -1) -> zstandard.ZstdCompressor:
    if not 1 <= level <= 19:
        raise UnibakeError(f"zstd level {level} is out of range 1..19")
    params = zstandard.ZstdCompressionParameters.from_level(
        level, threads=threads, write_checksum=True, enable_ldm=long_distance,
        **({"window_log": LDM_WINDOW_LOG} if long_distance else {}))
    return zstandard.ZstdCompressor(compression_params=params)


OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


def _json_bytes(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


SKIPPABLE_MAGIC = b"\x50\x2a\x4d\x18"  # a zstd skippable frame: decoders pass over its content
IN_SIZE = zstandard.COMPRESSION_RECOMMENDED_INPUT_SIZE  # 128 KiB
RESERVE = 4096  # room kept at the head of each spool for the frame of the tar headers before it


def skippable(size: int) -> bytes:
    """A skippable frame of exactly ``size`` bytes (at least 8)."""
    return SKIPPABLE_MAGIC + struct.pack("<I", size - 8) + bytes(size - 8)


FRAMES_TAG = b"unibake-archive-frames-1"  # the archive's last bytes: its frame index's length (4 bytes, LE), this tag
INDEX_LIMIT = 1 << 20  # a trailing index larger than this is refused unread
SMALL_FRAME_LIMIT = 64 << 20  # a lender's frame of small entries decompressing to more is not read


def compressor_id(level: int, long_distance: bool) -> str:
    """What a frame's bytes depend on besides its content: a frame made under another is compressed again."""
    ldm = f", long distance matching, window log {LDM_WINDOW_LOG}" if long_distance else ""
    return (f"zstandard {zstandard.__version__}, libzstd {'.'.join(map(str, zstandard.ZSTD_VERSION))}, "
            f"level {level}{ldm}, checksum")


def index_frame(index: bytes, tag: bytes) -> bytes:
    """A skippable frame holding ``index`` (JSON), ending with its length and ``tag``: what a reader finds
    from the file's end (:func:`trailing_index`), and every zstd decoder passes over."""
    body = index + struct.pack("<I", len(index)) + tag
    return SKIPPABLE_MAGIC + struct.pack("<I", len(body)) + body


def trailing_index(fd: int, tag: bytes, what: str) -> tuple[bytes, int] | str:
    """The JSON of the index frame ending the file open at ``fd`` and where that frame begins; a reason (a
    string) when there is none. ``what``: the files' kind, for the reason (made before ``what`` had one)."""
    size = os.fstat(fd).st_size
    tail = len(tag) + 4
    if size < tail + 8:
        return "too short to end with a frame index"
    end = os.pread(fd, tail, size - tail)
    if end[4:] != tag:
        return f"it ends without a frame index (made before {what} had one)"
    length = struct.unpack("<I", end[:4])[0]
    if length > INDEX_LIMIT or length + tail + 8 > size:
        return "its frame index is out of bounds"
    start = size - tail - length - 8
    head = os.pread(fd, 8 + length, start)
    if head[:4] != SKIPPABLE_MAGIC or struct.unpack("<I", head[4:8])[0] != length + tail:
        return "its frame index is not a skippable frame"
    return head[8:], start


class BlobFrame(Record):
    """Where one blob of an archive lies: the zstd frame holding it, and its place in what that frame holds."""

    name: str = Field(pattern=r"^blobs/sha256/[0-9a-f]{64}$")
    offset: int = Field(ge=0)  # of the frame, in the archive (its parts as one)
    length: int = Field(gt=0)  # of the frame, compressed
    own: bool  # the frame holds this blob alone (a big one); else small entries and headers too
    inner: int = Field(ge=0)  # where the blob begins in what the frame decompresses to
    size: int = Field(ge=0)


class ArchiveFrames(Record):
    compressor: str
    blobs: tuple[BlobFrame, ...]


class FrameWalker:
    """The zstd frames of a compressed stream followed by their headers alone (a frame's header, each
    block's 3-byte header, its checksum; a skippable frame's size), fed the bytes as they are read:
    whether the stream ends where a frame ends. zstandard's reader takes a stream that ends inside a
    frame (its last block, its checksum, a frame's first bytes after the last whole one) as ended,
    where the zstd tool (verify-release.sh, the guide's ``zstd -dc``) refuses it as truncated."""

    def __init__(self) -> None:
        self._need, self._kind, self._buf = 4, "magic", b""  # the header being read: its size and kind
        self._skip = 0  # bytes of a block, a header's rest or a skippable frame to pass over first
        self._checksum = False  # the current frame ends with a 4-byte checksum
        self.other = False  # a frame of another format here (the decoder refuses it, naming it)
        self.frames = self.skippable = 0  # the frames begun so far: zstd's, skippable ones

    def feed(self, data: bytes) -> None:
        view, at, end = memoryview(data), 0, len(data)
        while at < end and not self.other:
            if self._skip:
                taken = min(self._skip, end - at)
                at += taken
                self._skip -= taken
                continue
            taken = min(self._need - len(self._buf), end - at)
            self._buf += bytes(view[at:at + taken])
            at += taken
            if len(self._buf) == self._need:
                header, self._buf = self._buf, b""
                self._header(header)

    def _header(self, header: bytes) -> None:
        kind = self._kind
        if kind == "magic":
            magic = int.from_bytes(header, "little")
            if magic == 0xFD2FB528:
                self._kind, self._need = "frame", 1
                self.frames += 1
            elif magic & 0xFFFFFFF0 == 0x184D2A50:
                self._kind, self._need = "skippable", 4
                self.skippable += 1
            else:
                self.other = True
        elif kind == "skippable":
            self._skip = int.from_bytes(header, "little")
            self._kind, self._need = "magic", 4
        elif kind == "frame":  # the frame header descriptor: the size of the header's rest
            descriptor = header[0]
            single = descriptor >> 5 & 1
            self._checksum = bool(descriptor >> 2 & 1)
            self._skip = (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3] + (single, 2, 4, 8)[descriptor >> 6]
            self._kind, self._need = "block", 3
        else:  # a block: its content (one byte for a run of one byte), then the next block or the frame's end
            value = int.from_bytes(header, "little")
            self._skip = 1 if value >> 1 & 3 == 1 else value >> 3
            if value & 1:
                self._skip += 4 if self._checksum else 0
                self._kind, self._need = "magic", 4

    @property
    def ended(self) -> bool:
        """The stream read so far ends where a frame ends (or holds a frame of another format)."""
        return self.other or (self._kind == "magic" and not self._buf and not self._skip)

    def walk_file(self, fd: int, at: int, end: int, stop=lambda walker: False) -> int:
        """Feeds the headers among the bytes ``at``..``end`` of ``fd`` (``pread``), passing over what lies between
        them unread; ends early when ``stop(self)`` holds or a read fails or comes up short. Returns where it
        stopped."""
        while at < end and not stop(self):
            if self._skip:
                at, self._skip = min(at + self._skip, end), max(0, self._skip - (end - at))
                continue
            try:
                data = os.pread(fd, min(self._need - len(self._buf), end - at), at)
            except OSError:
                return at
            if not data:
                return at
            self.feed(data)
            at += len(data)
        return at


def one_frame(fd: int, offset: int, length: int) -> bool:
    """Whether the ``length`` bytes at ``offset`` in ``fd`` are exactly one zstd frame, nothing before or after it:
    no skippable frame (which decoders pass over, so that a frame index and the read back would take a copied range
    holding one, and its bytes of anyone's choosing, for the frame alone). Only the headers are read (``pread``,
    a block's content passed over): the frame is copied without being read here. zstandard tells a frame's
    content size, not where its compressed bytes end, hence the walk by hand."""
    walker, end = FrameWalker(), offset + length

    def more(w: FrameWalker) -> bool:  # anything besides one zstd frame
        return w.other or bool(w.skippable) or w.frames > 1

    at = walker.walk_file(fd, offset, end, stop=more)
    return at == end and not more(walker) and walker.frames == 1 and walker.ended


class _Lent:
    """A big layer's frame in an earlier release's archive, copied into this one: the bytes a
    fresh compression of the layer gives (a frame depends only on its content and the compressor's settings),
    without compressing it. What the archive decodes to is checked by its read back, as every archive's."""

    def __init__(self, fd: int, offset: int, length: int, what: str):
        self.fd, self.offset, self.length, self.what = fd, offset, length, what

    def copy_into(self, out: "PartWriter") -> None:
        out.copy_fd(self.fd, self.offset, self.length, self.what)


@dataclass
class Lender:
    """An earlier release's archive, open, whose index says where each of its blobs lies."""

    fd: int
    what: str
    blobs: dict[str, BlobFrame]

    def lend(self, digest: str, size: int) -> _Lent | bytes | None:
        """The layer ``digest`` of ``size`` bytes as this archive's canonical form lays it out: a big one's frame
        (to copy), a small one's bytes (checked against its digest); None when the archive does not hold it so."""
        blob = self.blobs.get(f"blobs/sha256/{digest}")
        if blob is None or blob.size != size:
            return None
        if size > SPOOL_THRESHOLD:  # one frame and nothing else, as this compressor writes a big layer's
            own = blob.own and one_frame(self.fd, blob.offset, blob.length)
            return _Lent(self.fd, blob.offset, blob.length, self.what) if own else None
        if blob.own:
            return None
        try:
            frame = os.pread(self.fd, blob.length, blob.offset)
            content = zstandard.frame_content_size(frame)
            if len(frame) != blob.length or not 0 <= content <= SMALL_FRAME_LIMIT:
                return None
            data = zstandard.ZstdDecompressor().decompress(frame)[blob.inner:blob.inner + size]
        except (OSError, zstandard.ZstdError):
            return None
        return data if len(data) == size and hashlib.sha256(data).hexdigest() == digest else None

    def close(self) -> None:
        os.close(self.fd)


def open_lender(path: Path, size: int, *, level: int, long_distance: bool, what: str) -> Lender | str:
    """The archive at ``path``, when it is the ``size`` bytes its release records (its sha256 is checked against
    that release's SHA256SUMS before this) and ends with an index of frames made by this compressor at this
    ``level``; otherwise why not (a reason, a string)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot open it ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a file")
        if st.st_size != size:
            raise ValueError(f"it is {st.st_size} bytes, not the {size} its release records")
        found = trailing_index(fd, FRAMES_TAG, "archives")
        if isinstance(found, str):
            raise ValueError(found)
        try:
            index = ArchiveFrames.model_validate_json(found[0])
        except ValidationError as exc:
            raise ValueError(f"its frame index is not valid ({first_error(exc)})") from None
        wanted = compressor_id(level, long_distance)
        if index.compressor != wanted:
            raise ValueError(f"its frames were made by {index.compressor}, not {wanted}")
        if any(b.offset + b.length > found[1] for b in index.blobs):
            raise ValueError("its frame index names bytes past the frames")
        return Lender(fd=fd, what=what, blobs={b.name: b for b in index.blobs})
    except (ValueError, OSError) as exc:
        os.close(fd)
        return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


class _Tee:
    """A layer on its way to its spool, read by the inspector too (the same pieces, no copy)."""

    def __init__(self, spool: "_Spool", look):
        self.spool, self.look = spool, look

    def write(self, data) -> None:
        self.spool.write(data)
        self.look.write(data)

    def close(self) -> "_Spool":
        self.look.close()
        return self.spool.close()


class _Spool:
    """One big member compressed into its own zstd frame in a temporary file beside the archive.

    The file starts with ``RESERVE`` bytes of skippable frame, so that the biggest spool can
    become the archive itself: the headers that precede its content are written into that room
    instead of copying the member's frames behind them.
    """

    def __init__(self, folder: Path, index: int, cctx: zstandard.ZstdCompressor):
        self.path = folder / f".member-{index:04d}.zst.tmp"
        self._fh = open(self.path, "wb")
        self._fh.write(skippable(RESERVE))
        self._writer = cctx.stream_writer(self._fh, closefd=False)
        self.compressed = 0

    def write(self, data) -> None:
        # Handed to zstd in its recommended input size: bigger writes let its workers queue more
        # jobs at once (peak memory measured 158 MiB with 1 MiB writes against 124 MiB in 128 KiB
        # slices, on 1.5 GB of incompressible data).
        view = memoryview(data)
        try:
            for start in range(0, len(view), IN_SIZE):
                self._writer.write(view[start:start + IN_SIZE])
        except OSError as exc:
            raise _disk_error(exc, self.path.parent) from None

    def close(self) -> "_Spool":
        if self._writer is not None:
            try:
                self._writer.close()
                self.compressed = self._fh.tell() - RESERVE
                self._fh.close()
            except OSError as exc:
                raise _disk_error(exc, self.path.parent) from None
            self._writer = self._fh = None
        return self


def _disk_error(exc: OSError, folder: Path) -> UnibakeError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left in {folder} while writing the archive")
    return UnibakeError(f"cannot write the archive in {folder}: {exc.strerror}")


def canonical_entries(image: SavedImage, tag: str, omit: frozenset[str]) -> list[tuple[str, object, int]]:
    """(name, content, size) of every entry of the canonical tar; content is bytes or a spooled Member.

    The order is fixed by the image alone: the two folders, the biggest layer (so that its frames
    can stay where they were written), the other big blobs (each in a frame of its own) in the image's
    order of layers, bottom up, then every other blob sorted by name, then ``index.json``, ``manifest.json``
    and ``oci-layout``.
    """
    layers, seen = [], set()
    descriptors = []
    for n, (member, diff_id) in enumerate(zip(image.layer_members, image.diff_ids), 1):
        if member.zstd:  # no media type written here says zstd, and Engine 20.10 and the verifiers load none
            raise ArchiveError(f"the image's layer {n} (diffID {diff_id}, {member.name}) is stored zstd-compressed "
                               "(an Engine 25+ keeps a zstd pull so): Engine 20.10, verify and verify-release.sh "
                               "cannot load it, so no archive is written; save the image from an engine that stores "
                               "its layers uncompressed, or pull it as gzip")
        digest = f"sha256:{member.sha256}"
        compressed = member.content_sha256 != member.sha256
        descriptors.append({"mediaType": OCI_LAYER + ("+gzip" if compressed else ""), "digest": digest,
                            "size": member.size})
        if diff_id in omit or digest in seen:
            continue
        seen.add(digest)
        layers.append((f"blobs/sha256/{member.sha256}", member.routed if member.routed else member.data, member.size))
    config = image.config_bytes
    config_hex = hashlib.sha256(config).hexdigest()
    oci_manifest = _json_bytes({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                "config": {"mediaType": OCI_CONFIG, "digest": f"sha256:{config_hex}",
                                           "size": len(config)},
                                "layers": descriptors})
    manifest_hex = hashlib.sha256(oci_manifest).hexdigest()
    ref = tag.rsplit(":", 1)[1] if ":" in tag.rsplit("/", 1)[-1] else "latest"
    platform = of_config(image.config)  # the index says which platform the image is for, as a registry's does
    index = _json_bytes({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": f"sha256:{manifest_hex}", "size": len(oci_manifest),
        **({"platform": platform} if platform else {}),
        "annotations": {"io.containerd.image.name": full_reference(tag), "org.opencontainers.image.ref.name": ref}}]})
    classic = _json_bytes([{"Config": f"blobs/sha256/{config_hex}", "RepoTags": [tag],
                            "Layers": [f"blobs/sha256/{m.sha256}" for m in image.layer_members]}])
    blobs = layers + [(f"blobs/sha256/{config_hex}", config, len(config)),
                      (f"blobs/sha256/{manifest_hex}", oci_manifest, len(oci_manifest))]
    blobs = sorted({name: (name, data, size) for name, data, size in blobs}.values())
    # (``layers`` holds each blob once, in the image's order)
    spooled = [b for b in layers if isinstance(b[1], (_Spool, _Lent))]
    if spooled:  # every big blob before the small ones, and the big ones after the biggest from the image's bottom
        # layer up: a release that changes its top layers (tune caches, metadata) leaves the bytes up to the last
        # frame of the layers below them as they were, and its read back passes over those frames (archive_reader)
        biggest = max(spooled, key=lambda b: (b[2], b[0]))
        big = {b[0] for b in spooled}
        blobs = [biggest] + [b for b in spooled if b is not biggest] + [b for b in blobs if b[0] not in big]
    return ([("blobs/", None, 0), ("blobs/sha256/", None, 0)] + blobs +
            [("index.json", index, len(index)), ("manifest.json", classic, len(classic)),
             ("oci-layout", OCI_LAYOUT, len(OCI_LAYOUT))])


def _assemble(entries, folder: Path, name: str, split: int | None, cctx: zstandard.ZstdCompressor,
              frames_id: str) -> tuple[PartWriter, int]:
    """Write the canonical tar as zstd frames: small pieces gathered in one frame, spooled frames
    copied (an earlier archive's, :class:`_Lent`, too); the first spool, when nothing big
    precedes it, is not copied at all. The last frame is a skippable one: the index of where every blob
    lies (``frames_id``, the compressor's settings, in it), through which a later release copies frames.
    On a failure, what it wrote is removed (the caller has no writer to abort yet): the temporary file, the
    adopted spool in it, the parts already named."""
    made: list[PartWriter] = []
    try:
        return _assemble_into(made, entries, folder, name, split, cctx, frames_id)
    except BaseException:
        for out in made:
            out.abort()
        raise


def _assemble_into(made: list[PartWriter], entries, folder: Path, name: str, split: int | None,
                   cctx: zstandard.ZstdCompressor, frames_id: str) -> tuple[PartWriter, int]:
    first = entries[2][1] if len(entries) > 2 and isinstance(entries[2][1], (_Spool, _Lent)) else None
    head = b"".join(tar_header(n, s, directory=c is None) for n, c, s in entries[:3]) if first else b""
    head_frame = cctx.compress(head) if first else b""
    if first and len(head_frame) + 8 > RESERVE:
        first = None  # never with two folders and one header; kept for safety
    total = 0
    index: list[BlobFrame] = []
    if isinstance(first, _Spool):
        with open(first.path, "r+b") as fh:  # the headers go into the room kept at its head
            fh.write(head_frame + skippable(RESERVE - len(head_frame)))
        out = PartWriter(folder, name, split, adopt=None if split else first.path)
        made.append(out)
        if split:
            out.copy_from(first.path)
    else:
        out = PartWriter(folder, name, split)
        made.append(out)
    if first is not None:
        if isinstance(first, _Lent):  # laid out as an adopted spool is: the same bytes
            out.write(head_frame + skippable(RESERVE - len(head_frame)))
            first.copy_into(out)
        index.append(BlobFrame(name=entries[2][0], offset=RESERVE, length=out.total - RESERVE, own=True, inner=0,
                               size=entries[2][2]))
        entries, total = [(None, first, entries[2][2])] + entries[3:], len(head)
    pending: list[bytes] = []
    held = {"bytes": 0, "blobs": []}  # what the pending frame holds so far, and the blobs in it

    def gather(data: bytes, blob: tuple[str, int] | None = None) -> None:
        if blob is not None:
            held["blobs"].append((blob[0], held["bytes"], blob[1]))
        pending.append(data)
        held["bytes"] += len(data)

    def flush() -> None:
        if pending:
            frame = cctx.compress(b"".join(pending))
            index.extend(BlobFrame(name=n, offset=out.total, length=len(frame), own=False, inner=inner, size=size)
                         for n, inner, size in held["blobs"])
            out.write(frame)
            pending.clear()
            held["bytes"], held["blobs"] = 0, []

    for entry_name, content, size in entries:
        if entry_name is not None:  # (the adopted spool's header is already written)
            header = tar_header(entry_name, size, directory=content is None)
            gather(header)
            total += len(header)
            if content is None:
                continue
            if isinstance(content, (bytes, bytearray)):
                gather(bytes(content), (entry_name, size) if entry_name.startswith("blobs/sha256/") else None)
            else:
                flush()
                at = out.total
                if isinstance(content, _Lent):
                    content.copy_into(out)
                else:
                    out.copy_from(content.path, RESERVE)
                index.append(BlobFrame(name=entry_name, offset=at, length=out.total - at, own=True, inner=0,
                                       size=size))
        gather(tar_padding(size))
        total += size + len(tar_padding(size))
    gather(bytes(2 * BLOCK))
    total += 2 * BLOCK
    flush()
    out.write(index_frame(_json_bytes(ArchiveFrames(compressor=frames_id, blobs=tuple(index)).model_dump()),
                          FRAMES_TAG))
    out.frames = tuple(index)
    return out, total


def write_archive(chunks: Iterable[bytes], folder: Path, name: str, *, tag: str, level: int = DEFAULT_LEVEL,
                  long_distance: bool = False, split: int | None = None, threads: int = -1,
                  omit: Iterable[str] = (), progress: Callable[[int], object] = lambda n: None,
                  inspector: LayerInspector | None = None) -> Archive:
    """Read a save stream once, check it, and write ``folder/name`` (or parts) in the canonical form.

    ``omit`` names diffIDs whose layers stay out (a hotfix). ``inspector`` reads every layer in the
    same pass (a tee beside the compressor): the archive's ``contents``. Nothing is left behind on failure.
    The archive's digests come from reading it back (:func:`unibake.archive_reader.read_back`).
    """
    start = time.monotonic()
    cctx = compressor(level, long_distance, threads)
    spools: list[_Spool] = []

    def spool(member_name: str, size: int, head: bytes) -> _Spool | None:
        """Big members that are not JSON (the layers) are compressed into frames of their own. A layer whose first
        entry is named ``{x}`` or ``[data]`` starts as JSON does: told by its tar header (it was taken for JSON, kept
        by no one, and written as a folder: the release failed naming the blob as missing)."""
        if size <= SPOOL_THRESHOLD or (head[:1] in (b"{", b"[") and not looks_like_layer(member_name, head)):
            return None  # kept in memory: the inspector reads it after the pass
        spools.append(_Spool(folder, len(spools), compressor(level, long_distance, threads)))
        look = inspector.sink(member_name, size, head) if inspector is not None else None
        return spools[-1] if look is None else _Tee(spools[-1], look)

    def counted(source: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in source:
            progress(len(chunk))
            yield chunk

    out = None
    try:
        members = read_members(counted(read_ahead(chunks, name="save")), route=spool,
                               keep=lambda name, size, head: True)  # small layers go into the archive as they are
        saved = interpret(members)
        contents = inspector.finish(saved) if inspector is not None else None
        omit_set = frozenset(omit)
        out, uncompressed = _assemble(canonical_entries(saved, tag, omit_set), folder, name, split, cctx,
                                      compressor_id(level, long_distance))
        files = out.finish()
    except BaseException:
        if out is not None:
            out.abort()
        raise
    finally:
        for s in spools:
            try:
                s.close()
            except UnibakeError:
                pass
            s.path.unlink(missing_ok=True)
    return Archive(folder=folder, name=name, files=files, compressed_bytes=out.total,
                   uncompressed_bytes=uncompressed, level=level,
                   long_distance=long_distance, image=saved, seconds=time.monotonic() - start, tag=tag,
                   shipped=tuple(d for d in saved.diff_ids if d not in omit_set),
                   omitted=tuple(d for d in saved.diff_ids if d in omit_set), contents=contents, frames=out.frames)
