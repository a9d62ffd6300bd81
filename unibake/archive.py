"""Stage 5: the archive, written by our own canonical writer in one pass over the engine's save.

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

The order is fixed by the image alone (the biggest layer first, then the rest sorted), so that the
biggest layer's frames, written while the engine's stream arrived, become the archive in place and
are never copied; the other spooled frames are copied by the kernel. The digests of what was
written, compressed and uncompressed, come from the pass that reads the finished archive back
(the round trip's load, or a check without one), which every release makes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from queue import Empty, Queue

import zstandard

from .errors import UnibakeError
from .savestream import ArchiveError, Hasher, SavedImage, interpret, read_members

DEFAULT_LEVEL = 3
# zstd's decoders accept a window up to 2^27 without --long; keep long-distance matching within it.
LDM_WINDOW_LOG = 27


class DiskFull(UnibakeError):
    """The output folder ran out of space; partial files are removed."""


@dataclass(frozen=True, kw_only=True)
class ArchiveFile:
    name: str
    bytes: int
    sha256: str | None = None  # known once the archive has been read back


@dataclass(frozen=True, kw_only=True)
class Archive:
    """The compressed archive on disk and what one pass over it established."""

    folder: Path
    name: str  # the archive's name; with parts, they are name.part-000, ...
    files: tuple[ArchiveFile, ...]
    compressed_bytes: int
    compressed_sha256: str | None  # of the whole compressed stream (all parts in order), once read back
    uncompressed_bytes: int
    uncompressed_sha256: str | None  # known once the archive has been read back
    level: int
    long_distance: bool
    image: SavedImage
    seconds: float
    tag: str = ""
    shipped: tuple[str, ...] = ()  # diffIDs whose layers the archive carries
    omitted: tuple[str, ...] = ()  # diffIDs left out (a hotfix: the previous release has them)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    def with_digests(self, back) -> "Archive":
        """This archive with the digests a read-back (:class:`unibake.roundtrip.ReadBack`) measured."""
        return replace(self, files=tuple(replace(f, sha256=back.file_sha256[f.name]) for f in self.files),
                       compressed_sha256=back.compressed_sha256, uncompressed_sha256=back.uncompressed_sha256)

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
        """Append ``path`` from ``offset`` on, copied by the kernel (no pass through Python)."""
        with open(path, "rb") as src:
            left = os.fstat(src.fileno()).st_size - offset
            while left > 0:
                room = self._room(left)
                self._fh.flush()
                try:
                    copied = os.copy_file_range(src.fileno(), self._fh.fileno(), room, offset)
                except OSError as exc:
                    raise _disk_error(exc, self.folder) from None
                if copied <= 0:
                    raise UnibakeError(f"cannot copy {path} into the archive")
                self._fh.seek(0, os.SEEK_END)
                offset += copied
                left -= copied
                self._advance(copied)

    def _close_part(self) -> None:
        fh, self._fh = self._fh, None
        fh.flush()
        os.fsync(fh.fileno())
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
        finally:
            os.close(fd)
        return tuple(self.done)

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for path in self._temps + [self.folder / f.name for f in self.done]:
            path.unlink(missing_ok=True)


class ChunkReader:
    """A readable file over an iterator of chunks (for ``tarfile``, which wants ``read``)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = b""
        self._offset = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            rest = [self._buffer[self._offset:], *self._chunks]
            self._buffer, self._offset = b"", 0
            return b"".join(rest)
        while self._offset >= len(self._buffer):
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._buffer, self._offset = chunk, 0
        end = self._offset + size
        data = self._buffer[self._offset:end] if (self._offset or end < len(self._buffer)) else self._buffer
        self._offset = min(end, len(self._buffer))
        return data


