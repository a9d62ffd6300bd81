"""`build.py verify` on release folders made in the test: what passes, and how each fault is named."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import zstandard

from ..savefixtures import docker_layout, layer_tar
from .test_publish import make_release


@pytest.fixture
def folder(tmp_path):
    return make_release(tmp_path / "release", split=None)[0]


def rewrite_sums(folder, name):
    """What a tamperer does: make SHA256SUMS agree with a changed file."""
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    lines = [f"{digest}  {name}" if line.endswith(f"  {name}") else line
             for line in (folder / "SHA256SUMS").read_text().splitlines()]
    (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def test_a_good_release_verifies(cli, folder):
    result = cli("verify", str(folder))
    assert result.code == 0, result.err
    for check in ("sha256", "size", "zstd", "structure"):
        assert f"{check} " in result.err


def test_a_flipped_byte_names_the_file_and_the_check(cli, folder):
    archive = folder / "demo-llm-1.3.1.tar.zst"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 1
    archive.write_bytes(bytes(data))
    result = cli("verify", str(folder))
    assert result.code == 3
    assert result.error_lines == ["error: demo-llm-1.3.1.tar.zst: sha256 check failed: differs from SHA256SUMS "
                                  "(and 2 more failed checks)"]


def test_a_truncated_download_is_reported_as_truncated(cli, folder):
    archive = folder / "demo-llm-1.3.1.tar.zst"
    size = archive.stat().st_size
    archive.write_bytes(archive.read_bytes()[: size - 100])
    result = cli("verify", str(folder))
    assert result.code == 3
    assert result.error_lines[0].startswith(f"error: demo-llm-1.3.1.tar.zst: size check failed: truncated: "
                                            f"{size - 100} of {size} bytes")


def test_sums_edited_to_match_a_tampered_archive_still_fail_the_structure_check(cli, folder):
    """Another image put in the archive's place and SHA256SUMS rewritten: manifest.json still knows."""
    evil, evil_id, _ = docker_layout([layer_tar({"bin/tool": b"backdoored"})], tag="demo-llm:1.3.1")
    (folder / "demo-llm-1.3.1.tar.zst").write_bytes(zstandard.ZstdCompressor().compress(evil))
    rewrite_sums(folder, "demo-llm-1.3.1.tar.zst")
    manifest = json.loads((folder / "manifest.json").read_text())
    result = cli("verify", str(folder))
    assert result.code == 3
    structure = next(line for line in result.err.splitlines() if line.lstrip().startswith("structure"))
    assert "FAILED" in structure and f"config digest {evil_id}" in structure
    assert manifest["image_id"][:19] in structure


def test_a_folder_without_sums_is_not_a_release(cli, folder):
    (folder / "SHA256SUMS").unlink()
    result = cli("verify", str(folder))
    assert result.code == 3 and result.error_lines == [f"error: {folder}/SHA256SUMS: missing; this is not a "
                                                       "complete release folder"]


def test_a_missing_part_is_named(cli, tmp_path):
    incompressible = [layer_tar({"weights.bin": os.urandom(3 << 20)})]
    folder, _ = make_release(tmp_path / "release", split=1 << 20, layers=incompressible)
    parts = sorted(p.name for p in folder.iterdir() if ".part-" in p.name)
    assert len(parts) == 4
    (folder / parts[-1]).unlink()
    result = cli("verify", str(folder))
    assert result.code == 3
    assert f"{parts[-1]}: " in result.error_lines[0] and "missing" in result.error_lines[0]
