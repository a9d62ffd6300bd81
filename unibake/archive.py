"""Stage 5: the archive, in one streaming pass.

The engine's save stream flows once through: the sha256 of the uncompressed stream, a zstd
compressor writing straight into the output file (or parts), the sha256 of what is written, and
the tar parser that recomputes every layer's diffID and the config digest. No uncompressed tar
touches the disk and memory stays flat whatever the image size.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard

from .errors import UnibakeError
from .savestream import SavedImage, inspect_save_stream

DEFAULT_LEVEL = 3
# zstd's decoders accept a window up to 2^27 without --long; keep long-distance matching within it.
LDM_WINDOW_LOG = 27


class DiskFull(UnibakeError):
    """The output folder ran out of space; partial files are removed."""


@dataclass(frozen=True, kw_only=True)
class ArchiveFile:
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Archive:
    """The compressed archive on disk and what one pass over it established."""

    folder: Path
    name: str  # the archive's name; with parts, they are name.part-000, ...
    files: tuple[ArchiveFile, ...]
    compressed_bytes: int
    compressed_sha256: str  # of the whole compressed stream (all parts in order)
    uncompressed_bytes: int
    uncompressed_sha256: str
    level: int
    long_distance: bool
    image: SavedImage
    seconds: float

    @property
    def is_split(self) -> bool:
        return len(self.files) > 1 or self.files[0].name != self.name

    @property
    def ratio(self) -> float:
        return self.uncompressed_bytes / self.compressed_bytes if self.compressed_bytes else 0.0


def part_name(name: str, index: int) -> str:
    return f"{name}.part-{index:03d}"


class PartWriter:
    """A write-only file that lands in ``folder`` as ``name`` (or ``name.part-NNN`` of ``split`` bytes each).

    Each file is written under a temporary dot-name and renamed only when complete and fsynced.
    """

    def __init__(self, folder: Path, name: str, split: int | None = None):
        self.folder, self.name, self.split = folder, name, split
        self.whole = hashlib.sha256()
        self.total = 0
        self.done: list[ArchiveFile] = []
        self._temps: list[Path] = []
        self._fh = None
        self._part_hash = hashlib.sha256()
        self._part_bytes = 0

    def _final_name(self, index: int) -> str:
        return part_name(self.name, index) if self.split else self.name

    def _open(self) -> None:
        temp = self.folder / f".{self._final_name(len(self.done))}.tmp"
        self._temps.append(temp)
        self._fh = open(temp, "wb")
        self._part_hash, self._part_bytes = hashlib.sha256(), 0

    def _write(self, data: memoryview) -> None:
        try:
            self._fh.write(data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"no space left in {self.folder} after writing {self.total} bytes of the "
                               "archive") from None
            raise UnibakeError(f"cannot write the archive in {self.folder}: {exc.strerror}") from None
        self._part_hash.update(data)
        self._part_bytes += len(data)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.whole.update(view)
        self.total += len(view)
        while len(view):
            if self._fh is None:
                self._open()
            room = len(view) if not self.split else self.split - self._part_bytes
            self._write(view[:room])
            view = view[room:]
            if self.split and self._part_bytes >= self.split:
                self._close_part()
        return len(data)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def _close_part(self) -> None:
        fh, self._fh = self._fh, None
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        final = self._final_name(len(self.done))
        os.replace(self._temps[-1], self.folder / final)
        self.done.append(ArchiveFile(name=final, bytes=self._part_bytes, sha256=self._part_hash.hexdigest()))

    def finish(self) -> tuple[ArchiveFile, ...]:
        if self._fh is not None or not self.done:
            if self._fh is None:
                self._open()
            self._close_part()
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return tuple(self.done)

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for path in self._temps + [self.folder / f.name for f in self.done]:
            path.unlink(missing_ok=True)


class TeeReader:
    """A readable file over an iterator of chunks that hands every byte it reads to ``sinks`` too."""

    def __init__(self, chunks: Iterable[bytes], sinks: list[Callable[[bytes], object]]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._sinks = sinks
        self._buffer = b""
        self._offset = 0
        self.total = 0

    def _next(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self.total += len(chunk)
                for sink in self._sinks:
                    sink(chunk)
                self._buffer, self._offset = chunk, 0
                return True
        return False

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            parts = [self._buffer[self._offset:]]
            while self._next():
                parts.append(self._buffer)
            self._buffer, self._offset = b"", 0
            return b"".join(parts)
        if self._offset >= len(self._buffer) and not self._next():
            return b""
        end = self._offset + size
        data = self._buffer[self._offset:end] if (self._offset or end < len(self._buffer)) else self._buffer
        self._offset = min(end, len(self._buffer))
        return data

    def drain(self) -> None:
        """Consume what the parser did not read (tar padding), so every byte is compressed and hashed."""
        self._buffer, self._offset = b"", 0
        while self._next():
            self._buffer, self._offset = b"", 0


def compressor(level: int, long_distance: bool, threads: int = -1) -> zstandard.ZstdCompressor:
    if not 1 <= level <= 19:
        raise UnibakeError(f"zstd level {level} is out of range 1..19")
    params = zstandard.ZstdCompressionParameters.from_level(
        level, threads=threads, write_checksum=True, enable_ldm=long_distance,
        **({"window_log": LDM_WINDOW_LOG} if long_distance else {}))
    return zstandard.ZstdCompressor(compression_params=params)


def write_archive(chunks: Iterable[bytes], folder: Path, name: str, *, level: int = DEFAULT_LEVEL,
                  long_distance: bool = False, split: int | None = None, threads: int = -1,
                  progress: Callable[[int], object] = lambda n: None) -> Archive:
    """Compress a save stream into ``folder/name`` (or parts) while recomputing the image's identity."""
    start = time.monotonic()
    raw = hashlib.sha256()
    writer = PartWriter(folder, name, split)
    try:
        with compressor(level, long_distance, threads).stream_writer(writer, closefd=False) as zstd_out:
            tee = TeeReader(chunks, [raw.update, zstd_out.write, lambda c: progress(len(c))])
            saved = inspect_save_stream(tee)
            tee.drain()
        files = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return Archive(folder=folder, name=name, files=files, compressed_bytes=writer.total,
                   compressed_sha256=writer.whole.hexdigest(), uncompressed_bytes=tee.total,
                   uncompressed_sha256=raw.hexdigest(), level=level, long_distance=long_distance,
                   image=saved, seconds=time.monotonic() - start)


def read_archive(folder: Path, files: Iterable[str]) -> Iterator[bytes]:
    """The decompressed stream of an archive's file(s), concatenated in order."""
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << LDM_WINDOW_LOG)
    reader = dctx.stream_reader(_Concatenated([folder / f for f in files]), read_across_frames=True)
    with reader:
        while True:
            block = reader.read(1 << 20)
            if not block:
                return
            yield block


class _Concatenated:
    """A readable file over several files in order (the parts of a split archive)."""

    def __init__(self, paths: list[Path]):
        self._paths = list(paths)
        self._fh = None

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._fh is None:
                if not self._paths:
                    return b""
                self._fh = open(self._paths.pop(0), "rb")
            data = self._fh.read(size)
            if data:
                return data
            self._fh.close()
            self._fh = None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