def prefetch(chunks: Iterable[bytes], depth: int = 64) -> Iterator[bytes]:
    """The chunks, read ahead by a second thread (up to ``depth`` of them), so that the engine never
    waits on our hashing and compression and we never wait on its next write."""
    queue: Queue = Queue(maxsize=depth)
    stop = threading.Event()

    def reader() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    break
                queue.put(chunk)
            queue.put(None)
        except BaseException as exc:  # handed to the consumer
            queue.put(exc)

    thread = threading.Thread(target=reader, name="save-reader", daemon=True)
    thread.start()
    try:
        while (item := queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a reader waiting on a full queue
            try:
                queue.get(timeout=0.1)
            except Empty:
                pass


def compressor(level: int, long_distance: bool, threads: int = -1) -> zstandard.ZstdCompressor:
    if not 1 <= level <= 19:
        raise UnibakeError(f"zstd level {level} is out of range 1..19")
    params = zstandard.ZstdCompressionParameters.from_level(
        level, threads=threads, write_checksum=True, enable_ldm=long_distance,
        **({"window_log": LDM_WINDOW_LOG} if long_distance else {}))
    return zstandard.ZstdCompressor(compression_params=params)


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


def _json_bytes(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def tar_header(name: str, size: int, *, directory: bool = False) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if directory else (tarfile.REGTYPE, 0o644)
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def tar_padding(size: int) -> bytes:
    return bytes(-size % tarfile.BLOCKSIZE)


def full_reference(tag: str) -> str:
    """The fully qualified name the containerd image store uses for a tag."""
    first = tag.split("/", 1)[0]
    if "/" in tag and ("." in first or ":" in first or first == "localhost"):
        return tag
    return f"docker.io/{tag}" if "/" in tag else f"docker.io/library/{tag}"


SKIPPABLE_MAGIC = b"\x50\x2a\x4d\x18"  # a zstd skippable frame: decoders pass over its content
RESERVE = 4096  # room kept at the head of each spool for the frame of the tar headers before it


def skippable(size: int) -> bytes:
    """A skippable frame of exactly ``size`` bytes (at least 8)."""
    return SKIPPABLE_MAGIC + struct.pack("<I", size - 8) + bytes(size - 8)


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
        try:
            self._writer.write(data)
        except OSError as exc:
            raise _disk_error(exc, self.path.parent) from None

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
                self.compressed = self._fh.tell() - RESERVE
                self._fh.close()
            except OSError as exc:
                raise _disk_error(exc, self.path.parent) from None
            self._writer = self._fh = None


def _disk_error(exc: OSError, folder: Path) -> UnibakeError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left in {folder} while writing the archive")
    return UnibakeError(f"cannot write the archive in {folder}: {exc.strerror}")


def canonical_entries(image: SavedImage, tag: str, omit: frozenset[str]) -> list[tuple[str, object, int]]:
    """(name, content, size) of every entry of the canonical tar; content is bytes or a spooled Member.

    The order is fixed by the image alone: the two folders, the biggest layer (so that its frames
    can stay where they were written), then every other blob sorted by name, then ``index.json``,
    ``manifest.json`` and ``oci-layout``.
    """
    layers, seen = [], set()
    descriptors = []
    for member, diff_id in zip(image.layer_members, image.diff_ids):
        digest = f"sha256:{member.sha256}"
        compressed = member.content_sha256 != member.sha256
        descriptors.append({"mediaType": OCI_LAYER + ("+gzip" if compressed else ""), "digest": digest,
                            "size": member.size})
        if diff_id in omit or digest in seen:
            continue
        seen.add(digest)
        layers.append((f"blobs/sha256/{member.sha256}", member.spool if member.spool else member.data, member.size))
    config = image.config_bytes
    config_hex = hashlib.sha256(config).hexdigest()
    oci_manifest = _json_bytes({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                "config": {"mediaType": OCI_CONFIG, "digest": f"sha256:{config_hex}",
                                           "size": len(config)},
                                "layers": descriptors})
    manifest_hex = hashlib.sha256(oci_manifest).hexdigest()
    ref = tag.rsplit(":", 1)[1] if ":" in tag.rsplit("/", 1)[-1] else "latest"
    index = _json_bytes({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": f"sha256:{manifest_hex}", "size": len(oci_manifest),
        "annotations": {"io.containerd.image.name": full_reference(tag), "org.opencontainers.image.ref.name": ref}}]})
    classic = _json_bytes([{"Config": f"blobs/sha256/{config_hex}", "RepoTags": [tag],
                            "Layers": [f"blobs/sha256/{m.sha256}" for m in image.layer_members]}])
    blobs = layers + [(f"blobs/sha256/{config_hex}", config, len(config)),
                      (f"blobs/sha256/{manifest_hex}", oci_manifest, len(oci_manifest))]
    blobs = sorted({name: (name, data, size) for name, data, size in blobs}.values())
    spooled = [b for b in blobs if isinstance(b[1], _Spool)]
    if spooled:
        biggest = max(spooled, key=lambda b: (b[2], b[0]))
        blobs = [biggest] + [b for b in blobs if b is not biggest]
    return ([("blobs/", None, 0), ("blobs/sha256/", None, 0)] + blobs +
            [("index.json", index, len(index)), ("manifest.json", classic, len(classic)),
             ("oci-layout", OCI_LAYOUT, len(OCI_LAYOUT))])


