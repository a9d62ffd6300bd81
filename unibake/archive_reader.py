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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard

from .archive import LDM_WINDOW_LOG, Archive
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
                 progress: Callable[[int], object] = lambda n: None):
        self.folder, self.names, self.progress = folder, list(names), progress
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
            data = self._fh.read(size if size > 0 else CHUNK)
            if data:
                self.compressed_bytes += len(data)
                self.frames.feed(data)
                self.progress(len(data))
                if self.hasher is not None:
                    self.hasher.put((self.per_file[self._index], data))
                    if len(self.names) > 1:
                        self.hasher.put((self.whole, data))
                return data
            self._fh.close()
            self._fh = None

    def chunks(self) -> Iterator[bytes]:
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << LDM_WINDOW_LOG)
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
                    if not self.frames.ended:  # (zstandard's reader stops there without a word)
                        raise ZstdDecodeError(f"zstd cannot decode {self.names[0]}: it ends inside a zstd frame "
                                              "(truncated, or bytes after its last frame)")
                    return
                if self.hasher is not None:
                    self.hasher.put((self.decoded, chunk))
                self.decoded_bytes += len(chunk)
                yield chunk

    def finish(self) -> None:
        """Read to the end (after a failure midway) and wait for the hashing."""
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
class ReadBack:
    """What one read of the finished archive established: every digest, and the image or the load."""

    file_sha256: dict[str, str]
    compressed_sha256: str
    uncompressed_sha256: str
    uncompressed_bytes: int
    image: SavedImage | None  # parsed when nothing was loaded; a load checks the structure itself
    loaded: LoadOutcome | None
    seconds: float


def read_back(archive: Archive, *, load: Callable[[Iterable[bytes]], LoadOutcome] | None = None,
              omitted: frozenset[str] = frozenset(), progress: Callable[[int], object] = lambda n: None) -> ReadBack:
    """Read the finished archive once: the sha256 of every file and of the whole compressed stream,
    the zstd frames decoded, the sha256 of the decoded stream; and either its structure parsed
    and checked (every diffID and the config digest recomputed) or, with ``load``, the same stream
    fed to an engine's load in a second thread, which recomputes them itself and is compared with
    the archive afterwards."""
    start = time.monotonic()
    reader = ArchiveReader(archive.folder, archive.names)
    image = outcome = None

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
            image = interpret(read_members(decoded()), omitted)
    except BaseException:
        reader.abort()
        raise
    reader.finish()
    if image is not None and (image.image_id != archive.image.image_id or image.diff_ids != archive.image.diff_ids):
        raise VerificationError(f"the archive written reads back as {image.image_id}, not {archive.image.image_id}")
    if reader.decoded_bytes != archive.uncompressed_bytes:
        raise VerificationError(f"the archive written reads back as {reader.decoded_bytes} bytes, not "
                                f"{archive.uncompressed_bytes}")
    return ReadBack(file_sha256=reader.file_sha256(), compressed_sha256=reader.whole.hexdigest(),
                    uncompressed_sha256=reader.decoded.hexdigest(), uncompressed_bytes=reader.decoded_bytes,
                    image=image, loaded=outcome, seconds=time.monotonic() - start)
