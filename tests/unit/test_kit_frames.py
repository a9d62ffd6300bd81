"""The kit's frames: each large context file a zstd frame of its own, indexed at the end in a skippable
frame; a hotfix's kit copies the base release's frames of the files that did not change, and its bytes
are those of a kit compressed anew; an earlier kit that does not check out lends nothing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from unibake.archive import SKIPPABLE_MAGIC, skippable
from unibake.errors import InputError
from unibake.kit import KitDraft
from unibake.kitframes import COMPRESSOR, FRAME_MIN, INDEX_TAG, read_index
from unibake.plan import make_plan
from unibake.render import render, write_context_tar
from unibake.sbom import BaseImage

BASE = BaseImage(ref="localhost/unibake-busybox:1", image_id="sha256:" + "b" * 64)
WEIGHTS = random.Random(7).randbytes(1 << 20) * 5  # 5 MiB: a frame of its own (compressible: repeated)


def kit(profiles: Path, out: Path, reuse: tuple | None = None, vouched: dict | None = None,
        made: list | None = None) -> tuple[Path, str]:
    """A kit of ``profiles`` in ``out``; ``reuse``: an earlier kit, its sha256 and its size (taken as it is
    when not given); ``vouched``: the record of frames earlier kits made; ``made``: gets this one's."""
    plan = make_plan(profiles, cwd=profiles.parent)
    out.mkdir()
    lender = (*reuse, os.lstat(reuse[0]).st_size) if reuse and len(reuse) == 2 else reuse
    draft = KitDraft(out, "k.tar.zst", plan=plan, context=render(plan), release="0.1.0", epoch=1700000000,
                     reuse=lender, vouched=vouched)
    try:
        draft.finish(image_id="sha256:" + "e" * 64, diff_ids=("sha256:" + "1" * 64,), revision="abc", base=BASE,
                     builder=None)
        if made is not None:
            made.extend(draft.made_frames())
    finally:
        draft.abandon()
    return out / "k.tar.zst", draft.reuse_note


def index_frame(index: dict) -> bytes:
    body = json.dumps(index).encode()
    body += struct.pack("<I", len(body)) + INDEX_TAG
    return SKIPPABLE_MAGIC + struct.pack("<I", len(body)) + body


def frames_end(data: bytes) -> int:
    """Where the index's skippable frame begins."""
    length = struct.unpack("<I", data[-len(INDEX_TAG) - 4:-len(INDEX_TAG)])[0]
    return len(data) - (8 + length + 4 + len(INDEX_TAG))


def unpacked(data: bytes) -> dict[str, bytes]:
    whole = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.fixture
def product(busybox_product, cli):
    (busybox_product.parent / "images/engine/weights.bin").write_bytes(WEIGHTS)
    assert cli("lock", "--config", str(busybox_product)).code == 0
    return busybox_product


def retune(profiles: Path, cli) -> None:
    tune = profiles.parent / "images/tune/tp1/cache-1.json"
    tune.write_text(tune.read_text().replace("{", '{"retuned": true, ', 1))
    assert cli("lock", "--config", str(profiles)).code == 0


