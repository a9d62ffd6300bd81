"""The archive's frame index, and an earlier release's archive lending its frames to a whole release made on it
(``build --from``): the archive assembled from lent frames is the one compressing everything gives, byte for byte."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess

import pytest
import zstandard

from unibake.archive import (FRAMES_TAG, RESERVE, SPOOL_THRESHOLD, ArchiveFrames, _assemble, _Lent, canonical_entries,
                             compressor, compressor_id, index_frame, one_frame, open_lender, skippable, trailing_index,
                             write_archive)
from unibake.archive_reader import read_archive

from ..savefixtures import docker_layout, layer_tar

TAG = "demo:1"


def chunks(data: bytes, size: int = 1 << 16):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def layers() -> list[bytes]:
    """Two big layers (frames of their own; the biggest first in the archive) and a small one (in a shared frame)."""
    return [layer_tar({"lib.so": os.urandom(1 << 20) * 2}), layer_tar({"a.json": b'{"a": 1}'}),
            layer_tar({"weights.bin": os.urandom(3 << 20)})]


@pytest.fixture
def earlier(tmp_path):
    data, _, _ = docker_layout(layers())
    folder = tmp_path / "earlier"
    folder.mkdir()
    archive = write_archive(chunks(data), folder, "demo-1.tar.zst", tag=TAG)
    return archive, folder / "demo-1.tar.zst"


def index_of(path) -> tuple[ArchiveFrames, int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        found = trailing_index(fd, FRAMES_TAG, "archives")
    finally:
        os.close(fd)
    assert not isinstance(found, str), found
    return ArchiveFrames.model_validate_json(found[0]), found[1]


def test_the_index_says_where_every_blob_lies_and_every_zstd_decoder_passes_over_it(earlier):
    archive, path = earlier
    index, start = index_of(path)
    data = path.read_bytes()
    assert index.compressor == compressor_id(3, False)
    blobs = {b.name: b for b in index.blobs}
    digests = {f"blobs/sha256/{d[7:]}" for d in archive.image.diff_ids}
    assert digests <= set(blobs) and f"blobs/sha256/{archive.image.image_id[7:]}" in blobs  # the config too
    for blob in blobs.values():
        frame = zstandard.ZstdDecompressor().decompressobj().decompress(data[blob.offset:blob.offset + blob.length])
        content = frame[blob.inner:blob.inner + blob.size]
        assert hashlib.sha256(content).hexdigest() == blob.name.rsplit("/", 1)[1]
        assert blob.own == (blob.size > SPOOL_THRESHOLD) and (blob.inner == 0 if blob.own else True)
    biggest = max((b for b in blobs.values() if b.own), key=lambda b: b.size)
    assert biggest.offset == RESERVE  # laid in place, behind the room kept for the headers
    assert data[start:] == index_frame(json.dumps(index.model_dump(), sort_keys=True, separators=(",", ":")).encode(),
                                       FRAMES_TAG)  # the archive's last frame
    stream = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    assert stream == b"".join(read_archive(path.parent, [path.name]))
    assert len(stream) == archive.uncompressed_bytes


def test_an_archive_assembled_from_lent_frames_is_byte_for_byte_the_one_compressed_anew(earlier, tmp_path):
    archive, path = earlier
    lender = open_lender(path, path.stat().st_size, level=3, long_distance=False, what="release 1's archive")
    assert not isinstance(lender, str), lender
    lent = []
    try:
        members = []
        for member, diff_id in zip(archive.image.layer_members, archive.image.diff_ids):
            found = lender.lend(diff_id[7:], member.size)
            assert found is not None
            lent.append(found)
            members.append(dataclasses.replace(member, routed=found, data=None) if isinstance(found, _Lent)
                           else dataclasses.replace(member, routed=None, data=found))
        assert sum(isinstance(f, _Lent) for f in lent) == 2 and sum(isinstance(f, bytes) for f in lent) == 1
        saved = dataclasses.replace(archive.image, layer_members=tuple(members))
        again = tmp_path / "again"
        again.mkdir()
        out, total = _assemble(canonical_entries(saved, TAG, frozenset()), again, "demo-1.tar.zst", None,
                               compressor(3, False), compressor_id(3, False))
        out.finish()
    finally:
        lender.close()
    assert total == archive.uncompressed_bytes
    assert (again / "demo-1.tar.zst").read_bytes() == path.read_bytes()
    assert os.listdir(again) == ["demo-1.tar.zst"]


def test_a_small_layer_the_index_misplaces_is_not_lent(earlier):
    """Its bytes are checked against its digest: an index naming another place in its frame lends nothing."""
    _, path = earlier
    index, _ = index_of(path)
    small = next(b for b in index.blobs if not b.own and b.size > 1024)
    _other_index(path, lambda body: next(b for b in body["blobs"] if b["name"] == small.name).update(
        inner=small.inner + 512))
    lender = open_lender(path, path.stat().st_size, level=3, long_distance=False, what="release 1's archive")
    try:
        assert lender.lend(small.name.rsplit("/", 1)[1], small.size) is None
        assert lender.lend(small.name.rsplit("/", 1)[1], small.size + 1) is None  # nor at another size
    finally:
        lender.close()


@pytest.mark.parametrize("where", ["after", "before"])
def test_a_big_layer_s_range_holding_a_skippable_frame_is_not_lent(earlier, tmp_path, where):
    """Found by probing: a skippable frame (anyone's bytes; decoders pass over it) put beside a big layer's frame,
    the earlier archive's index, manifest and sums redone to cover it, was copied into the release made on it,
    which was then signed. A big layer's range must be one zstd frame and nothing else."""
    _, path = earlier
    index, start = index_of(path)
    big = max((b for b in index.blobs if b.own), key=lambda b: b.offset)
    data = path.read_bytes()
    payload = skippable(1024)[:8] + b"ATTACKER PAYLOAD".ljust(1016, b"!")
    at = big.offset + big.length if where == "after" else big.offset
    forged = data[:at] + payload + data[at:start]
    body = json.loads(index.model_dump_json())
    for blob in body["blobs"]:  # the big layer's range takes the payload in, the frames after it move
        if blob["name"] == big.name:
            blob["length"] += len(payload)
        elif blob["offset"] >= at:
            blob["offset"] += len(payload)
    forged += index_frame(json.dumps(body).encode(), FRAMES_TAG)
    lender_path = tmp_path / "forged.tar.zst"
    lender_path.write_bytes(forged)
    assert subprocess.run(["zstd", "-dc", str(lender_path)], capture_output=True).stdout == \
        subprocess.run(["zstd", "-dc", str(path)], capture_output=True).stdout  # decodes as the archive did
    lender = open_lender(lender_path, len(forged), level=3, long_distance=False, what="release 1's archive")
    assert not isinstance(lender, str), lender
    try:
        assert lender.lend(big.name.rsplit("/", 1)[1], big.size) is None  # compressed anew, not copied
        others = [b for b in index.blobs if b.own and b.name != big.name]
        assert all(isinstance(lender.lend(b.name.rsplit("/", 1)[1], b.size), _Lent) for b in others) and others
    finally:
        lender.close()


def test_one_frame_is_one_zstd_frame_and_nothing_else(tmp_path):
    frame = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(os.urandom(300000) * 2)
    plain = zstandard.ZstdCompressor(level=1).compress(b"x" * 1000)  # no checksum, a run-length block
    cases = {"frame": (frame, True), "without checksum": (plain, True),
             "frame, skippable": (frame + skippable(64), False), "skippable, frame": (skippable(64) + frame, False),
             "two frames": (frame + plain, False),
             "cut short": (frame[:-1], False), "a byte more": (frame + b"\0", False), "not zstd": (b"x" * 64, False),
             "empty": (b"", False)}
    path = tmp_path / "frames"
    path.write_bytes(b"".join(data for data, _ in cases.values()))
    fd = os.open(path, os.O_RDONLY)
    try:
        at = 0
        for name, (data, expected) in cases.items():
            assert one_frame(fd, at, len(data)) is expected, name
            at += len(data)
    finally:
        os.close(fd)


def _without_index(path) -> None:
    _, start = index_of(path)
    with open(path, "r+b") as fh:
        fh.truncate(start)


def _other_index(path, change) -> None:
    index, start = index_of(path)
    body = json.loads(index.model_dump_json())
    change(body)
    with open(path, "r+b") as fh:
        fh.truncate(start)
        fh.seek(start)
        fh.write(index_frame(json.dumps(body).encode(), FRAMES_TAG))


@pytest.mark.parametrize("case,reason", [
    ("no index", "it ends without a frame index (made before archives had one)"),
    ("other level", f"its frames were made by {compressor_id(3, False)}, not {compressor_id(5, False)}"),
    ("other size", "bytes, not the 12 its release records"),
    ("a link", "cannot open it"),
    ("past the frames", "its frame index names bytes past the frames"),
    ("not an index", "its frame index is not valid"),
    ("a folder", "not a file"),
])
def test_an_archive_that_cannot_lend_says_why(earlier, tmp_path, case, reason):
    _, path = earlier
    level, size = 3, None
    if case == "no index":
        _without_index(path)
    elif case == "other level":
        level = 5
    elif case == "other size":
        size = 12
    elif case == "a link":
        os.symlink(path, tmp_path / "link.tar.zst")
        path = tmp_path / "link.tar.zst"
    elif case == "past the frames":
        _other_index(path, lambda body: body["blobs"][0].update(length=1 << 40))
    elif case == "not an index":
        _other_index(path, lambda body: body["blobs"][0].update(name="../../etc/passwd"))
    elif case == "a folder":
        path = tmp_path
    found = open_lender(path, size if size is not None else (path.stat().st_size if path.is_file() else 0), level=level,
                        long_distance=False, what="release 1's archive")
    assert isinstance(found, str) and reason in found, found
