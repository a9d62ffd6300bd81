"""A read back binds each big layer's own zstd frame to the layer it decodes to; this user's signed record of
that lets a later read back (a release made ``--from`` one whose frames it copied) take the layer's diffID
without hashing it again, and only where the frame it finds is that very frame."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest

from unibake.archive import write_archive
from unibake.archive_reader import FrameSeen, read_back
from unibake.errors import UnibakeError, VerificationError, ZstdDecodeError
from unibake.framememo import FILE, VERSION, known_frames, remember_frames
from unibake.sha256state import AVAILABLE as RESUMABLE

from ..savefixtures import docker_layout, layer_tar

KEY = b"k" * 32


def chunks(data: bytes, size: int = 1 << 16):
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.fixture
def archive(tmp_path):
    """Two big layers (each its own frame) and a small one (in a shared frame)."""
    layers = [layer_tar({"lib.so": os.urandom(1 << 19) * 4}), layer_tar({"a.json": b'{"a": 1}'}),
              layer_tar({"weights.bin": os.urandom(3 << 20)})]
    data, _, _ = docker_layout(layers)
    folder = tmp_path / "release"
    folder.mkdir()
    return write_archive(chunks(data), folder, "demo-1.tar.zst", tag="demo:1")


def test_a_read_back_binds_each_big_layer_s_frame_to_its_digest(archive):
    back = read_back(archive, bind_frames=True)
    data = (archive.folder / archive.name).read_bytes()
    own = {b.name.rsplit("/", 1)[1]: b for b in archive.frames if b.own}
    layers = {d[7:] for d in archive.image.diff_ids}
    assert {f.blob for f in back.frames} == set(own) and len(set(own) & layers) == 2  # the two big layers
    for seen in back.frames:
        frame = own[seen.blob]
        assert seen.frame_sha256 == hashlib.sha256(data[frame.offset:frame.offset + frame.length]).hexdigest()
        assert (seen.length, seen.size) == (frame.length, frame.size)
    assert back.vouched == ()


def test_a_later_read_back_takes_a_recorded_frame_s_layer_unhashed_and_finds_the_same_image(archive):
    first = read_back(archive, bind_frames=True)
    unresumed = {f.blob: dataclasses.replace(f, resume=None) for f in first.frames}
    again = read_back(archive, vouched=unresumed)
    assert sorted(again.vouched) == sorted(f"blobs/sha256/{f.blob}" for f in first.frames)
    assert again.passed_over == ()  # every frame decoded: the record says not where they ended
    assert again.image.image_id == first.image.image_id and again.image.diff_ids == first.image.diff_ids
    assert (again.compressed_sha256, again.uncompressed_sha256) == (first.compressed_sha256, first.uncompressed_sha256)
    assert again.frames == first.frames  # recorded again, with where each ended in this archive


@pytest.mark.skipif(not RESUMABLE, reason="no libcrypto with SHA256_Init on this machine")
def test_a_read_back_passes_over_recorded_frames_after_the_same_bytes_and_finds_the_same_digests(archive):
    """Where the compressed bytes before a recorded frame are the ones the record's read back read, the frame is
    not decoded: the decoded stream's sha256 resumes from the recorded state, and every digest is the same."""
    first = read_back(archive, bind_frames=True)
    own = sorted((b for b in archive.frames if b.own), key=lambda b: b.offset)
    assert all(f.resume is not None for f in first.frames) and len(own) == 2
    again = read_back(archive, vouched={f.blob: f for f in first.frames})
    assert list(again.passed_over) == [b.name for b in own] and sorted(again.vouched) == sorted(again.passed_over)
    assert (again.compressed_sha256, again.uncompressed_sha256, again.uncompressed_bytes, again.file_sha256) == \
        (first.compressed_sha256, first.uncompressed_sha256, first.uncompressed_bytes, first.file_sha256)
    assert again.image.image_id == first.image.image_id and again.image.diff_ids == first.image.diff_ids
    assert again.frames == first.frames


