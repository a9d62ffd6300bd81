"""The reconstruct kit as zstd frames a later kit can take whole.

A kit is one tar, compressed. Every build context file of ``FRAME_MIN`` bytes or more (an engine's
libraries, weights) gets a zstd frame of its own, holding exactly that file's bytes inside
``context.tar``; the rest of the tar lies in the frames between. The last frame is a skippable frame
(zstd's format: every decoder passes over it) holding the index of those large frames: where each
lies in the kit, its length, and the sha256 and size of what it decompresses to.

A zstd frame's bytes depend only on what it holds and the compressor's settings (measured: the same
bytes after any frames before it, for any write sizes and any number of workers), so a hotfix's kit
copies the frames of its base release's kit for the files that did not change instead of compressing
them again (a 0.43 GB library: about 3 CPU-seconds), and its bytes are still the ones a fresh
compression gives: ``build.py kit`` compresses everything and writes the same kit.

Why by hand: no library writes a zstd stream cut into frames at given positions of its input, with
earlier frames spliced in (python-zstandard compresses; the cutting, the index and the splice are here).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from dataclasses import dataclass, field

import zstandard
from pydantic import Field, ValidationError

from .archive import DEFAULT_LEVEL, compressor, compressor_id, index_frame, one_frame, trailing_index
from .errors import HandoffAborted
from .metadata import HEX64, Record, first_error

FRAME_MIN = 4 << 20  # a context file this big gets a frame of its own
INDEX_TAG = b"unibake-kit-frames-1"  # the skippable frame's last bytes: its JSON's length (4 bytes, LE), this tag
COPY_CHUNK = 1 << 20
# what a frame's bytes depend on besides its content: a frame made under another is compressed again
COMPRESSOR = compressor_id(DEFAULT_LEVEL, False)


class Frame(Record):
    """One large file's frame in a kit."""

    offset: int = Field(ge=0)  # in the kit file
    length: int = Field(gt=0)  # compressed
    size: int = Field(ge=FRAME_MIN)  # what it decompresses to
    sha256: str = Field(pattern=HEX64)  # of what it decompresses to (the context file's bytes)
    zsha256: str = Field(pattern=HEX64)  # of its compressed bytes


class FrameIndex(Record):
    compressor: str
    frames: tuple[Frame, ...]


@dataclass
class Cut:
    """A stretch of the tar stream that is one large file's bytes: its own frame."""

    start: int  # in the uncompressed tar stream
    size: int
    sha256: str
    reuse: Frame | None = None  # an earlier kit's frame of the same bytes
    out_start: int = 0  # where its frame begins in the kit
    zsha: object = field(default=None, repr=False)  # the frame's compressed bytes, hashed


class _Decoded:
    """Where a reused frame is decoded to: its bytes hashed and counted, never more than ``limit`` of them."""

    def __init__(self, limit: int):
        self.limit, self.size, self.sha = limit, 0, hashlib.sha256()

    def write(self, data) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise ValueError("the frame decodes to more bytes than its cut holds")
        self.sha.update(data)
        return len(data)


class _Out(io.RawIOBase):
    """The kit file being written: every byte hashed and counted; once ``stop`` is set, every write raises
    (a kit abandoned while its context is compressed stops at the next block)."""

    def __init__(self, fh, stop):
        self.fh, self.sha, self.bytes, self.stop, self.frame = fh, hashlib.sha256(), 0, stop, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.stop.is_set():
            raise HandoffAborted()
        self.sha.update(data)
        if self.frame is not None:
            self.frame.update(data)
        self.bytes += len(data)
        return self.fh.write(data)


