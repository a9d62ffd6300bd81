"""No traceback anywhere: every command, run as a user would (python build.py ...), with hostile
arguments and inputs, ends with one `error:` line and a documented exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO

NO_ENGINE = "unix:///nonexistent/unibake-test.sock"


def hostile_folders(tmp: Path) -> dict[str, Path]:
    made = {}
    made["file"] = tmp / "a-file"
    made["file"].write_text("not a folder\n")
    made["fifo-sums"] = tmp / "fifo-sums"
    made["fifo-sums"].mkdir()
    os.mkfifo(made["fifo-sums"] / "SHA256SUMS")
    made["garbage"] = tmp / "garbage"
    made["garbage"].mkdir()
    (made["garbage"] / "SHA256SUMS").write_bytes(b"\xff\xfe\x00garbage\n")
    (made["garbage"] / "manifest.json").write_text("{" * 5000)
    made["nested"] = tmp / "nested"
    made["nested"].mkdir()
    (made["nested"] / "manifest.json").write_text("[" * 100000)
    (made["nested"] / "SHA256SUMS").write_text(f"{'0' * 64}  manifest.json\n")
    made["releases"] = tmp / "releases"
    (made["releases"] / "x").mkdir(parents=True)
    (made["releases"] / "x" / "manifest.json").write_text('{"schema": "1"}')
    made["profiles-file"] = tmp / "profiles.yaml"
    made["profiles-file"].write_text("product: x\n")
    return made


def cases(f: dict[str, Path], tmp: Path) -> list[list[str]]:
    return [
        ["verify", str(tmp / "nowhere")], ["verify", str(f["file"])], ["verify", str(f["fifo-sums"])],
        ["verify", str(f["garbage"])], ["verify", str(f["nested"])],
        ["verify", str(f["garbage"]), "--load", "--engine", NO_ENGINE],
        ["releases", "--out", str(f["file"])], ["releases", "--out", str(f["releases"]), "--deep"],
        ["archive", "x:1;rm -rf /", "--engine", NO_ENGINE], ["archive", "../../etc", "--engine", NO_ENGINE],
        ["archive", "demo:" + "9" * 300, "--engine", NO_ENGINE], ["archive", "démo:1", "--engine", NO_ENGINE],
        ["archive", "demo:1", "--engine", "ftp://nowhere"], ["archive", "demo:1", "--engine", NO_ENGINE],
        ["archive", "demo:1", "--split", "-5GiB"], ["archive", "demo:1", "--level", "99"],
        ["archive", "demo:1", "--tag", "../up"], ["archive", "demo:1", "--out", str(f["file"]), "--engine", NO_ENGINE],
        ["hotfix", "--from", "../../etc", "--version", "2", "--out", str(tmp)],
        ["hotfix", "--from", "x", "--version", "2", "--out", str(f["releases"])],
        ["hotfix", "--from", "x", "--version", "$(id)"],
        ["lock", "--config", str(tmp / "nowhere")], ["lock", "--config", str(f["profiles-file"])],
        ["prune", "--keep", "-1"], ["prune", "--out", str(f["file"]), "--engine", NO_ENGINE],
        ["--config", str(f["profiles-file"])], ["--profile", "", "--stage", "render"],
        ["--version", "1\nRUN id", "--stage", "render"], ["--stage", "render", "--allow", "(("],
        ["--stage", "render", "--metadata-file", "/proc/nope/x.json", "--json"],
        ["--stage", "build", "--engine", NO_ENGINE], ["--engine", "tcp://256.1.1.1:1", "--stage", "build"],
        ["repro", "--config", str(tmp / "nowhere")], ["--bogus"], ["verify"], ["archive"],
        ["--json", "verify", str(f["garbage"])], ["--quiet", "releases", "--out", str(f["releases"])],
    ]


def test_every_command_refuses_hostile_input_without_a_traceback(tmp_path):
    folders = hostile_folders(tmp_path)
    failures = []
    for args in cases(folders, tmp_path):
        run = subprocess.run([sys.executable, str(REPO / "build.py"), *args], capture_output=True, text=True,
                             cwd=REPO, env={**os.environ, "CI": "1", "SOURCE_DATE_EPOCH": "0"}, timeout=120)
        last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        if "Traceback" in run.stderr or run.returncode not in (0, 1, 2, 3) or \
                (run.returncode and not last.startswith("error: ")):
            failures.append((args, run.returncode, run.stderr[-600:]))
    assert not failures, "\n\n".join(f"{a}: exit {c}\n{e}" for a, c, e in failures)
    assert len(cases(folders, tmp_path)) >= 35