@pytest.mark.skipif(not RESUMABLE, reason="no libcrypto with SHA256_Init on this machine")
def test_a_frame_recorded_after_other_bytes_is_decoded(archive):
    """A record of the frame where another archive's bytes came before it: its state is not this stream's."""
    first = read_back(archive, bind_frames=True)
    elsewhere = {f.blob: dataclasses.replace(f, resume=dataclasses.replace(f.resume, prefix="0" * 64))
                 for f in first.frames}
    again = read_back(archive, vouched=elsewhere)
    assert again.passed_over == () and len(again.vouched) == 2
    assert again.uncompressed_sha256 == first.uncompressed_sha256


@pytest.mark.parametrize("lie", ["frame", "through"])
def test_a_frame_other_than_the_recorded_one_is_refused(archive, lie):
    """The record says which frame decodes to the layer: a copy that is another frame is not taken on trust,
    whether it is decoded (held to the frame's sha256) or passed over (held to the sha256 up to its end)."""
    first = read_back(archive, bind_frames=True)
    if lie == "frame":
        other = {f.blob: dataclasses.replace(f, frame_sha256="0" * 64, resume=None) for f in first.frames}
    else:
        if not RESUMABLE:
            pytest.skip("no libcrypto with SHA256_Init on this machine")
        other = {f.blob: dataclasses.replace(f, resume=dataclasses.replace(f.resume, through="0" * 64))
                 for f in first.frames}
    with pytest.raises(VerificationError, match="does not hold, at byte .*, the frame of blobs/sha256/"):
        read_back(archive, vouched=other)


@pytest.mark.skipif(not RESUMABLE, reason="no libcrypto with SHA256_Init on this machine")
def test_a_recorded_state_not_after_the_recorded_length_is_refused(archive):
    """A state whose counters say another length than the record's (OpenSSL would be handed a block offset
    out of its buffer otherwise) fails the read back: it is never given to OpenSSL."""
    first = read_back(archive, bind_frames=True)
    f = first.frames[0]
    state = bytearray(bytes.fromhex(f.resume.state))
    state[104] = 63 - state[104]  # ``num``: the bytes waiting in the block
    bad = {f.blob: dataclasses.replace(f, resume=dataclasses.replace(f.resume, state=state.hex()))}
    with pytest.raises(VerificationError, match="the sha256 state is not one after"):
        read_back(archive, vouched=bad)


@pytest.mark.parametrize("resumed", [True, False])
def test_a_changed_byte_in_a_recorded_frame_fails_the_read_back(archive, resumed):
    first = read_back(archive, bind_frames=True)
    frame = max((b for b in archive.frames if b.own), key=lambda b: b.size)
    path = archive.folder / archive.name
    data = bytearray(path.read_bytes())
    data[frame.offset + frame.length // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    vouched = {f.blob: f if resumed else dataclasses.replace(f, resume=None) for f in first.frames}
    with pytest.raises((VerificationError, ZstdDecodeError)):
        read_back(archive, vouched=vouched)


def test_a_record_of_other_settings_or_size_is_not_used(archive):
    first = read_back(archive, bind_frames=True)
    for change in ({"compressor": "zstandard 0.1, level 19"}, {"length": 1}, {"size": 1}):
        back = read_back(archive, vouched={f.blob: dataclasses.replace(f, **change) for f in first.frames})
        assert back.vouched == () and len(back.frames) == 2  # every layer hashed again


def test_an_index_that_places_a_frame_inside_another_is_refused(archive):
    frame = next(b for b in archive.frames if b.own)
    moved = dataclasses.replace(archive, frames=tuple(b.model_copy(update={"offset": b.offset + 1}) if b is frame else b
                                                      for b in archive.frames))
    with pytest.raises(ZstdDecodeError, match=f"a zstd frame runs across byte {frame.offset + 1}"):
        read_back(moved, bind_frames=True)


def test_the_record_is_read_only_under_this_user_s_key_and_not_written_through_a_link(archive, tmp_path):
    seen = read_back(archive, bind_frames=True).frames
    folder = tmp_path / "project" / ".cache" / "build-memo" / "frames"
    assert remember_frames(folder, KEY, seen) == 2
    assert remember_frames(folder, KEY, seen) == 0  # nothing new: not written again
    assert known_frames(folder, KEY) == {f.blob: f for f in seen}
    assert known_frames(folder, b"another user's key".ljust(32)) == {}
    planted = (folder / FILE).read_text().replace(seen[0].frame_sha256, "1" * 64)
    (folder / FILE).write_text(planted)  # a record changed by hand: its MAC no longer holds
    assert known_frames(folder, KEY) == {}

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "checkout" / ".cache"
    linked.parent.mkdir()
    linked.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnibakeError, match="is a symlink"):
        remember_frames(linked / "build-memo" / "frames", KEY, seen)
    assert list(elsewhere.iterdir()) == []


