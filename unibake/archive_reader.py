"""Reading an archive back: one pass over its file(s) that takes every digest and either parses the
image inside or feeds an engine's load.

:class:`ArchiveReader` reads the file(s) in order and decodes the zstd frames; the sha256 of each
file, of the whole compressed stream and of the decoded stream are taken in a second thread as the
bytes pass. :func:`read_back` is the release's read of what it just wrote; ``verify`` and the
loads use the same reader.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import zstandard

from .archive import LDM_WINDOW_LOG, Archive, compressor_id
from .engine import LoadOutcome
from .errors import VerificationError, ZstdDecodeError
from .files import open_regular
from .imagetar import CHUNK, SavedImage, interpret, read_members
from .threads import consume_in_thread, hashing_thread


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
            elif magic & 0xFFFFFFF0 == 0x184D2A50:
                self._kind, self._need = "skippable", 4
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


class ArchiveReader:
    """One read of an archive's file(s), in order: with ``hashed``, the sha256 of each file, of the
    whole compressed stream and of the decoded stream, taken in a second thread as the bytes pass.

    Iterate :meth:`chunks` for the decoded stream; after a failure, :meth:`finish` reads what is
    left so that every file's digest is still complete (a downloader wants to know which part is bad).
    """

    def __init__(self, folder: Path, names: list[str], *, hashed: bool = True,
                 progress: Callable[[int], object] = lambda n: None, ranges: Iterable[tuple[int, int]] = ()):
        self.folder, self.names, self.progress = folder, list(names), progress
        # ``ranges``: (offset, length) of compressed bytes (the parts as one) each hashed on its own, where a zstd
        # frame must begin and end; the decoded stream's length at each of those places is kept (``decoded_at``)
        self.ranges = sorted(set(ranges))
        self.range_sha256 = {r: hashlib.sha256() for r in self.ranges}
        self._stops = sorted({at for offset, length in self.ranges for at in (offset, offset + length)})
        self._next_range = 0
        self.decoded_at: dict[int, int] = {}
        self.hasher = hashing_thread() if hashed else None
        self.whole = hashlib.sha256()
        self.per_file = [hashlib.sha256() if len(self.names) > 1 else self.whole for _ in self.names]
        self.decoded = hashlib.sha256()
        self.decoded_bytes = 0
        self.compressed_bytes = 0
        self.frames = FrameWalker()
        self._index, self._fh = -1, None

    def read(self, size: int = -1) -> bytes:
        """The compressed bytes, file after file (what the zstd decoder reads)."""
        while True:
            if self._fh is None:
                self._index += 1
                if self._index >= len(self.names):
                    return b""
                # hashed and checked before, opened again here: one swapped for a FIFO meanwhile is refused, not
                # waited on for ever (a link to a device, read without end)
                self._fh = open_regular(self.folder / self.names[self._index], VerificationError)
            wanted = size if size > 0 else CHUNK
            if self._stops:  # a read ends at the next place a range begins or ends: chunks() passes it
                wanted = min(wanted, self._stops[0] - self.compressed_bytes)
                if wanted <= 0:
                    return b""
            data = self._fh.read(wanted)
            if data:
                inside = self._range_at(self.compressed_bytes)
                self.compressed_bytes += len(data)
                self.frames.feed(data)
                self.progress(len(data))
                if self.hasher is not None:
                    self.hasher.put((self.per_file[self._index], data))
                    if len(self.names) > 1:
                        self.hasher.put((self.whole, data))
                    if inside is not None:
                        self.hasher.put((inside, data))
                return data
            self._fh.close()
            self._fh = None

    def _range_at(self, offset: int):
        """The hash of the range holding the compressed byte at ``offset`` (reads never cross a range's ends)."""
        ranges = self.ranges
        while self._next_range < len(ranges) and sum(ranges[self._next_range]) <= offset:
            self._next_range += 1
        if self._next_range < len(ranges) and ranges[self._next_range][0] <= offset:
            return self.range_sha256[ranges[self._next_range]]
        return None

    def chunks(self) -> Iterator[bytes]:
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << LDM_WINDOW_LOG)
        while True:  # one decoder per stretch between two stops: the decoded length at a stop is exact
            with dctx.stream_reader(self, read_across_frames=True, read_size=CHUNK, closefd=False) as reader:
                while True:
                    try:
                        chunk = reader.read(CHUNK)
                    except zstandard.ZstdError as exc:
                        reason = str(exc)
                        if "too much memory" in reason:
                            reason = (f"a zstd frame declares a window over {1 << LDM_WINDOW_LOG >> 20} MiB, more "
                                      "memory than a release archive may ask of its decoder")
                        raise ZstdDecodeError(f"zstd cannot decode {self.names[0]}: {reason}") from None
                    if not chunk:
                        break
                    if self.hasher is not None:
                        self.hasher.put((self.decoded, chunk))
                    self.decoded_bytes += len(chunk)
                    yield chunk
            stop = self._stops[0] if self._stops and self._stops[0] == self.compressed_bytes else None
            if not self.frames.ended:  # (zstandard's reader stops there without a word)
                raise ZstdDecodeError(f"zstd cannot decode {self.names[0]}: " + (
                    f"a zstd frame runs across byte {stop}, where its frame index says a blob's frame begins or "
                    "ends" if stop is not None else
                    "it ends inside a zstd frame (truncated, or bytes after its last frame)"))
            if stop is None:
                return
            self.decoded_at[self._stops.pop(0)] = self.decoded_bytes

    def finish(self) -> None:
        """Read to the end (after a failure midway) and wait for the hashing."""
        self._stops = []
        while self.read(CHUNK):
            pass
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.hasher is not None:
            self.hasher.close()
            self.hasher = None

    def abort(self) -> None:
        """Stop without reading the rest: the digests are then incomplete."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.hasher is not None:
            self.hasher.abort()
            self.hasher = None

    def file_sha256(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in zip(self.names, self.per_file)}


def read_archive(folder: Path, files: list[str]) -> Iterator[bytes]:
    """The decoded stream of an archive's file(s), concatenated in order."""
    return ArchiveReader(folder, files, hashed=False).chunks()


