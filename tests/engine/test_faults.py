"""Faults injected into real runs: interrupted (SIGINT, SIGTERM, SIGKILL) in each stage, an engine that
stops mid-save, two runs on one tag. Afterwards nothing carries a final name unless complete, no
scratch engine is left running, and a rerun succeeds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unibake.scratch import ScratchEngine

from ..conftest import REPO

SLOW_CHECK = "checks:\n  - {name: slow, run: 'sleep 4'}\n"


class Run:
    """``python build.py ARGS`` in the background, its stderr in a file."""

    def __init__(self, tmp_path: Path, *args: str):
        self.log = tmp_path / f"run-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen([sys.executable, str(REPO / "build.py"), *args], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"), env={**os.environ, "CI": "1"})

    @property
    def err(self) -> str:
        return self.log.read_text()

    def wait_for(self, predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"the run ended before {what}:\n{self.err}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.err}"
            time.sleep(0.01)

    def stop(self, sig: int, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def scratch_dirs(base: Path) -> list[Path]:
    return sorted(base.glob("ub-scratch-*"))


def running_from(folder: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def no_final_release(out: Path, tag: str) -> None:
    assert not (out / tag).exists(), "an interrupted run left a release under its final name"


@pytest.fixture
def slow_product(busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + SLOW_CHECK)
    return busybox_product


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_during_the_build(engine, slow_product, version, images, tmp_path, sig):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    args = ["--config", str(slow_product), "--version", version, "--out", str(out), "--no-roundtrip"]
    dangling = {i.id for i in engine.list_images(dangling=True)}
    run = Run(tmp_path, *args)
    run.wait_for(lambda: "RUN skip=; for p in tp1 tp2" in run.err, "the in-image checks to start")
    assert run.stop(sig) == 130
    assert run.err.strip().splitlines()[-1] == "error: interrupted"
    assert engine.inspect_image(f"unibake-test:{version}") is None
    # the steps that finished are kept as named build cache, as a failed build's are: none left dangling
    assert {i.id for i in engine.list_images(dangling=True)} <= dangling
    assert any(t.startswith("unibake-cache/unibake-test:") and t.endswith("-failed")
               for i in engine.list_images() for t in i.tags)
    assert sorted(os.listdir(out)) == [f".{version}.lock"]  # no staging folder, no release
    rerun = Run(tmp_path, *args)
    assert rerun.proc.wait(120) == 0, rerun.err


def test_killed_during_the_build_then_rerun(engine, slow_product, version, images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    args = ["--config", str(slow_product), "--version", version, "--out", str(out), "--no-roundtrip"]
    run = Run(tmp_path, *args)
    run.wait_for(lambda: "RUN skip=; for p in tp1 tp2" in run.err, "the in-image checks to start")
    run.stop(signal.SIGKILL)
    no_final_release(out, version)
    rerun = Run(tmp_path, *args)
    assert rerun.proc.wait(120) == 0, rerun.err
    assert not (out / f".{version}.partial").exists()
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out / version, capture_output=True).returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_during_the_archive(big_image, tmp_path, sig):
    out = tmp_path / "release"
    args = ["archive", big_image, "--out", str(out), "--no-roundtrip"]
    run = Run(tmp_path, *args)
    staging = out / ".1.partial"
    run.wait_for(lambda: staging.exists() and any(staging.iterdir()), "the archive's first file")
    assert run.stop(sig) == 130
    assert sorted(os.listdir(out)) == [".1.lock"]
    rerun = Run(tmp_path, *args)
    assert rerun.proc.wait(180) == 0, rerun.err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_interrupted_during_the_round_trip_stops_the_scratch_engine(big_image, tmp_path, sig):
    out, scratch = tmp_path / "release", tmp_path / "scratch"
    scratch.mkdir(mode=0o700)  # a scratch folder must be private
    run = Run(tmp_path, "archive", big_image, "--out", str(out), "--scratch-dir", str(scratch))
    run.wait_for(lambda: "loading into scratch dockerd" in run.err, "the round trip's load")
    folder = scratch_dirs(scratch)[0]
    assert running_from(folder)
    assert run.stop(sig) == 130
    assert scratch_dirs(scratch) == [] and running_from(folder) == []
    assert sorted(os.listdir(out)) == [".1.lock"]


def test_killed_during_the_round_trip_the_next_run_cleans_up(big_image, tmp_path):
    out, scratch = tmp_path / "release", tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    args = ["archive", big_image, "--out", str(out), "--scratch-dir", str(scratch)]
    run = Run(tmp_path, *args)
    run.wait_for(lambda: "loading into scratch dockerd" in run.err, "the round trip's load")
    folder = scratch_dirs(scratch)[0]
    run.stop(signal.SIGKILL)
    assert running_from(folder), "a killed run cannot stop its scratch engine: the next run must"
    no_final_release(out, "1")
    rerun = Run(tmp_path, *args)
    assert rerun.proc.wait(240) == 0, rerun.err
    assert f"removed a scratch engine left by an interrupted run: {folder}" in rerun.err
    assert running_from(folder) == [] and scratch_dirs(scratch) == []
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out / "1", capture_output=True).returncode == 0


def test_an_engine_that_stops_mid_save_is_a_clear_error(engine, big_image, tmp_path):
    out = tmp_path / "release"
    with ScratchEngine() as source:
        source.engine.load(engine.save(big_image))
        run = Run(tmp_path, "archive", big_image, "--engine", source.engine.address, "--out", str(out),
                  "--no-roundtrip")
        staging = out / ".1.partial"
        run.wait_for(lambda: staging.exists() and any(staging.iterdir()), "the archive's first file")
        os.kill(source.pid, signal.SIGKILL)
        assert run.proc.wait(60) == 1
        last = run.err.strip().splitlines()[-1]
        assert last.startswith("error: ") and source.engine.address in last, run.err
    assert sorted(os.listdir(out)) == [".1.lock"]


def test_a_scratch_dir_too_small_for_the_image_is_named_as_the_full_folder(tmp_path):
    out, scratch = tmp_path / "release", tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(scratch)], check=True)
    try:
        run = Run(tmp_path, "archive", "localhost/unibake-busybox:1", "--out", str(out), "--scratch-dir", str(scratch))
        assert run.proc.wait(120) == 1, run.err
        last = run.err.strip().splitlines()[-1]
        # it named the scratch engine's socket, a folder elsewhere, and not the --scratch-dir that is full
        assert last.startswith(f"error: no space left in {scratch} (the round trip's scratch engine, "), run.err
        assert "give --scratch-dir a folder on a bigger disk" in last
        assert os.listdir(scratch) == [] and sorted(os.listdir(out)) == [".1.lock"]
    finally:
        subprocess.run(["umount", str(scratch)], check=True)


def test_a_second_run_on_the_same_tag_is_refused(slow_product, version, images, tmp_path):
    images(f"unibake-test:{version}")
    out = tmp_path / "release"
    args = ["--config", str(slow_product), "--version", version, "--out", str(out), "--no-roundtrip"]
    first = Run(tmp_path, *args)
    first.wait_for(lambda: "==> build" in first.err, "the first run's build")
    second = Run(tmp_path, *args)
    assert second.proc.wait(60) == 1
    assert f"error: another run is writing release {out / version} (pid {first.proc.pid})" in second.err
    assert first.proc.wait(120) == 0, first.err
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out / version, capture_output=True).returncode == 0
