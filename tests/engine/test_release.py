"""The whole pipeline on a busybox-sized product: a release folder a downloader can trust."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unibake.builder import cache_ref
from unibake.scratch import SEED_PREFIX, SEEDED_MARK, _try_lock, private_base

from ..conftest import REPO


def release(cli, profiles: Path, version: str, out: Path, *extra: str):
    return cli("--config", str(profiles), "--version", version, "--out", str(out), *extra)


def scratch_leftovers() -> list[str]:
    return [p for p in os.listdir(private_base()) if p.startswith(("ub-scratch-", "ubx-"))]


def test_a_release_folder_that_verifies_and_a_flipped_byte_that_does_not(cli, engine, busybox_product, version,
                                                                         images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    seeded_before = _seeded_with(private_base(), engine.inspect_image("localhost/unibake-busybox:1").id)
    result = release(cli, busybox_product, version, out)
    assert result.code == 0, result.err
    folder = out / version
    archive = folder / f"unibake-test-{version}.tar.zst"
    assert sorted(os.listdir(folder)) == sorted(["IMAGE_ID", "README-DIST.md", "RELEASE_NOTES.md", "SHA256SUMS", "VALIDATION.json",
                                                 "manifest.json", "run.sh", archive.name, "sbom.cdx.json",
                                                 "provenance.intoto.json", f"unibake-test-{version}-kit.tar.zst"])
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True).returncode == 0
    assert subprocess.run(["zstd", "-q", "-t", str(archive)]).returncode == 0

    manifest = json.loads((folder / "manifest.json").read_text())
    validation = json.loads((folder / "VALIDATION.json").read_text())
    built = engine.inspect_image(f"unibake-test:{version}")
    assert manifest["image_id"] == built.id == validation["round_trip"]["image_id"]
    assert manifest["diff_ids"] == list(built.diff_ids) == validation["round_trip"]["diff_ids"]
    assert validation["round_trip"]["engine"].startswith(f"unix://{private_base()}/ubx-")  # the scratch engine
    assert [(g["profile"], g["passed"]) for g in validation["smoke"]] == [("tp1", True), ("tp2", True)]
    chat = [s for g in validation["smoke"] for s in g["steps"] if s["name"] == "chat"]
    assert [c["detail"] for c in chat] == ["UNIFIED_TP1_OK", "UNIFIED_TP2_OK"]
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert built.id in notes and f"zstd -dc {archive.name} | docker load" in notes
    assert "| `tp2` |" in notes and "passed" in notes
    # the default one-pass export loads the stream it reads; the notes say so, and what the sequential path does
    assert validation["round_trip"]["method"] == "stream" and "Round trip (one pass)" in notes
    # ... into the verify engine kept holding only the base image, when an earlier release seeded it (only the
    # layers above it were loaded), else empty (the whole image loaded; the engine keeps its base image from it:
    # test_a_first_release_on_a_base_seeds_the_verify_engine_from_its_round_trip)
    base_id = engine.inspect_image("localhost/unibake-busybox:1").id
    if seeded_before:
        assert validation["round_trip"]["held_before"] == [base_id]
        assert f"held only the base image `{base_id}`" in notes
    else:
        assert validation["round_trip"]["held_before"] == [] and "held only" not in notes
    assert "release:" in result.err and "SHA256:" in result.err  # the closing summary
    assert scratch_leftovers() == []

    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    bad = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True, text=True)
    assert bad.returncode != 0 and f"{archive.name}: FAILED" in bad.stdout


def _seeded_with(scratch: Path, base_id: str) -> bool:
    """Whether the verify engine of ``base_id`` under ``scratch`` is seeded (its mark names the base image)."""
    mark = scratch / f"{SEED_PREFIX}{base_id.removeprefix('sha256:')[:16]}" / SEEDED_MARK
    return mark.is_file() and mark.read_text().strip() == base_id


def test_a_first_release_on_a_base_seeds_the_verify_engine_from_its_round_trip(cli, engine, busybox_product,
                                                                              version, images, tmp_path):
    """The first release on a base loads its whole image into the verify engine, empty (as --no-seed; the base
    image is not loaded first on its own), and the engine keeps the base image from it: the next release loads only
    the layers above the base image."""
    images(f"unibake-test:{version}")
    out, scratch = tmp_path / "release", tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    base_id = engine.inspect_image("localhost/unibake-busybox:1").id
    first = release(cli, busybox_product, version, out, "--no-smoke", "--scratch-dir", str(scratch))
    assert first.code == 0, first.err
    assert "starts empty: it keeps the base image" in first.err and "seeding the verify engine" not in first.err
    assert f"loading into the empty verify engine {scratch}/{SEED_PREFIX}" in first.err
    validation = json.loads((out / version / "VALIDATION.json").read_text())
    assert validation["round_trip"]["held_before"] == [] and validation["round_trip"]["image_id"]
    assert _seeded_with(scratch, base_id)

    again = release(cli, busybox_product, version, out, "--no-smoke", "--scratch-dir", str(scratch), "--force")
    assert again.code == 0, again.err
    assert "starts empty" not in again.err and "seeding the verify engine" not in again.err
    assert json.loads((out / version / "VALIDATION.json").read_text())["round_trip"]["held_before"] == [base_id]
    assert f"held only the base image `{base_id}`" in (out / version / "RELEASE_NOTES.md").read_text()


def test_the_round_trip_starts_empty_with_no_seed_or_while_another_run_uses_the_seed(cli, engine, busybox_product,
                                                                                      version, images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    base_id = engine.inspect_image("localhost/unibake-busybox:1").id
    empty = release(cli, busybox_product, version, out, "--no-seed", "--no-smoke")
    assert empty.code == 0, empty.err
    validation = json.loads((out / version / "VALIDATION.json").read_text())
    assert validation["round_trip"]["held_before"] == [] and validation["round_trip"]["image_id"]
    assert "held only" not in (out / version / "RELEASE_NOTES.md").read_text()

    lock = _try_lock(private_base() / f"{SEED_PREFIX}{base_id.removeprefix('sha256:')[:16]}")  # another run's
    try:
        busy = release(cli, busybox_product, version, out, "--no-smoke", "--force")
    finally:
        os.close(lock)
    assert busy.code == 0, busy.err
    assert "is in use by another run: an empty scratch engine instead" in busy.err
    assert json.loads((out / version / "VALIDATION.json").read_text())["round_trip"]["held_before"] == []
    assert scratch_leftovers() == []

    seed = private_base() / f"{SEED_PREFIX}{base_id.removeprefix('sha256:')[:16]}"
    made = not seed.exists()
    seed.mkdir(exist_ok=True)
    os.chmod(seed, 0o755)  # open to others: not a folder this run may trust
    try:
        refused = release(cli, busybox_product, version, out, "--no-smoke", "--force")
    finally:
        os.chmod(seed, 0o700)
        if made:
            seed.rmdir()
    assert refused.code == 0, refused.err
    assert "is not a private folder of this user" in refused.err and "an empty scratch engine instead" in refused.err
    assert json.loads((out / version / "VALIDATION.json").read_text())["round_trip"]["held_before"] == []


def test_a_profile_whose_engine_cannot_start_fails_the_release(cli, engine, busybox_product, version, images,
                                                               tmp_path):
    images(f"unibake-test:{version}")
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text() + "args: [--explode]\n")
    out = tmp_path / "release"
    result = release(cli, busybox_product, version, out)
    assert result.code == 3
    assert result.error_lines[-1].startswith("error: smoke gate failed for profile tp2 at step ")
    assert "unknown argument --explode" in result.error_lines[-1]
    assert not (out / version).exists()
    # the release's tag names no image that was never released: what it named is kept as build cache
    assert engine.inspect_image(f"unibake-test:{version}") is None
    assert engine.inspect_image(cache_ref("unibake-test", "all", "failed")) is not None
    assert [p for p in os.listdir(out) if not p.endswith(".lock")] == []
    assert scratch_leftovers() == []


def test_an_image_built_elsewhere_is_released_without_smoke_gates(cli, engine, tmp_path):
    out = tmp_path / "release"
    result = cli("archive", "localhost/unibake-busybox:1", "--out", str(out), "--tag", "bb-1")
    assert result.code == 0, result.err
    folder = out / "bb-1"
    assert (folder / "unibake-busybox-bb-1.tar.zst").exists()
    validation = json.loads((folder / "VALIDATION.json").read_text())
    assert validation["round_trip"]["image_id"] == engine.inspect_image("localhost/unibake-busybox:1").id
    assert validation["smoke"] == [] and "no unibake profiles" in validation["smoke_skipped"]
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True).returncode == 0


def test_without_the_round_trip_the_notes_say_so(cli, busybox_product, version, images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    assert release(cli, busybox_product, version, out, "--no-roundtrip").code == 0
    notes = (out / version / "RELEASE_NOTES.md").read_text()
    assert "Round trip: **not run** (skipped with --no-roundtrip)" in notes
    assert json.loads((out / version / "VALIDATION.json").read_text())["round_trip"] is None


def test_an_existing_release_needs_force_and_is_refused_before_building(cli, engine, busybox_product, version,
                                                                         images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    assert release(cli, busybox_product, version, out, "--no-roundtrip").code == 0
    engine.remove_image(f"unibake-test:{version}")
    again = release(cli, busybox_product, version, out, "--no-roundtrip")
    assert again.code == 2 and f"unibake-test:{version} is released ({out / version}, image sha256:" \
        in again.error_lines[-1] and "a released tag never moves" in again.error_lines[-1]
    assert engine.inspect_image(f"unibake-test:{version}") is None  # refused before the build
    build_only = cli("--config", str(busybox_product), "--version", version, "--out", str(out), "--stage", "build")
    assert build_only.code == 2 and "a released tag never moves" in build_only.error_lines[-1]
    assert engine.inspect_image(f"unibake-test:{version}") is None  # --stage build is refused alike
    assert release(cli, busybox_product, version, out, "--no-roundtrip", "--force").code == 0


def test_a_run_killed_mid_archive_leaves_no_file_under_a_final_name(big_image, tmp_path):
    out = tmp_path / "release"
    cmd = [sys.executable, str(REPO / "build.py"), "archive", big_image, "--out", str(out), "--no-roundtrip"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "CI": "1"})
    temp = out / ".1.partial" / ".unibake-test-big-1.tar.zst.tmp"
    deadline = time.monotonic() + 60
    while not (temp.exists() and temp.stat().st_size > 1 << 20):
        assert proc.poll() is None and time.monotonic() < deadline, "the archive stage never started"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "1").exists()
    leftovers = os.listdir(out / ".1.partial")
    assert leftovers and all(name.startswith(".") and name.endswith(".tmp") for name in leftovers)

    rerun = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CI": "1"})
    assert rerun.returncode == 0, rerun.stderr
    assert not (out / ".1.partial").exists()
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out / "1", capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs: too small for the busybox product's archive (about 1 MiB)."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_file(cli, busybox_product, version, images, small_disk):
    images(f"unibake-test:{version}")
    out = small_disk / "release"
    result = release(cli, busybox_product, version, out, "--no-roundtrip")
    assert result.code == 1
    line = result.error_lines[-1]
    assert line.startswith(f"error: no space left in {out}/.{version}.partial while writing the archive")
    assert f"the release folder {out} has " in line and "bytes uncompressed" in line
    assert [p for p in os.listdir(out) if not p.endswith(".lock")] == []