def test_a_large_file_is_a_frame_of_its_own_indexed_at_the_end_which_any_zstd_passes_over(product, tmp_path):
    path, note = kit(product, tmp_path / "a")
    assert note == ""  # nothing to copy from: compressed
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        index = read_index(fd)
    finally:
        os.close(fd)
    assert not isinstance(index, str), index
    assert index.compressor == COMPRESSOR
    (frame,) = index.frames  # the tune caches and scripts are small: in the frames between
    assert (frame.size, frame.sha256) == (len(WEIGHTS), hashlib.sha256(WEIGHTS).hexdigest()) and frame.size >= FRAME_MIN
    alone = data[frame.offset:frame.offset + frame.length]
    assert hashlib.sha256(alone).hexdigest() == frame.zsha256
    assert zstandard.ZstdDecompressor().decompress(alone, max_output_size=len(WEIGHTS)) == WEIGHTS
    # the zstd command reads the kit whole (the index is a skippable frame), and context.tar is the build's
    plain = subprocess.run(["zstd", "-dc"], input=data, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        context = tar.extractfile("k/context.tar").read()
    plan = make_plan(product, cwd=product.parent)
    expected = io.BytesIO()
    write_context_tar(render(plan), expected, mtime=1700000000)
    assert context == expected.getvalue()


def test_a_later_kit_copies_the_frame_of_an_unchanged_large_file_and_is_the_kit_compressed_anew(product, tmp_path,
                                                                                                cli):
    first, _ = kit(product, tmp_path / "first")
    retune(product, cli)
    fresh, _ = kit(product, tmp_path / "fresh")
    sha = hashlib.sha256(first.read_bytes()).hexdigest()
    copied, note = kit(product, tmp_path / "copied", reuse=(first, sha))
    assert note == "1 of 1 large context files copied from the frames of k.tar.zst (not compressed again)"
    assert copied.read_bytes() == fresh.read_bytes() != first.read_bytes()

    # copied, not compressed again: a lender whose frame of the same bytes was made otherwise (level 19)
    # lends exactly those bytes; the kit unpacks to the same files, and its index records that frame
    other = zstandard.ZstdCompressor(level=19, write_checksum=True).compress(WEIGHTS)
    lender = other + index_frame({"compressor": COMPRESSOR, "frames": [
        {"offset": 0, "length": len(other), "size": len(WEIGHTS), "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
         "zsha256": hashlib.sha256(other).hexdigest()}]})
    (tmp_path / "lender.zst").write_bytes(lender)
    spliced, note = kit(product, tmp_path / "spliced",
                        reuse=(tmp_path / "lender.zst", hashlib.sha256(lender).hexdigest()))
    assert note.startswith("1 of 1 large context files copied")
    data = spliced.read_bytes()
    assert other in data and data != fresh.read_bytes()
    assert unpacked(data) == unpacked(fresh.read_bytes())
    fd = os.open(spliced, os.O_RDONLY)
    try:
        assert read_index(fd).frames[0].zsha256 == hashlib.sha256(other).hexdigest()
    finally:
        os.close(fd)


@pytest.mark.parametrize("case, said", [
    ("another sha256", "its sha256 is not the one its release records"),
    ("no index", "it ends without a frame index (made before kits had one)"),
    ("index not valid", "its frame index is not valid (frames: "),
    ("index past the frames", "its frame index names bytes past the frames"),
    ("another compressor", "its frames were made by zstandard 0.1, not"),
    ("a link", "cannot open it"),
    ("another size", "it is 1 bytes, not the"),
    ("a frame changed after the check", "0 of 1 large context files copied"),
])
def test_an_earlier_kit_that_does_not_check_out_lends_nothing_and_the_kit_is_the_same(product, tmp_path, cli, case,
                                                                                      said):
    first, _ = kit(product, tmp_path / "first")
    retune(product, cli)
    fresh, _ = kit(product, tmp_path / "fresh")
    data = bytearray(first.read_bytes())
    fd = os.open(first, os.O_RDONLY)
    index = read_index(fd)
    os.close(fd)
    frames = [f.model_dump() for f in index.frames]
    tail = frames_end(bytes(data))
    lender = tmp_path / "lender"
    if case == "no index":
        data = data[:tail]
    elif case == "index not valid":
        data = data[:tail] + index_frame({"compressor": COMPRESSOR, "frames": "all"})
    elif case == "index past the frames":
        frames[0]["length"] = tail
        data = data[:tail] + index_frame({"compressor": COMPRESSOR, "frames": frames})
    elif case == "another compressor":
        data = data[:tail] + index_frame({"compressor": "zstandard 0.1", "frames": frames})
    elif case == "a frame changed after the check":  # (the index's own record of the frame's bytes disagrees)
        frames[0]["zsha256"] = "0" * 64
        data = data[:tail] + index_frame({"compressor": COMPRESSOR, "frames": frames})
    lender.write_bytes(bytes(data))
    sha = hashlib.sha256(bytes(data)).hexdigest()
    if case == "another sha256":
        sha = "0" * 64
    if case == "another size":
        lender.write_bytes(b"x")
    if case == "a link":
        lender.unlink()
        lender.symlink_to(first)
    copied, note = kit(product, tmp_path / "copied", reuse=(lender, sha, len(data)))
    assert said in note, note
    assert copied.read_bytes() == fresh.read_bytes()
    assert sorted(p.name for p in (tmp_path / "copied").iterdir()) == ["k.tar.zst"]


@pytest.mark.parametrize("lent", ["as many zero bytes", "more bytes than the file", "a skippable frame after it",
                                  "a skippable frame before it"])
def test_a_lent_frame_whose_bytes_are_not_the_file_s_is_compressed_anew_not_copied(product, tmp_path, lent):
    # found by probing: a lender's index named the file's sha256 over a frame of as many zero bytes (its zsha256
    # right): the frame was copied, and the kit's context.tar was another than its ledger says (its own verify.sh
    # failed); only the compressed bytes were checked, against the lender's own index
    fresh, _ = kit(product, tmp_path / "fresh")
    # found by probing too: a skippable frame of anyone's bytes in the range the index names, which decoders pass
    # over (the range decodes to the file), was copied into the kit
    content = {"as many zero bytes": bytes(len(WEIGHTS)), "more bytes than the file": WEIGHTS + b"x" * (1 << 20)}.get(
        lent, WEIGHTS)
    other = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(content)
    payload = skippable(1024)[:8] + b"ATTACKER PAYLOAD".ljust(1016, b"!")
    other = {"a skippable frame after it": other + payload, "a skippable frame before it": payload + other}.get(
        lent, other)
    lender = other + index_frame({"compressor": COMPRESSOR, "frames": [
        {"offset": 0, "length": len(other), "size": len(WEIGHTS), "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
         "zsha256": hashlib.sha256(other).hexdigest()}]})
    (tmp_path / "lender.zst").write_bytes(lender)
    made, note = kit(product, tmp_path / "made", reuse=(tmp_path / "lender.zst", hashlib.sha256(lender).hexdigest()))
    assert note.startswith("0 of 1 large context files copied"), note
    assert made.read_bytes() == fresh.read_bytes()


def test_a_copied_frame_this_user_s_record_names_is_not_decoded_and_one_it_does_not_is(product, tmp_path, cli):
    """A kit on an earlier one copies a large file's frame; when this user's signed record of the frames earlier
    kits made names that frame's compressed bytes for the file's bytes, the frame is not decoded again (1.5
    CPU-seconds for a 0.43 GB library, beside the export): the kit is the same. A lender whose frame the record
    does not name (a forged one: as many zero bytes under the file's sha256) is still decoded, and refused."""
    from unibake.framememo import known_kit_frames, remember_kit_frames

    made: list = []
    first, _ = kit(product, tmp_path / "first", made=made)
    (frame,) = made
    assert frame[0] == hashlib.sha256(WEIGHTS).hexdigest() and frame[3] == len(WEIGHTS)
    memo, key = tmp_path / "memo", b"k" * 32
    assert remember_kit_frames(memo, key, made) == 1 and remember_kit_frames(memo, key, made) == 0
    vouched = known_kit_frames(memo, key)
    assert vouched == {frame[0]: frame[1:]}
    assert known_kit_frames(memo, b"x" * 32) == {}  # another user's key (a record a checkout brought): none
    retune(product, cli)
    fresh, _ = kit(product, tmp_path / "fresh")
    sha = hashlib.sha256(first.read_bytes()).hexdigest()
    copied, note = kit(product, tmp_path / "copied", reuse=(first, sha), vouched=vouched)
    assert note == ("1 of 1 large context files copied from the frames of k.tar.zst (not compressed again; 1 of them "
                    "not decoded either: their compressed bytes are the ones this user's record of earlier kits names)")
    assert copied.read_bytes() == fresh.read_bytes()

    forged = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(bytes(len(WEIGHTS)))
    lender = forged + index_frame({"compressor": COMPRESSOR, "frames": [
        {"offset": 0, "length": len(forged), "size": len(WEIGHTS), "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
         "zsha256": hashlib.sha256(forged).hexdigest()}]})
    (tmp_path / "lender.zst").write_bytes(lender)
    refused, note = kit(product, tmp_path / "refused", reuse=(tmp_path / "lender.zst", hashlib.sha256(lender).hexdigest()),
                        vouched=vouched)
    assert note.startswith("0 of 1 large context files copied"), note
    assert refused.read_bytes() == fresh.read_bytes()


def test_a_kit_without_a_large_file_is_one_frame_and_its_index(busybox_product, tmp_path):
    path, _ = kit(busybox_product, tmp_path / "small")
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        index = read_index(fd)
    finally:
        os.close(fd)
    assert index.frames == ()
    body = data[:frames_end(data)]
    # one zstd frame: read whole by a reader that stops after the first frame
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)).read() == \
        zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True).read()