def test_a_malformed_entry_is_left_out_and_the_others_kept(tmp_path):
    good = FrameSeen(blob="a" * 64, frame_sha256="b" * 64, length=10, size=20, compressor="c")
    folder = tmp_path / "frames"
    remember_frames(folder, KEY, [good])
    from unibake.signed import read_signed, write_signed

    entries = read_signed(folder, FILE, KEY, VERSION, limit=1 << 20)
    entries["not-hex"] = ["b" * 64, 10, 20, "c", None]
    entries["c" * 64] = ["b" * 64, -1, 20, "c", None]
    entries["d" * 64] = ["b" * 64, 10, 20, "c", ["e" * 64, "f" * 64, 30, "not a state"]]
    write_signed(folder, FILE, KEY, VERSION, entries, limit=1 << 20)
    assert known_frames(folder, KEY) == {good.blob: good}
    # a record nested deeper than the stack is no record, and the next one written replaces it
    (folder / FILE).write_text("[" * 100_000)
    assert known_frames(folder, KEY) == {}
    remember_frames(folder, KEY, [good])
    assert known_frames(folder, KEY) == {good.blob: good}


def test_a_full_record_keeps_its_newest_entries(tmp_path):
    # written with sorted keys, the record lost its order: once full, it kept the entries of the lowest digests,
    # and dropped the newest of the older ones
    from unibake.framememo import _merged
    from unibake.signed import read_signed

    folder = tmp_path / "frames"
    for n in range(5):
        _merged(folder, KEY, "t.json", {f"{n:x}" * 64: [n]}, 3, lambda k, v: True)
    assert list(read_signed(folder, "t.json", KEY, VERSION, limit=1 << 20).values()) == [[4], [3], [2]]


def test_as_many_frames_as_the_record_keeps_are_read_back(tmp_path):
    # (before: 8 MiB held about 13 500 of the 20 000 frames it keeps: 15 000 were written, 9 MiB, and read back as
    # no record at all)
    from unibake.archive_reader import Resume
    from unibake.framememo import KEPT
    from unibake.sha256state import STATE_SIZE

    resume = Resume(prefix="e" * 64, through="f" * 64, decoded_end=1 << 30, state="0" * (2 * STATE_SIZE))
    seen = [FrameSeen(blob=f"{n:064x}", frame_sha256="b" * 64, length=1 << 24, size=1 << 26,
                      compressor="zstd 1.5.5 level 3 long 27 checksum", resume=resume) for n in range(KEPT)]
    folder = tmp_path / "frames"
    remember_frames(folder, KEY, seen)
    assert (folder / FILE).stat().st_size > 8 << 20
    assert len(known_frames(folder, KEY)) == KEPT


def test_a_signed_record_larger_than_its_limit_keeps_the_newest_entries_that_fit(tmp_path):
    # (before: written whole, it was read back as no record, and every plan hashed every input again)
    from unibake.signed import read_signed, write_signed

    entries = {f"input-{n}": "x" * 100 for n in range(1000)}  # the newest first
    write_signed(tmp_path, "t.json", KEY, VERSION, entries, limit=50_000)
    assert (tmp_path / "t.json").stat().st_size <= 50_000
    kept = read_signed(tmp_path, "t.json", KEY, VERSION, limit=50_000)
    assert 300 < len(kept) < 1000 and list(kept) == [f"input-{n}" for n in range(len(kept))]


