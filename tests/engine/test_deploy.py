"""One release onto several engines at once: real scratch engines, and one nothing answers at."""

from __future__ import annotations

import json
import threading
import uuid
from contextlib import ExitStack

from unibake import docker_engine
from unibake.scratch import ScratchEngine

from ..unit.test_deploy import silent_engine
from ..unit.test_publish import make_release


def test_deploy_to_three_engines_goes_on_past_a_broken_one_and_a_second_run_skips(cli, tmp_path):
    out = tmp_path / "release"
    made = cli("archive", "localhost/unibake-busybox:1", "--tag", "bb-d", "--out", str(out), "--no-roundtrip")
    assert made.code == 0, made.err
    folder = out / "bb-d"
    manifest = json.loads((folder / "manifest.json").read_text())
    broken = f"unix:///tmp/ub-nothing-{uuid.uuid4().hex[:8]}.sock"
    with ExitStack() as stack:
        # each scratch engine in a base folder of its own: a new one sweeps its folder of this process's others
        scratch = [stack.enter_context(ScratchEngine(tmp_path / f"scratch-{i}")) for i in range(3)]
        addresses = [s.engine.address for s in scratch]
        hosts = tmp_path / "hosts"
        hosts.write_text(f"# the fleet\n{addresses[1]}\n\n{broken}   # gone\n{addresses[2]}\n")

        first = cli("--json", "deploy", str(folder), "--engine", addresses[0], "--hosts", str(hosts))
        assert first.code == 3
        rows = json.loads(first.out)["engines"]
        assert [(r["engine"], r["result"]) for r in rows] == [
            (addresses[0], "loaded"), (addresses[1], "loaded"), (broken, "failed"), (addresses[2], "loaded")]
        assert "no engine listens there" in rows[2]["detail"]
        assert first.error_lines[-1].startswith(f"error: 1 of 4 engines failed: {broken}: ")
        table = first.err[first.err.index("deploy localhost/unibake-busybox:1"):]
        assert all(a in table for a in [*addresses, broken]) and "FAILED" in table and "engine  " in table
        for s in scratch:
            got = s.engine.inspect_image(manifest["tag"])
            assert got is not None and got.id == manifest["image_id"]

        again = cli("--json", "deploy", str(folder), "--engine", addresses[0], "--hosts", str(hosts))
        assert again.code == 3
        assert [r["result"] for r in json.loads(again.out)["engines"]] == ["skipped", "skipped", "failed", "skipped"]

        healthy = cli("deploy", str(folder), *[x for a in addresses for x in ("--engine", a)])
        assert healthy.code == 0, healthy.err
        assert "deployed" in healthy.err.splitlines()[-1]


def test_an_engine_that_takes_the_connection_and_never_answers_is_a_failed_row_not_an_hour(cli, tmp_path,
                                                                                          monkeypatch):
    """Before: the API version request waited for the hour every request may take."""
    monkeypatch.setattr(docker_engine, "CONNECT_TIMEOUT", 1)
    folder, _ = make_release(tmp_path / "release")
    with silent_engine() as address:
        said = []
        reaching = threading.Thread(target=lambda: said.append(cli("--json", "deploy", str(folder), "--engine", address)),
                                    daemon=True)
        reaching.start()
        reaching.join(20)
        assert not reaching.is_alive(), "deploy still waits for an engine that never answers"
    result = said[0]
    assert result.code == 3, result.err
    row = json.loads(result.out)["engines"][0]
    assert row["result"] == "failed" and f"cannot reach the Docker engine at {address}" in row["detail"]