class Framer(io.RawIOBase):
    """The sink of the kit's tar stream: compressed into ``out`` as zstd frames cut around each
    :class:`Cut`, a cut's frame copied from ``source`` (an open file: an earlier kit) when it has one
    to reuse and the copy's bytes have the recorded sha256 (compressed again otherwise)."""

    def __init__(self, fh, stop, vouched: dict[str, tuple[str, int, int]] | None = None):
        self.out = _Out(fh, stop)
        # by the sha256 of the bytes a frame decodes to: (its compressed bytes' sha256, its length, that size), as this
        # user's earlier kits made or decoded it (their record, signed with this user's key): a copied frame whose
        # compressed bytes are those is not decoded again
        self.vouched = vouched or {}
        self.zw = compressor(DEFAULT_LEVEL, False, threads=-1).stream_writer(self.out, closefd=False)
        self.cuts: list[Cut] = []
        self.source: int | None = None
        self.pos = self.next = 0  # bytes of tar taken; the next cut's number
        self.inside: Cut | None = None
        self.pending = False  # data given to the compressor since its last frame ended
        self.frames: list[Frame] = []
        self.reused = 0
        self.trusted = 0  # of the frames reused, those not decoded (the record vouched for them)

    def cut(self, cuts: list[Cut], source: int | None) -> None:
        """Where the frames of their own lie (all of them past what was written so far)."""
        assert not self.cuts and all(c.start >= self.pos for c in cuts)
        self.cuts, self.source = sorted(cuts, key=lambda c: c.start), source

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            if self.inside is not None:
                cut = self.inside
                take = min(len(view), cut.start + cut.size - self.pos)
                if cut.reuse is None:
                    self._compress(view[:take])
                self.pos += take
                view = view[take:]
                if self.pos == cut.start + cut.size:
                    self._end(cut)
                continue
            limit = self.cuts[self.next].start if self.next < len(self.cuts) else None
            take = len(view) if limit is None else min(len(view), limit - self.pos)
            if take:
                self._compress(view[:take])
                self.pos += take
                view = view[take:]
            if limit is not None and self.pos == limit:
                self._begin(self.cuts[self.next])
                self.next += 1
        return len(data)

    def _compress(self, data) -> None:
        self.zw.write(data)
        self.pending = True

    def _end_frame(self) -> None:
        if self.pending:  # (a second flush would write an empty frame)
            self.zw.flush(zstandard.FLUSH_FRAME)
            self.pending = False

    def _begin(self, cut: Cut) -> None:
        self._end_frame()
        self.inside = cut
        cut.out_start = self.out.bytes
        if cut.reuse is not None and self._copy(cut):
            return
        cut.reuse = None  # compressed as its bytes come
        cut.zsha = self.out.frame = hashlib.sha256()

    def _copy(self, cut: Cut) -> bool:
        """The earlier kit's frame written out; False, with nothing written, when its bytes are not the
        ones its index records (the file changed since it was checked)."""
        assert self.source is not None and cut.reuse is not None
        frame = cut.reuse
        fh, at = self.out.fh, self.out.bytes
        saved, check = self.out.sha.copy(), hashlib.sha256()
        # the frame decoded as it is copied, against the bytes this cut is (its size and sha256): the index that
        # names the frame comes from the earlier kit, and vouches for its compressed bytes alone (a frame of as
        # many zero bytes under the file's sha256 was copied, and the kit's context.tar was another)
        if not one_frame(self.source, frame.offset, frame.length):  # (a skippable frame in it: bytes not decoded)
            return False
        # a frame this user's kits made or decoded (the signed record's compressed sha256 and length for these bytes)
        # decodes to them: only its compressed bytes are hashed, against the record (about 1.5 CPU-seconds fewer for
        # a 0.43 GB library on this machine kind, beside the export); any other is decoded as it is copied
        trusted = self.vouched.get(cut.sha256) == (frame.zsha256, frame.length, cut.size)
        content = _Decoded(cut.size)
        decoder = None if trusted else zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_writer(
            content, write_size=COPY_CHUNK, write_return_read=True)
        done = 0
        while done < frame.length:
            try:
                chunk = os.pread(self.source, min(COPY_CHUNK, frame.length - done), frame.offset + done)
                if decoder is not None:
                    decoder.write(chunk)
            except (OSError, zstandard.ZstdError, ValueError):  # (compressed anew, as below)
                break
            if not chunk:
                break
            check.update(chunk)
            self.out.write(chunk)
            done += len(chunk)
        if done == frame.length and check.hexdigest() == frame.zsha256 and (trusted or (
                content.size == cut.size and content.sha.hexdigest() == cut.sha256)):
            self.reused += 1
            self.trusted += trusted
            cut.zsha = check
            return True
        fh.flush()
        fh.seek(at)
        fh.truncate()
        self.out.sha, self.out.bytes = saved, at
        return False

    def _end(self, cut: Cut) -> None:
        if cut.reuse is None:
            self._end_frame()
        self.out.frame = None
        self.inside = None
        self.frames.append(Frame(offset=cut.out_start, length=self.out.bytes - cut.out_start, size=cut.size,
                                 sha256=cut.sha256, zsha256=cut.zsha.hexdigest()))  # type: ignore[attr-defined]

    def close_stream(self) -> None:
        """The last frame ended and the index written after it."""
        assert self.inside is None and self.next == len(self.cuts), "the tar ended inside a cut"
        self._end_frame()
        index = json.dumps(FrameIndex(compressor=COMPRESSOR, frames=tuple(self.frames)).model_dump(),
                           sort_keys=True, separators=(",", ":")).encode()
        self.out.write(index_frame(index, INDEX_TAG))


def read_index(fd: int) -> FrameIndex | str:
    """The frame index at the end of the kit open at ``fd``; a reason (a string) when there is none to use."""
    found = trailing_index(fd, INDEX_TAG, "kits")
    if isinstance(found, str):
        return found
    try:
        index = FrameIndex.model_validate_json(found[0])
    except ValidationError as exc:
        return f"its frame index is not valid ({first_error(exc)})"
    if any(f.offset + f.length > found[1] for f in index.frames):
        return "its frame index names bytes past the frames"
    return index


@dataclass
class Reusable:
    """An earlier kit whose frames a new one may copy: open, checked whole against its recorded sha256."""

    fd: int
    frames: dict[tuple[str, int], Frame]

    def close(self) -> None:
        os.close(self.fd)


def open_reusable(path, sha256: str, size: int) -> Reusable | str:
    """The kit at ``path`` ready to lend its frames, when it is ``size`` bytes whose sha256 is ``sha256``
    (the base release's manifest records both) and it ends with an index of frames made with this
    compressor; otherwise why not (its frames are then compressed again: the same bytes, only slower)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot open it ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a file")
        if st.st_size != size:  # (never hashed when it is not the size recorded)
            raise ValueError(f"it is {st.st_size} bytes, not the {size} its release records")
        with open(fd, "rb", closefd=False) as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != sha256:
                raise ValueError("its sha256 is not the one its release records")
        index = read_index(fd)
        if isinstance(index, str):
            raise ValueError(index)
        if index.compressor != COMPRESSOR:
            raise ValueError(f"its frames were made by {index.compressor}, not {COMPRESSOR}")
        return Reusable(fd=fd, frames={(f.sha256, f.size): f for f in index.frames})
    except (ValueError, OSError) as exc:
        os.close(fd)
        return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