def _assemble(entries, folder: Path, name: str, split: int | None, cctx: zstandard.ZstdCompressor) \
        -> tuple[PartWriter, int]:
    """Write the canonical tar as zstd frames: small pieces gathered in one frame, spooled frames
    copied by the kernel; the first spool, when nothing big precedes it, is not copied at all."""
    first = entries[2][1] if len(entries) > 2 and isinstance(entries[2][1], _Spool) else None
    head = b"".join(tar_header(n, s, directory=c is None) for n, c, s in entries[:3]) if first else b""
    head_frame = cctx.compress(head) if first else b""
    if first and len(head_frame) + 8 > RESERVE:
        first = None  # never with two folders and one header; kept for safety
    total = 0
    if first is not None:
        with open(first.path, "r+b") as fh:  # the headers go into the room kept at its head
            fh.write(head_frame + skippable(RESERVE - len(head_frame)))
        out = PartWriter(folder, name, split, adopt=None if split else first.path)
        if split:
            out.copy_from(first.path)
        entries, total = [(None, first, entries[2][2])] + entries[3:], len(head)
    else:
        out = PartWriter(folder, name, split)
    pending: list[bytes] = []

    def flush() -> None:
        if pending:
            out.write(cctx.compress(b"".join(pending)))
            pending.clear()

    for entry_name, content, size in entries:
        if entry_name is not None:  # (the adopted spool's header is already written)
            header = tar_header(entry_name, size, directory=content is None)
            pending.append(header)
            total += len(header)
            if content is None:
                continue
            if isinstance(content, (bytes, bytearray)):
                pending.append(bytes(content))
            else:
                flush()
                out.copy_from(content.path, RESERVE)
        pending.append(tar_padding(size))
        total += size + len(tar_padding(size))
    pending.append(bytes(2 * tarfile.BLOCKSIZE))
    total += 2 * tarfile.BLOCKSIZE
    flush()
    return out, total


