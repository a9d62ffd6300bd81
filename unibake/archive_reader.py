"""Reading an archive back: one pass over its file(s) that takes every digest and either parses the
image inside or feeds an engine's load.

:class:`ArchiveReader` reads the file(s) in order and decodes the zstd frames; the sha256 of each
file, of the whole compressed stream and of the decoded stream are taken in a second thread as the
bytes pass. :func:`read_back` is the release's read of what it just wrote; ``verify`` and the
loads use the same reader.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import zstandard

from .archive import LDM_WINDOW_LOG, Archive, FrameWalker, compressor_id
from .engine import LoadOutcome
from .errors import ArchiveError, VerificationError, ZstdDecodeError
from .files import open_regular
from .imagetar import CHUNK, SavedImage, Skipped, interpret, read_members
from .sha256state import AVAILABLE as RESUMABLE, Sha256, StateError
from .threads import consume_in_thread, hashing_thread


@dataclass(frozen=True, kw_only=True)
class Resume:
    """Where a big blob's own frame ended in an archive an earlier read back decoded, and where that read back
    stood there. A read back whose compressed bytes before the frame are the same (``prefix``) decodes to the
    same bytes up to the frame's end: it may pass over the frame without decoding it, and resume the decoded
    stream's sha256 from ``state``; its compressed bytes up to the frame's end must then hash to ``through``."""

    prefix: str  # sha256 of the compressed bytes before the frame (the archive's parts as one)
    through: str  # sha256 of the compressed bytes up to the frame's end
    decoded_end: int  # the decoded stream's length at the frame's end
    state: str  # hex: the decoded stream's sha256 state there (:meth:`unibake.sha256state.Sha256.state`)


class _Snapshot:
    """An item for the hashing thread: ``take()`` runs once every item put before it is hashed."""

    def __init__(self, take: Callable[[], object]):
        self.take, self.value, self.done = take, None, threading.Event()

    def update(self, _data) -> None:
        self.value = self.take()
        self.done.set()


class _Restore:
    """An item for the hashing thread: the decoded stream's sha256 put in the state a record gives, where the
    bytes it follows (not decoded here) end."""

    def __init__(self, hasher: Sha256, state: bytes, length: int):
        self.hasher, self.state, self.length = hasher, state, length

    def update(self, _data) -> None:
        try:
            self.hasher.restore(self.state, self.length)
        except StateError as exc:
            raise VerificationError(f"the record of an earlier read back gives {exc}") from None


class ArchiveReader:
    """One read of an archive's file(s), in order: with ``hashed``, the sha256 of each file, of the
    whole compressed stream and of the decoded stream, taken in a second thread as the bytes pass.

    Iterate :meth:`chunks` for the decoded stream; after a failure, :meth:`finish` reads what is
    left so that every file's digest is still complete (a downloader wants to know which part is bad).
    ``limit``: the decoded stream's length the manifest records; a stream that decodes to more is refused as
    soon as it does (a zstd bomb, or a tar member of zeros, then costs the recorded length, not its own).
    """

    def __init__(self, folder: Path, names: list[str], *, hashed: bool = True,
                 progress: Callable[[int], object] = lambda n: None, ranges: Iterable[tuple[int, int]] = (),
                 skips: Mapping[int, tuple[int, int, Resume, str]] = {}, limit: int | None = None):
        self.folder, self.names, self.progress, self.limit = folder, list(names), progress, limit
        # ``ranges``: (offset, length) of compressed bytes (the parts as one) each hashed on its own, where a zstd
        # frame must begin and end; the decoded stream's length at each of those places is kept (``decoded_at``),
        # and (hashed) the sha256 of the compressed bytes before it (``prefix_at``) and the decoded stream's
        # sha256 state there (``state_at``)
        self.ranges = sorted(set(ranges))
        self.range_sha256 = {r: hashlib.sha256() for r in self.ranges}
        self._stops = sorted({at for offset, length in self.ranges for at in (offset, offset + length)})
        self._next_range = 0
        self.decoded_at: dict[int, int] = {}
        self.prefix_at: dict[int, str] = {}
        self.state_at: dict[int, bytes] = {}
        self._snapshots: dict[int, _Snapshot] = {}
        self.hasher = hashing_thread() if hashed else None
        self.whole = hashlib.sha256()
        self.per_file = [hashlib.sha256() if len(self.names) > 1 else self.whole for _ in self.names]
        self.decoded = Sha256() if RESUMABLE and hashed else hashlib.sha256()
        # ``skips``: by a range's offset, (its length, the size it decodes to, the record of an earlier read back
        # that decoded it, the member it holds): passed over undecoded where the compressed bytes before it are the
        # recorded ones
        self._skips = dict(skips) if isinstance(self.decoded, Sha256) else {}
        self.skipped: list[int] = []  # the offsets of the frames passed over
        self._skipping = False
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
                    if inside is not None and not self._skipping:  # (a frame passed over: bound by ``through``)
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

    def chunks(self) -> Iterator[bytes | Skipped]:
        """The decoded stream, in pieces; a frame passed over (``skips``) comes as one :class:`Skipped`."""
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << LDM_WINDOW_LOG)
        while True:  # one decoder per stretch between two stops: the decoded length at a stop is exact
            skip = self._skips.get(self.compressed_bytes) if self._skips else None
            if skip is not None and self._may_skip(*skip):
                yield self._pass_over(*skip)
            else:
                yield from self._decode_stretch(dctx)
            stop = self._stops[0] if self._stops and self._stops[0] == self.compressed_bytes else None
            if not self.frames.ended:  # (zstandard's reader stops there without a word)
                raise ZstdDecodeError(f"zstd cannot decode {self.names[0]}: " + (
                    f"a zstd frame runs across byte {stop}, where its frame index says a blob's frame begins or "
                    "ends" if stop is not None else
                    "it ends inside a zstd frame (truncated, or bytes after its last frame)"))
            if stop is None:
                return
            self._stopped(self._stops.pop(0))

    def _stopped(self, at: int) -> None:
        """At a stop: the decoded length there, and (hashed) the compressed bytes' sha256 and the decoded
        stream's sha256 state there, taken by the hashing thread in its turn."""
        self.decoded_at[at] = self.decoded_bytes
        if self.hasher is not None:
            whole, decoded = self.whole, self.decoded
            snapshot = _Snapshot(lambda: (whole.copy().hexdigest(),
                                          decoded.state() if isinstance(decoded, Sha256) else None))
            self.hasher.put((snapshot, b""))
            self._snapshots[at] = snapshot

    def _may_skip(self, length: int, size: int, resume: Resume, _name: str) -> bool:
        """Whether the frame beginning here may be passed over: it ends at the next stop, the decoded stream
        stands where the record's did, and the compressed bytes before it are the record's."""
        at = self.compressed_bytes
        snapshot = self._snapshots.get(at)
        if snapshot is None or not self._stops or self._stops[0] != at + length \
                or self.decoded_bytes + size != resume.decoded_end:
            return False
        while not snapshot.done.wait(0.05):  # the hashing thread catches up with the bytes read (a few MiB)
            if not self.hasher.alive():
                self.hasher.close()  # raises what the hashing raised
                return False
        return snapshot.value[0] == resume.prefix

    def _pass_over(self, length: int, size: int, resume: Resume, name: str) -> Skipped:
        """Read a frame's compressed bytes (hashed, its block headers followed) without decoding them; the
        decoded stream's sha256 resumes from the record's state after the ``size`` bytes they decode to."""
        at = self.compressed_bytes
        self._skipping = True
        try:
            while self.read(CHUNK):
                pass
        finally:
            self._skipping = False
        if self.compressed_bytes != at + length:
            raise ZstdDecodeError(f"zstd cannot decode {self.names[0]}: it ends inside a zstd frame (truncated, "
                                  "or bytes after its last frame)")
        self.decoded_bytes += size
        self._within_limit()
        self.hasher.put((_Restore(self.decoded, bytes.fromhex(resume.state), self.decoded_bytes), b""))
        self.skipped.append(at)
        return Skipped(size, name, at)

    def _decode_stretch(self, dctx) -> Iterator[bytes]:
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
                self._within_limit()
                yield chunk

    def _within_limit(self) -> None:
        if self.limit is not None and self.decoded_bytes > self.limit:
            raise ArchiveError(f"{self.names[0]} decompresses to more than the {self.limit} bytes manifest.json "
                               "records: refused there, not decompressed further")

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
        for at, snapshot in self._snapshots.items():
            if snapshot.value is not None:
                self.prefix_at[at], state = snapshot.value
                if state is not None:
                    self.state_at[at] = state

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
    resume: Resume | None = None  # where it ended in the archive read, for a read back that may pass over it


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
    frames: tuple[FrameSeen, ...] = ()  # the blobs' own frames it found bound to their blobs
    vouched: tuple[str, ...] = ()  # blobs not hashed: their frames are ones an earlier read back decoded
    passed_over: tuple[str, ...] = ()  # of those, the ones whose frames it did not decode either


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
    but must be bound to a frame of that sha256, or the archive is refused. Where the record also says where
    that frame ended in the archive it read (``FrameSeen.resume``) and the compressed bytes before the frame
    are the same here, the frame is not decoded either (``passed_over``): the decoded stream's sha256 resumes
    from the recorded state after it, and the compressed bytes up to its end must hash as recorded."""
    start = time.monotonic()
    watched = [b for b in archive.frames if b.own] if load is None and (bind_frames or vouched) else []
    made_by = compressor_id(archive.level, archive.long_distance)
    unhashed = {b.name: seen.blob for b in watched
                if (seen := vouched.get(b.name.rsplit("/", 1)[-1])) is not None and seen.length == b.length
                and seen.size == b.size and seen.compressor == made_by and b.name == f"blobs/sha256/{seen.blob}"}
    skips = {b.offset: (b.length, b.size, resume, b.name) for b in watched if b.name in unhashed
             and (resume := vouched[unhashed[b.name]].resume) is not None}
    reader = ArchiveReader(archive.folder, archive.names, ranges=[(b.offset, b.length) for b in watched], skips=skips)
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
    seen, vouched_names, passed = [], [], set(reader.skipped)

    def resume(b, member) -> Resume | None:
        """Where the frame ended here, for a later read back that may pass over it: a plain layer no read back
        keeps, whose place and decoded sha256 state were taken."""
        end = b.offset + b.length
        if member.data is not None or member.zstd or member.content_sha256 != member.sha256 \
                or end not in reader.state_at or b.offset not in reader.prefix_at:
            return None
        return Resume(prefix=reader.prefix_at[b.offset], through=reader.prefix_at[end],
                      decoded_end=reader.decoded_at[end], state=reader.state_at[end].hex())

    for b in watched:
        begins, ends = reader.decoded_at.get(b.offset), reader.decoded_at.get(b.offset + b.length)
        member = members.get(b.name)
        bound = (member is not None and begins is not None and ends is not None and members.offsets.get(b.name) == begins
                 and ends - begins == b.size == member.size)
        if b.name in members.unhashed:
            recorded = vouched[unhashed[b.name]]
            if b.offset in passed:  # not decoded: the compressed bytes up to its end are the record's
                held = reader.prefix_at.get(b.offset + b.length) == recorded.resume.through
            else:
                held = reader.range_sha256[(b.offset, b.length)].hexdigest() == recorded.frame_sha256
            if not bound or not held:
                raise VerificationError(f"the archive written does not hold, at byte {b.offset}, the frame of {b.name} "
                                        "an earlier read back decoded (its bytes were copied from another archive)")
            vouched_names.append(b.name)
            seen.append(dataclasses.replace(recorded, resume=resume(b, member)))
        elif bound and member.sha256 == b.name.rsplit("/", 1)[-1]:
            seen.append(FrameSeen(blob=member.sha256, frame_sha256=reader.range_sha256[(b.offset, b.length)].hexdigest(),
                                  length=b.length, size=b.size, compressor=made_by, resume=resume(b, member)))
    if image is not None and (image.image_id != archive.image.image_id or image.diff_ids != archive.image.diff_ids):
        raise VerificationError(f"the archive written reads back as {image.image_id}, not {archive.image.image_id}")
    if reader.decoded_bytes != archive.uncompressed_bytes:
        raise VerificationError(f"the archive written reads back as {reader.decoded_bytes} bytes, not "
                                f"{archive.uncompressed_bytes}")
    return ReadBack(file_sha256=reader.file_sha256(), compressed_sha256=reader.whole.hexdigest(),
                    uncompressed_sha256=reader.decoded.hexdigest(), uncompressed_bytes=reader.decoded_bytes,
                    image=image, loaded=outcome, seconds=time.monotonic() - start, frames=tuple(seen),
                    vouched=tuple(vouched_names),
                    passed_over=tuple(b.name for b in watched if b.offset in passed))