def tarfile_copy(data: bytes) -> bytes:
    """The same members written again by tarfile itself (PAX, as unibake's tar claims to write)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w",
                                                                     format=tarfile.PAX_FORMAT) as dst:
        for member in src.getmembers():
            info = tarfile.TarInfo(member.name)
            info.mode, info.mtime, info.size, info.type = member.mode, member.mtime, member.size, member.type
            dst.addfile(info, src.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def test_the_context_tar_and_the_kit_are_the_bytes_tarfile_writes_long_and_non_ascii_names_included(tmp_path,
                                                                                                    product):
    from dataclasses import replace

    from unibake.render import ContextFile

    plan = make_plan(product, cwd=product.parent)
    context = render(plan)
    odd = (ContextFile(name="x/" + "long-name-" * 15 + ".json", mode=0o644, sha256="0" * 64, data=b"{}"),
           ContextFile(name="x/caché/ünïcode.bin", mode=0o755, sha256="0" * 64, data=bytes(range(256)) * 3),
           ContextFile(name="x/empty", mode=0o644, sha256="0" * 64, data=b""))
    context = replace(context, files=context.files + odd)
    written = io.BytesIO()
    write_context_tar(context, written, mtime=1700000000)
    data = written.getvalue()
    assert data == tarfile_copy(data) and len(data) % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.extractfile("x/" + "long-name-" * 15 + ".json").read() == b"{}"
        assert tar.extractfile("x/caché/ünïcode.bin").read() == bytes(range(256)) * 3
        assert tar.extractfile("ctx/engine/weights.bin").read() == WEIGHTS
    path, _ = kit(product, tmp_path / "k")
    whole = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes()), read_across_frames=True).read()
    assert whole == tarfile_copy(whole)


def test_a_context_file_changed_since_the_plan_stops_the_kit_and_leaves_nothing(product, tmp_path):
    plan = make_plan(product, cwd=product.parent)
    context = render(plan)
    (product.parent / "images/engine/weights.bin").write_bytes(WEIGHTS[:-1] + b"!")
    out = tmp_path / "k"
    out.mkdir()
    draft = KitDraft(out, "k.tar.zst", plan=plan, context=context, release="0.1.0", epoch=1700000000)
    with pytest.raises(InputError, match=r"images/engine/weights\.bin: changed while the build context was written"):
        draft.begin()
    draft.abandon()
    assert list(out.iterdir()) == []
