"""The benchmark harness runs, at a small size, so that it cannot rot (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

from ..conftest import REPO


def test_the_benchmark_harness_runs_and_reports_every_measurement_and_target(tmp_path, engine):
    before = {t for i in engine.list_images() for t in i.tags}
    out = tmp_path / "BENCHMARKS.md"
    try:
        run = subprocess.run([sys.executable, str(REPO / "benchmarks/bench.py"), "--quick", "--out", str(out)],
                             capture_output=True, text=True, timeout=600)
    finally:  # the payload images it built are the benchmark's, not the engine's to keep
        for tag in {t for i in engine.list_images() for t in i.tags} - before:
            engine.remove_image(tag)
    assert run.returncode == 0, run.stderr[-3000:]
    report = out.read_text()
    for row in ("`docker save IMAGE > /dev/null`", "peer: `docker save | zstd -T0 -3 | tee FILE | sha256sum`",
                "ours: archive stage", "round trip, shell", "round trip, ours", "peak RSS of our archive stage",
                "cold build", "no-op rebuild", "one tune-cache JSON change", "compression, level 3",
                "long-distance matching"):
        assert row in report, row
    targets = [line for line in report.splitlines() if line.endswith(("| met |", "| MISSED |"))]
    assert len(targets) == 9