def write_archive(chunks: Iterable[bytes], folder: Path, name: str, *, tag: str, level: int = DEFAULT_LEVEL,
                  long_distance: bool = False, split: int | None = None, threads: int = -1,
                  omit: Iterable[str] = (), progress: Callable[[int], object] = lambda n: None) -> Archive:
    """Read a save stream once, check it, and write ``folder/name`` (or parts) in the canonical form.

    ``omit`` names diffIDs whose layers stay out (a hotfix). Nothing is left behind on failure.
    The archive's digests come from reading it back (:func:`unibake.roundtrip.read_back`).
    """
    start = time.monotonic()
    cctx = compressor(level, long_distance, threads)
    spools: list[_Spool] = []

    def spool(member_name: str, size: int) -> _Spool:
        spools.append(_Spool(folder, len(spools), compressor(level, long_distance, threads)))
        return spools[-1]

    def counted(source: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in source:
            progress(len(chunk))
            yield chunk

    out = None
    try:
        members = read_members(counted(prefetch(chunks)), spool=spool)
        saved = interpret(members)
        omit_set = frozenset(omit)
        out, uncompressed = _assemble(canonical_entries(saved, tag, omit_set), folder, name, split, cctx)
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
    return Archive(folder=folder, name=name, files=files, compressed_bytes=out.total, compressed_sha256=None,
                   uncompressed_bytes=uncompressed, uncompressed_sha256=None, level=level,
                   long_distance=long_distance, image=saved, seconds=time.monotonic() - start, tag=tag,
                   shipped=tuple(d for d in saved.diff_ids if d not in omit_set),
                   omitted=tuple(d for d in saved.diff_ids if d in omit_set))


class ZstdDecodeError(ArchiveError):
    """The archive's zstd frames cannot be decoded (corrupted, truncated, or asking too much memory)."""


class ArchiveReader:
    """One read of an archive's file(s), in order: with ``hashed``, the sha256 of each file, of the
    whole compressed stream and of the decoded stream, taken in a second thread as the bytes pass.

    Iterate :meth:`chunks` for the decoded stream; after a failure, :meth:`finish` reads what is
    left so that every file's digest is still complete (a downloader wants to know which part is bad).
    """

    def __init__(self, folder: Path, names: list[str], *, hashed: bool = True):
        self.folder, self.names = folder, list(names)
        self.hasher = Hasher() if hashed else None
        self.whole = hashlib.sha256()
        self.per_file = [hashlib.sha256() if len(self.names) > 1 else self.whole for _ in self.names]
        self.decoded = hashlib.sha256()
        self.decoded_bytes = 0
        self._index, self._fh = -1, None

    def read(self, size: int = -1) -> bytes:
        """The compressed bytes, file after file (what the zstd decoder reads)."""
        while True:
            if self._fh is None:
                self._index += 1
                if self._index >= len(self.names):
                    return b""
                self._fh = open(self.folder / self.names[self._index], "rb")
            data = self._fh.read(size if size > 0 else 1 << 20)
            if data:
                if self.hasher is not None:
                    self.hasher.update(self.per_file[self._index], data)
                    if len(self.names) > 1:
                        self.hasher.update(self.whole, data)
                return data
            self._fh.close()
            self._fh = None

    def chunks(self) -> Iterator[bytes]:
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << LDM_WINDOW_LOG)
        with dctx.stream_reader(self, read_across_frames=True, read_size=1 << 20, closefd=False) as reader:
            while True:
                try:
                    chunk = reader.read(1 << 20)
                except zstandard.ZstdError as exc:
                    reason = str(exc)
                    if "too much memory" in reason:
                        reason = (f"a zstd frame declares a window over {1 << LDM_WINDOW_LOG >> 20} MiB, more "
                                  "memory than a release archive may ask of its decoder")
                    raise ZstdDecodeError(f"zstd cannot decode {self.names[0]}: {reason}") from None
                if not chunk:
                    return
                if self.hasher is not None:
                    self.hasher.update(self.decoded, chunk)
                self.decoded_bytes += len(chunk)
                yield chunk

    def finish(self) -> None:
        """Read to the end (after a failure midway) and wait for the hashing."""
        while self.read(1 << 20):
            pass
        if self.hasher is not None:
            self.hasher.finish()
            self.hasher = None

    def file_sha256(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in zip(self.names, self.per_file)}


def read_archive(folder: Path, files: list[str]) -> Iterator[bytes]:
    """The decoded stream of an archive's file(s), concatenated in order."""
    return ArchiveReader(folder, files, hashed=False).chunks()