def test_a_recorded_frame_that_lies_elsewhere_than_its_layer_is_refused(tmp_path):
    """Two layers of one size: a record (and an index) that puts one layer's frame where the other's lies
    names a whole frame of the right size and sha256, but not where that layer's bytes begin."""
    layers = [layer_tar({"a.bin": os.urandom(1 << 20)}), layer_tar({"b.bin": os.urandom(1 << 20)})]
    data, _, _ = docker_layout(layers)
    folder = tmp_path / "release"
    folder.mkdir()
    archive = write_archive(chunks(data), folder, "demo-1.tar.zst", tag="demo:1")
    first = read_back(archive, bind_frames=True)
    x, y = sorted((b for b in archive.frames if b.own), key=lambda b: b.offset)
    assert x.size == y.size
    at_y = x.model_copy(update={"offset": y.offset, "length": y.length})
    swapped = dataclasses.replace(archive, frames=tuple(at_y if b is x else b for b in archive.frames))
    of_y = next(f for f in first.frames if f"blobs/sha256/{f.blob}" == y.name)
    lie = {x.name.rsplit("/", 1)[1]: dataclasses.replace(of_y, blob=x.name.rsplit("/", 1)[1])}
    with pytest.raises(VerificationError, match=f"the frame of {x.name}"):
        read_back(swapped, vouched=lie)


def test_a_read_back_not_asked_to_bind_frames_hashes_no_range(archive):
    """The sequential path's read back and the round trip's load record nothing: no compressed range is hashed."""
    assert read_back(archive).frames == ()


def test_a_record_signed_as_another_kind_is_no_frames_record(tmp_path):
    """The MAC covers the record's name: this user's signed record of another kind, copied over, reads as empty."""
    from unibake.signed import write_signed

    good = FrameSeen(blob="a" * 64, frame_sha256="b" * 64, length=10, size=20, compressor="c")
    folder = tmp_path / "frames"
    remember_frames(folder, KEY, [good])
    entries = {good.blob: [good.frame_sha256, good.length, good.size, good.compressor, None]}
    write_signed(folder, "digests.json", KEY, VERSION, entries, limit=1 << 20)
    (folder / "digests.json").replace(folder / FILE)
    assert known_frames(folder, KEY) == {}


@pytest.mark.skipif(not RESUMABLE, reason="no libcrypto with SHA256_Init on this machine")
def test_an_archive_in_parts_is_passed_over_across_its_files_with_every_part_s_digest(tmp_path):
    """The offsets are the parts' bytes as one: a frame split across two files is read through both, each file
    still hashed whole, and the decoded stream's sha256 the one decoding everything gives."""
    layers = [layer_tar({"lib.so": os.urandom(3 << 20)}), layer_tar({"w.bin": os.urandom(2 << 20)})]
    data, _, _ = docker_layout(layers)
    folder = tmp_path / "release"
    folder.mkdir()
    archive = write_archive(chunks(data), folder, "demo-1.tar.zst", tag="demo:1", split=1 << 20)
    assert len(archive.names) > 3
    first = read_back(archive, bind_frames=True)
    again = read_back(archive, vouched={f.blob: f for f in first.frames})
    assert len(again.passed_over) == 2
    assert (again.file_sha256, again.compressed_sha256, again.uncompressed_sha256) == \
        (first.file_sha256, first.compressed_sha256, first.uncompressed_sha256)
    assert again.file_sha256 == {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in archive.names}


def test_the_tar_walk_takes_a_passed_over_stretch_only_as_a_vouched_member_s_whole_content():
    """What the read back hands the tar walk for a frame it did not decode: the whole content of the member whose
    header was just read, one the caller vouched for; anything else fails, naming the frame."""
    from unibake.imagetar import Skipped, read_members

    content = os.urandom(4096)
    stream = layer_tar({"big.bin": content})
    at = stream.index(content)
    name = "big.bin"
    whole = [stream[:at], Skipped(len(content), name, 99), stream[at + len(content):]]
    members = read_members(whole, unhashed={name: "a" * 64})
    assert members[name].sha256 == "a" * 64 and members.unhashed == {name}
    for source, unhashed in (
            (whole, {}),  # not vouched for
            ([stream[:at + 1], Skipped(len(content) - 1, name, 99), stream[at + len(content):]], {name: "a" * 64}),
            ([stream[:at], Skipped(len(content), "other.bin", 99), stream[at + len(content):]], {name: "a" * 64})):
        with pytest.raises(VerificationError, match="does not hold, at byte 99, the frame of"):
            read_members(source, unhashed=unhashed)
