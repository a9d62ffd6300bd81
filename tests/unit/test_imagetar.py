"""The one tar walker and the in-place header rewrite, byte by byte: PAX records, long names,
base-256 numbers, padding and the end-of-archive blocks, in pieces of any size."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile

import pytest

from unibake.errors import ArchiveError, LayerFormatError
from unibake.imagetar import (BLOCK, LayerLister, LayerRewriter, TarWalker, pax_records, rewrite_header,
                              rewrite_pax_times, tar_header, without_members)

from ..savefixtures import tar_of

EPOCH = 1700000000


def make_tar(entries, fmt=tarfile.PAX_FORMAT) -> bytes:
    return tar_of(entries, fmt)


def pieces(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


class Collect:
    def __init__(self):
        self.entries, self.content, self.raw_bytes = [], {}, 0

    def begin(self, entry):
        self.entries.append(entry)
        self.content[entry.name] = bytearray()

    def data(self, piece):
        self.content[self.entries[-1].name] += piece

    def end(self):
        pass

    def raw(self, piece):
        self.raw_bytes += len(piece)


@pytest.mark.parametrize("size", [1, 7, 512, 4096, 1 << 20])
def test_the_walker_sees_every_entry_whatever_the_piece_size(size):
    long_name = "opt/unibake/" + "deep/" * 30 + "file.json"  # over 100 characters: a PAX path record
    data = make_tar([("opt", None, None), ("opt/unibake/a.json", b'{"a": 1}\n' * 100, None),
                     (long_name, b"x" * 1000, None), ("opt/unibake/empty", b"", None)])
    seen = Collect()
    walker = TarWalker(seen)
    for piece in pieces(data, size):
        walker.feed(piece)
    walker.close()
    assert [e.name for e in seen.entries] == ["opt", "opt/unibake/a.json", long_name, "opt/unibake/empty"]
    assert bytes(seen.content[long_name]) == b"x" * 1000
    assert seen.entries[2].extended and seen.entries[2].extended[0][0][156:157] == b"x"
    total = sum(len(e.header) + sum(len(h) + len(d) for h, d in e.extended) for e in seen.entries)
    assert total + sum(len(c) for c in seen.content.values()) + seen.raw_bytes == len(data)


def test_gnu_long_names_and_base_256_numbers_are_read():
    long_name = "opt/unibake/" + "x" * 150
    data = make_tar([(long_name, b"data", {"uid": 1 << 30, "gid": 1 << 30})], fmt=tarfile.GNU_FORMAT)
    seen = Collect()
    walker = TarWalker(seen)
    walker.feed(data)
    walker.close()
    entry = seen.entries[0]
    assert entry.name == long_name and entry.uid == 1 << 30 and entry.gid == 1 << 30
    assert entry.header[108] & 0x80  # the uid field really is base-256
    assert entry.extended[0][0][156:157] == tarfile.GNUTYPE_LONGNAME


def test_a_pax_size_that_is_not_a_number_is_refused():
    header = tarfile.TarInfo("x")
    header.type = tarfile.XHDTYPE
    record = b"12 size=1e5\n"
    header.size = len(record)
    data = header.tobuf(format=tarfile.USTAR_FORMAT) + record + bytes(-len(record) % BLOCK)
    data += tar_header("x", 0) + bytes(2 * BLOCK)
    with pytest.raises(ArchiveError, match="PAX size '1e5' that is not a whole number"):
        walker = TarWalker(Collect())
        walker.feed(data)


@pytest.mark.parametrize("count, size, refused", [(3, 100, False), (17, 100, True), (2, 9 << 20, True)])
def test_extended_headers_stacked_before_one_member_are_refused_past_a_few_or_16_mib(count, size, refused):
    # found by review: each was held until the member it describes, without a bound (64 of 16 MiB, 37 kB as zstd,
    # took a GiB of memory in build.py verify)
    def extended(n: int) -> bytes:
        body = b" comment=" + b"a" * size + b"\n"  # a PAX record: its own length (digits included) first
        length = len(body) + 1
        while len(str(length)) + len(body) != length:
            length = len(str(length)) + len(body)
        record = b"%d" % length + body
        header = tarfile.TarInfo(f"pax{n}")
        header.type, header.size = tarfile.XHDTYPE, len(record)
        return header.tobuf(format=tarfile.USTAR_FORMAT) + record + bytes(-len(record) % BLOCK)

    data = b"".join(extended(n) for n in range(count)) + tar_header("x", 0) + bytes(2 * BLOCK)
    walker = TarWalker(Collect())
    if refused:
        with pytest.raises(ArchiveError, match=r"more than 16 extended headers, or more than 16 MiB of them, before "
                                               "one member"):
            walker.feed(data)
    else:
        walker.feed(data)
        walker.close()

@pytest.mark.parametrize("field", [b"-0000000012\0", b"\xff" + b"\xff" * 10 + b"\xf6"])
def test_a_negative_member_size_is_refused_before_the_walk_goes_backwards(field):
    """tarfile reads "-12" in octal, and base-256 starting with 0xff, as a negative size; the walker
    once took it and stepped back over bytes it had read."""
    header = bytearray(tar_header("x", 0))
    header[124:136] = field
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    seen = Collect()
    with pytest.raises(ArchiveError, match=r"negative size \(-1[02]\)"):
        TarWalker(seen).feed(bytes(header) + b"x" * BLOCK + bytes(2 * BLOCK))
    assert seen.entries == []


@pytest.mark.parametrize("records", [b"5 a=b\n", b"x a=b\n", b"99 a=b\n", b"6 ab\n\n", b"1000000000000000000000000 a"])
def test_malformed_pax_records_are_refused(records):
    with pytest.raises(ArchiveError, match="malformed PAX header"):
        pax_records(records)


def test_pax_records_are_parsed():
    assert pax_records(b"12 path=abc\n19 mtime=1.5000001\n") == {"path": "abc", "mtime": "1.5000001"}


def test_the_header_rewrite_sets_the_time_empties_owner_names_and_keeps_a_valid_checksum():
    block = make_tar([("opt/unibake/a", b"abc", None)], fmt=tarfile.USTAR_FORMAT)[:BLOCK]
    rewritten = rewrite_header(block, EPOCH)
    assert len(rewritten) == BLOCK
    info = tarfile.TarInfo.frombuf(rewritten, "utf-8", "strict")  # raises when the checksum is wrong
    assert (info.mtime, info.uname, info.gname, info.uid, info.gid, info.name) == \
        (EPOCH, "", "", 1000, 1000, "opt/unibake/a")
    assert rewritten[:136] == block[:136] and rewritten[329:] == block[329:]


def test_pax_times_are_rewritten_in_place_with_leading_zeros():
    data = b"30 mtime=1234567890.123456789\n20 atime=1234567890\n"
    out, size = rewrite_pax_times(data + bytes(512 - len(data)), len(data), EPOCH)
    assert len(out) == 512 and size == len(data)
    assert pax_records(out[:size]) == {"mtime": str(EPOCH).rjust(20, "0"), "atime": str(EPOCH)}


def test_a_short_pax_time_grows_within_its_block():
    data = b"12 mtime=12\n13 path=abcd\n"
    out, size = rewrite_pax_times(data + bytes(512 - len(data)), len(data), EPOCH)
    assert len(out) == 512 and size == len(data) + 8
    assert pax_records(out[:size]) == {"mtime": str(EPOCH), "path": "abcd"}


def test_pax_times_that_cannot_grow_within_their_blocks_are_refused():
    data = b"12 mtime=12\n" + b"".join(b"%d k%03d=%s\n" % (41, i, b"v" * 32) for i in range(12)) + b"8 a=bcd\n"
    assert len(data) == BLOCK  # the records fill their block: the longer time cannot fit
    with pytest.raises(LayerFormatError, match="without growing the layer"):
        rewrite_pax_times(data, len(data), EPOCH)


def rewrite(data: bytes, size: int = 4096, owned: str = "opt/unibake") -> tuple[bytes, bool]:
    out = []
    rewriter = LayerRewriter(epoch=EPOCH, owned=owned, emit=lambda piece: out.append(bytes(piece)))
    for piece in pieces(data, size):
        rewriter.write(memoryview(piece))
    rewriter.close()
    return b"".join(out), rewriter.ours


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT], ids=["pax", "gnu", "ustar"])
@pytest.mark.parametrize("size", [100, 512, 65536])
def test_a_layer_of_ours_keeps_its_length_and_content_with_every_time_set(fmt, size):
    long_name = "opt/unibake/" + "n" * 40 + "/" + "m" * 60  # a long name for every format
    entries = [("opt", None, None), ("opt/unibake", None, None), ("opt/unibake/engine.py", b"print(1)\n" * 300, None),
               ("opt/unibake/w.bin", bytes(range(256)) * 40, {"mtime": 1.5} if fmt == tarfile.PAX_FORMAT else None)]
    if fmt != tarfile.USTAR_FORMAT:
        entries.append((long_name, b"long", None))
    data = make_tar(entries, fmt=fmt)
    out, ours = rewrite(data, size)
    assert ours and len(out) == len(data)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        members = tar.getmembers()
        assert {(m.mtime, m.uname, m.gname) for m in members} == {(EPOCH, "", "")}
        assert tar.extractfile("opt/unibake/engine.py").read() == b"print(1)\n" * 300
        assert [m.name for m in members] == [e[0] for e in entries]


def test_a_layer_that_is_not_ours_gives_nothing():
    data = make_tar([("opt", None, None), ("usr/lib/libc.so", b"\x7fELF", None)])
    out, ours = rewrite(data)
    assert out == b"" and ours is False


def test_an_empty_layer_is_not_ours():
    out, ours = rewrite(bytes(2 * BLOCK))
    assert out == b"" and ours is False


def test_a_damaged_header_in_a_layer_of_ours_is_a_layer_error():
    data = bytearray(make_tar([("opt/unibake/a", b"abc", None), ("opt/unibake/b", b"def", None)],
                              fmt=tarfile.USTAR_FORMAT))
    data[2 * BLOCK + 10] ^= 0xFF  # the second header's name: its checksum no longer matches
    with pytest.raises(LayerFormatError, match="damaged member header"):
        rewrite(bytes(data))


def test_the_lister_digests_each_entry_of_the_wanted_layer_only():
    data = make_tar([("opt/unibake/a", b"abc", None), ("opt/unibake/d", None, None)])
    wanted = LayerLister(f"sha256:{hashlib.sha256(data).hexdigest()}")
    other = LayerLister("sha256:" + "0" * 64)
    for lister in (wanted, other):
        lister.write(memoryview(data))
    assert other.close() is None
    listing = wanted.close()
    assert listing["opt/unibake/a"][6] == hashlib.sha256(b"abc").hexdigest()
    assert listing["opt/unibake/d"][0] == "5" and listing["opt/unibake/d"][6] == ""


def test_tar_header_is_our_one_fixed_form():
    header = tar_header("blobs/sha256/" + "a" * 64, 123)
    info = tarfile.TarInfo.frombuf(header[:BLOCK], "utf-8", "strict")
    assert (info.size, info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (123, 0, 0, 0, "", "", 0o644)
    assert len(tar_header("x" * 200, 0)) == 3 * BLOCK  # a long name goes in a PAX record first


@pytest.mark.parametrize("tar", [["tar"], ["busybox", "tar"]], ids=["tar", "busybox tar"])
def test_a_member_of_8_gib_or_more_is_one_plain_header_every_tar_lists_as_it_is(tmp_path, tar):
    """A big layer's size is a base-256 number in the header itself. As a PAX record it made every
    release with a layer of 8 GiB or more fail verify-release.sh (whose tar lists it as size 0 under
    busybox, and whose byte count refuses any header the listing does not show)."""
    size = 9 << 30
    big, small = tar_header("blobs/sha256/" + "a" * 64, size), tar_header("blobs/sha256/" + "b" * 64, 5)
    assert len(big) == BLOCK
    assert tarfile.TarInfo.frombuf(big, "utf-8", "strict").size == size  # the checksum holds, as Python reads it
    archive = tmp_path / "big.tar"
    with open(archive, "wb") as out:  # the 9 GiB are a hole: the tar seeks over them
        out.write(big)
        out.seek(BLOCK + size)
        out.write(small + b"hello" + bytes(BLOCK - 5) + bytes(2 * BLOCK))
    listing = subprocess.run([*tar, "-tvf", str(archive)], capture_output=True, text=True, check=True).stdout
    sizes = [int(line.split()[2]) for line in listing.splitlines()]
    assert sizes == [size, 5]
    # verify-release.sh's rule: the tar is exactly as long as its listing's entries and end
    assert archive.stat().st_size == sum(BLOCK + -(-n // BLOCK) * BLOCK for n in sizes) + 2 * BLOCK


def _tar(members: list[tuple[str, bytes]], fmt=tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _pieces(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("piece", [1, 7, 512, 513, 4096, 1 << 20])
def test_without_members_leaves_out_the_named_files_whatever_the_chunking(piece):
    members = [("blobs/sha256/aa", b"A" * 1500), ("blobs/sha256/bb", b"B" * 10), ("manifest.json", b"[]"),
               ("blobs/sha256/cc", b""), ("index.json", b"{}" * 300)]
    data = _tar(members)
    out = b"".join(without_members(_pieces(data, piece), frozenset({"blobs/sha256/aa", "blobs/sha256/cc"})))
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert got == {"blobs/sha256/bb": b"B" * 10, "manifest.json": b"[]", "index.json": b"{}" * 300}


def test_without_members_passes_everything_from_the_first_header_it_does_not_read():
    long_name = "blobs/" + "x" * 120  # a PAX header: from there on, nothing is left out
    data = _tar([("keep", b"k"), (long_name, b"L"), ("drop", b"d")], fmt=tarfile.PAX_FORMAT)
    out = b"".join(without_members(_pieces(data, 100), frozenset({"drop"})))
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        assert [m.name for m in tar.getmembers()] == ["keep", long_name, "drop"]
    garbage = b"\x01" * 2048
    assert b"".join(without_members([garbage], frozenset({"x"}))) == garbage


def test_a_gzip_layer_whose_first_member_is_bigger_than_a_piece_is_read_to_its_end_not_for_ever():
    # found by probing: a layer stored as two gzip members (which the engine loads), the first more than a
    # piece (1 MiB) decompressed and bytes after it in the same write: zlib keeps those bytes in
    # unconsumed_tail once the member ends, and the loop that drains it never ended (memory growing)
    import gzip
    import threading

    from unibake.imagetar import CHUNK, _Gunzip

    raw = bytes(range(256)) * (8 << 10)  # 2 MiB
    stored = gzip.compress(raw[:CHUNK + (CHUNK >> 1)], mtime=0) + gzip.compress(raw[CHUNK + (CHUNK >> 1):], mtime=0)
    for after in (b"", bytes(512)):  # zero bytes after the last member, which the engine takes too
        sink, done = hashlib.sha256(), []
        reader = _Gunzip(sink)
        worker = threading.Thread(target=lambda: done.append(reader.write(stored + after)), daemon=True)
        worker.start()
        worker.join(60)
        assert done, "the first member's end was never found"
        assert reader.whole() and sink.hexdigest() == hashlib.sha256(raw).hexdigest()