@dataclass(frozen=True, kw_only=True)
class FrameSeen:
    """A big blob's own zstd frame as a read back decoded it: the sha256 and length of the frame's compressed
    bytes, and the sha256 and size of the bytes they decode to (a frame decodes to the same bytes wherever it lies)."""

    blob: str  # the decoded bytes' sha256 (hex): the blob's name
    frame_sha256: str
    length: int
    size: int
    compressor: str  # the settings that made it (archive.compressor_id): under others the frame is another


@dataclass(frozen=True, kw_only=True)
class ReadBack:
    """What one read of the finished archive established: every digest, and the image or the load."""

    file_sha256: dict[str, str]
    compressed_sha256: str
    uncompressed_sha256: str
    uncompressed_bytes: int
    image: SavedImage | None  # parsed when nothing was loaded; a load checks the structure itself
    loaded: LoadOutcome | None
    seconds: float
    frames: tuple[FrameSeen, ...] = ()  # the blobs' own frames it decoded and hashed
    vouched: tuple[str, ...] = ()  # blobs not hashed: their frames are ones an earlier read back decoded


def read_back(archive: Archive, *, load: Callable[[Iterable[bytes]], LoadOutcome] | None = None,
              omitted: frozenset[str] = frozenset(), progress: Callable[[int], object] = lambda n: None,
              bind_frames: bool = False, vouched: Mapping[str, FrameSeen] = {}) -> ReadBack:
    """Read the finished archive once: the sha256 of every file and of the whole compressed stream,
    the zstd frames decoded, the sha256 of the decoded stream; and either its structure parsed
    and checked (every diffID and the config digest recomputed) or, with ``load``, the same stream
    fed to an engine's load in a second thread, which recomputes them itself and is compared with
    the archive afterwards.

    ``bind_frames`` (parsed only): each big blob's own frame (``archive.frames``) is hashed as compressed
    bytes too, and bound to the blob: the decoded stream's length where the frame begins is where the blob's content begins, and
    the frame decodes to exactly the blob's bytes. ``frames`` in the result are those frames, with the
    sha256 the blob's bytes were hashed to. ``vouched`` (by blob digest): frames an earlier read back
    decoded (this user's signed record): a blob whose frame has that length and size is not hashed again
    but must be bound to a frame of that sha256, or the archive is refused."""
    start = time.monotonic()
    watched = [b for b in archive.frames if b.own] if load is None and (bind_frames or vouched) else []
    reader = ArchiveReader(archive.folder, archive.names, ranges=[(b.offset, b.length) for b in watched])
    made_by = compressor_id(archive.level, archive.long_distance)
    unhashed = {b.name: seen.blob for b in watched
                if (seen := vouched.get(b.name.rsplit("/", 1)[-1])) is not None and seen.length == b.length
                and seen.size == b.size and seen.compressor == made_by and b.name == f"blobs/sha256/{seen.blob}"}
    image = outcome = members = None

    def decoded() -> Iterator[bytes]:
        for chunk in reader.chunks():
            progress(len(chunk))
            yield chunk

    try:
        if load is not None:
            with consume_in_thread(load, name="load") as loader:
                for chunk in decoded():
                    loader.put(chunk)
                outcome = loader.close()
        else:
            members = read_members(decoded(), unhashed=unhashed)
            image = interpret(members, omitted)
    except BaseException:
        reader.abort()
        raise
    reader.finish()
    seen, vouched_names = [], []
    for b in watched:
        begins, ends = reader.decoded_at.get(b.offset), reader.decoded_at.get(b.offset + b.length)
        member = members.get(b.name)
        bound = (member is not None and begins is not None and ends is not None and members.offsets.get(b.name) == begins
                 and ends - begins == b.size == member.size)
        frame_sha256 = reader.range_sha256[(b.offset, b.length)].hexdigest()
        if b.name in members.unhashed:
            if not bound or frame_sha256 != vouched[unhashed[b.name]].frame_sha256:
                raise VerificationError(f"the archive written does not hold, at byte {b.offset}, the frame of {b.name} "
                                        "an earlier read back decoded (its bytes were copied from another archive)")
            vouched_names.append(b.name)
        elif bound and member.sha256 == b.name.rsplit("/", 1)[-1]:
            seen.append(FrameSeen(blob=member.sha256, frame_sha256=frame_sha256, length=b.length, size=b.size,
                                  compressor=made_by))
    if image is not None and (image.image_id != archive.image.image_id or image.diff_ids != archive.image.diff_ids):
        raise VerificationError(f"the archive written reads back as {image.image_id}, not {archive.image.image_id}")
    if reader.decoded_bytes != archive.uncompressed_bytes:
        raise VerificationError(f"the archive written reads back as {reader.decoded_bytes} bytes, not "
                                f"{archive.uncompressed_bytes}")
    return ReadBack(file_sha256=reader.file_sha256(), compressed_sha256=reader.whole.hexdigest(),
                    uncompressed_sha256=reader.decoded.hexdigest(), uncompressed_bytes=reader.decoded_bytes,
                    image=image, loaded=outcome, seconds=time.monotonic() - start, frames=tuple(seen),
                    vouched=tuple(vouched_names))
