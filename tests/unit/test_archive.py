"""The one-pass archive writer: real zstd frames, both hashes, parts, and nothing left on failure."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from unibake.archive import read_archive, write_archive
from unibake.savestream import ArchiveError

from ..savefixtures import docker_layout, layer_tar


def chunks(data: bytes, size: int = 4096):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def big_save_stream() -> tuple[bytes, str, list[str]]:
    # Incompressible, so that the compressed stream is big enough to split.
    return docker_layout([layer_tar({"weights.bin": os.urandom(3 << 20)}), layer_tar({"a.json": b"{}"})])


def test_the_archive_is_a_real_zstd_file_with_both_hashes(tmp_path):
    data, image_id, diff_ids = docker_layout()
    archive = write_archive(chunks(data), tmp_path, "demo-1.tar.zst")
    path = tmp_path / "demo-1.tar.zst"
    assert [f.name for f in archive.files] == ["demo-1.tar.zst"]
    assert archive.compressed_sha256 == hashlib.sha256(path.read_bytes()).hexdigest() == archive.files[0].sha256
    assert archive.uncompressed_sha256 == hashlib.sha256(data).hexdigest()
    assert archive.uncompressed_bytes == len(data) and archive.compressed_bytes == path.stat().st_size
    assert archive.image.image_id == image_id and list(archive.image.diff_ids) == diff_ids
    subprocess.run(["zstd", "-q", "-t", str(path)], check=True)
    assert subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout == data
    assert sorted(os.listdir(tmp_path)) == ["demo-1.tar.zst"]


def test_long_distance_matching_stays_readable_by_the_zstd_cli(tmp_path):
    data, _, _ = docker_layout()
    write_archive(chunks(data), tmp_path, "x.tar.zst", level=5, long_distance=True)
    assert subprocess.run(["zstd", "-dc", str(tmp_path / "x.tar.zst")], capture_output=True,
                          check=True).stdout == data


def test_split_parts_concatenate_to_the_whole_stream(tmp_path):
    data, image_id, _ = big_save_stream()
    archive = write_archive(chunks(data, 1 << 16), tmp_path, "big.tar.zst", split=1 << 20)
    names = [f.name for f in archive.files]
    assert names == [f"big.tar.zst.part-{i:03d}" for i in range(len(names))] and len(names) >= 3
    assert all(f.bytes == 1 << 20 for f in archive.files[:-1]) and 0 < archive.files[-1].bytes <= 1 << 20
    whole = b"".join((tmp_path / n).read_bytes() for n in names)
    assert hashlib.sha256(whole).hexdigest() == archive.compressed_sha256
    for f in archive.files:
        assert hashlib.sha256((tmp_path / f.name).read_bytes()).hexdigest() == f.sha256
    assert b"".join(read_archive(tmp_path, names)) == data
    assert archive.image.image_id == image_id


def test_a_stream_that_fails_midway_leaves_no_file(tmp_path):
    data, _, _ = big_save_stream()

    def broken():
        yield from chunks(data[: len(data) // 2], 1 << 16)
        raise ConnectionResetError("the engine stopped mid-save")

    with pytest.raises(ConnectionResetError):
        write_archive(broken(), tmp_path, "big.tar.zst", split=1 << 20)
    assert os.listdir(tmp_path) == []


def test_a_corrupt_stream_is_refused_and_leaves_no_file(tmp_path):
    data, _, _ = docker_layout()
    corrupt = data.replace(b'{"a": 1}', b'{"a": 2}', 1)
    with pytest.raises(ArchiveError, match="diffID"):
        write_archive(chunks(corrupt), tmp_path, "x.tar.zst")
    assert os.listdir(tmp_path) == []
