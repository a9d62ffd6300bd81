"""The release scenarios on the realistic product (:mod:`benchmarks.realistic`), smoke gates left out
of both sides (``--no-smoke``: the round trip still runs):

    cold     ``build.py --profile all --no-cache --version cold --force``, build to published folder,
             against the same work by hand: ``docker build`` + ``docker save | zstd -T0 -3 | tee FILE |
             sha256sum`` + ``zstd -dc FILE | docker load`` into a fresh engine (the issue's sum; the
             fresh engine's start and stop are timed apart)
    tune     after one tune-cache JSON change and ``build.py lock``, a release of a new version, as a user
             makes one (no ``--from``): made on the newest release at its SOURCE_DATE_EPOCH, the cold release
             (once, too, with ``--no-from``: made alone)
    hotfix   after another such change, ``build.py hotfix --from`` the tune release

Every round starts from the same engine (the bases only: each round's images are removed first, so
the cold run is cold) and the same inputs (the JSON restored), so the cold release's archive must be
byte-identical in every round: that is checked, as are the round trip and the image ID of every
release. Where the time goes comes from the stage times the pipeline prints in its summary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import realistic
from unibake.builder import iso_time
from unibake.pipeline import git_revision
from unibake.plan import make_plan
from unibake.render import render, write_context_tar
from unibake.scratch import ScratchEngine

ROOT = Path(__file__).resolve().parent.parent
EPOCH = 1700000000
PEER_TAG = f"{realistic.PRODUCT}-peer:cold"
STAGE_RE = re.compile(r"^  (?P<name>\S.*?)\s+(?P<seconds>\d+\.\d) s  (?P<status>ok|failed|skipped)\b")
CACHE_RE = re.compile(r"(\d+) of (\d+) steps from the build cache")
NO_SMOKE = "skipped with --no-smoke"
KEPT = "an earlier run kept the release it is made on there"  # (the export's line, as build.py prints it)
MADE_ON = re.compile(r"made on release (\S+), the newest under --out")  # (the earlier release stage's line)


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One timed run of build.py: its wall time, the stage times of its summary, what it published."""

    seconds: float
    stages: dict[str, float]
    cached: str = ""  # "N of M" build steps from the build cache
    manifest: dict = field(default_factory=dict)
    kept: bool = False  # its round trip found the release it is made on kept in the verify engine (its own line)
    made_on: str = ""  # made without --from: the earlier release it was made on (its own line)


def sh(cmd: str, env: dict | None = None) -> float:
    """Wall time of a shell pipeline (pipefail: any failing part fails it)."""
    start = time.monotonic()
    run = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env={**os.environ, **(env or {})},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        raise SystemExit(f"error: `{cmd}` failed ({run.returncode}): {run.stderr.strip()[-1500:]}")
    return time.monotonic() - start


def parse_summary(stderr: str) -> dict[str, float]:
    """The stage times of the summary build.py prints last (``  name   12.3 s  ok``), by stage name."""
    lines = stderr.splitlines()
    title = max((i for i, x in enumerate(lines) if x.startswith("unibake: ")), default=-1)
    stages = {}
    for line in lines[title + 1:]:
        m = STAGE_RE.match(line)
        if m and m["status"] != "skipped":
            stages[m["name"]] = float(m["seconds"])
    return stages


class Releases:
    """The realistic product laid out in ``work``, and its scenarios, measured round by round."""

    def __init__(self, engine, work: Path, wheel: Path, *, log: Callable[[str], None]):
        self.engine, self.work, self.wheel, self.log = engine, work, wheel, log
        # build.py runs as a user's does: Python keeps its bytecode (here in the work folder, removed with it),
        # where a shell that sets PYTHONDONTWRITEBYTECODE (as some sandboxes do) would have every run compile
        # unibake's modules again (about 0.3 s a run on this machine kind); the first run (cold-first) compiles
        self.env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "CI": "1",
                    "SOURCE_DATE_EPOCH": str(EPOCH), "PYTHONPYCACHEPREFIX": str(work / "pycache")}
        self.out = work / "release"
        self.base = ""
        self.profiles = work / "product" / "profiles"
        self.peer_ctx = work / "peer" / "ctx"
        self.peer_file = work / "peer" / "image.tar.zst"
        self.cold_sha256: set[str] = set()
        # the scratch engines' folder, the seeded verify engine's too: its own, removed with the work folder
        self.scratch = work / "scratch"

    def prepare(self) -> None:
        """The realistic base image (once), the product laid out and locked, the by-hand context."""
        start = time.monotonic()
        self.base = realistic.ensure_base(self.engine, self.wheel)
        self.log(f"    base {self.base} ready in {time.monotonic() - start:.1f} s")
        realistic.lay_out_product(self.work / "product", self.base, self.wheel)
        # By hand: the same Dockerfile and context unibake renders and tars, unpacked into a folder that
        # `docker build` reads (and tars again, as it does for anyone building by hand).
        plan = make_plan(self.profiles, profiles=["all"], version="cold", cwd=self.work)
        shutil.rmtree(self.peer_ctx, ignore_errors=True)
        self.peer_ctx.mkdir(parents=True)
        with tempfile.TemporaryFile(dir=self.work) as tar:
            write_context_tar(render(plan), tar, mtime=EPOCH)
            tar.seek(0)
            with tarfile.open(fileobj=tar) as t:
                t.extractall(self.peer_ctx, filter="data")
        self.build_args = {"UNIBAKE_REVISION": git_revision(self.work / "product"), "UNIBAKE_CREATED": iso_time(EPOCH)}

    # --- ours ---------------------------------------------------------------------------------

    def ours(self, name: str, *args: str) -> Measured:
        """One build.py command, timed; the release it published checked (round trip, image ID)."""
        meta = self.work / "meta" / f"{name}.json"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.unlink(missing_ok=True)
        cmd = [sys.executable, str(ROOT / "build.py"), *args, "--config", str(self.profiles),
               "--metadata-file", str(meta)]
        if "--stage" not in args:  # (a --stage build runs no round trip: --scratch-dir there is refused)
            cmd += ["--scratch-dir", str(self.scratch)]
        start = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=self.work)
        seconds = time.monotonic() - start
        if run.returncode != 0:
            raise SystemExit(f"error: {name}: `{' '.join(cmd[1:])}` failed ({run.returncode}):\n"
                             f"{run.stderr.strip()[-3000:]}")
        cached = CACHE_RE.search(run.stderr)
        manifest = json.loads(meta.read_text())
        if "--stage" not in args:
            self._check_release(name, manifest)
        stages = parse_summary(run.stderr)
        self.log(f"    {name}: {seconds:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in stages.items() if v >= 0.1) + ")")
        made_on = MADE_ON.search(run.stderr)
        return Measured(seconds=seconds, stages=stages, manifest=manifest, kept=KEPT in run.stderr,
                        made_on=made_on[1] if made_on else "",
                        cached=f"{cached[1]} of {cached[2]}" if cached else "")

    def _check_release(self, name: str, manifest: dict) -> None:
        """What the release must still prove, whatever the pipeline does to be fast."""
        folder = self.out / manifest["release"]
        validation = json.loads((folder / "VALIDATION.json").read_text())
        trip = validation.get("round_trip")
        problems = []
        if not trip or trip.get("image_id") != manifest["image_id"]:
            problems.append(f"no round trip of {manifest['image_id']} recorded ({validation.get('round_trip_skipped')})")
        if validation.get("smoke") or validation.get("smoke_skipped") != NO_SMOKE:
            problems.append(f"the smoke gates were not left out as asked ({validation.get('smoke_skipped')})")
        info = self.engine.inspect_image(manifest["tag"])
        if info is None or info.id != manifest["image_id"]:
            problems.append(f"the engine's {manifest['tag']} is not the released {manifest['image_id']}")
        if problems:
            raise SystemExit(f"error: {name}: release {folder}: " + "; ".join(problems))

    def cold(self, r: int | str, *extra: str) -> Measured:
        m = self.ours(f"cold-{r}", "build", "--profile", "all", "--no-cache", "--version", "cold", "--force",
                      "--out", str(self.out), "--no-smoke", *extra)
        self.cold_sha256.add(m.manifest["archive"]["sha256"])
        return m

    def seeded(self, first: Measured) -> bool:
        """The first release on the base started the verify engine empty (its round trip loaded the whole image)
        and left it seeded with the base image."""
        base_id = self.engine.inspect_image(self.base).id
        folders = sorted(self.scratch.glob("ub-seed-*")) if self.scratch.is_dir() else []
        validation = json.loads((self.out / first.manifest["release"] / "VALIDATION.json").read_text())
        return validation["round_trip"]["held_before"] == [] and any(
            (f / "seeded").is_file() and (f / "seeded").read_text().strip() == base_id for f in folders)

    def tune(self, r: int | str, *extra: str) -> Measured:
        """A release after one tune-cache JSON change, as a user makes one; ``extra``: ``--from cold``, ``--no-from``.
        Without either it must have been made on the cold release (the newest at its epoch), else the run stops."""
        realistic.set_tune(self.profiles, f"r{r}a")
        m = self.ours(f"tune-{r}", "build", "--profile", "all", "--version", f"tune{r}", "--out", str(self.out),
                      "--no-smoke", *extra)
        if not extra and m.made_on != "cold":
            raise SystemExit(f"error: tune-{r}: made on {m.made_on or 'no release'}, not on the cold release, the "
                             "newest under --out at its SOURCE_DATE_EPOCH")
        return m

    def hotfix(self, r: int) -> Measured:
        realistic.set_tune(self.profiles, f"r{r}b")
        return self.ours(f"hotfix-{r}", "hotfix", "--from", f"tune{r}", "--profile", "all", "--version",
                         f"hotfix{r}", "--out", str(self.out), "--no-smoke")

    def noop(self, r: int, name: str = "noop") -> Measured:
        """The image of the last hotfix built whole from the same inputs. The first such build after an
        assembled hotfix is no no-op: that hotfix built a small image, never the whole one, so the engine's
        build cache lacks the steps above the memo's marker; run again, every step comes from the cache."""
        return self.ours(name, "build", "--profile", "all", "--version", f"hotfix{r}", "--stage", "build")

    def reset(self) -> None:
        """The inputs of the cold release: the example's tune caches, locked."""
        realistic.set_tune(self.profiles, None)

    # --- by hand --------------------------------------------------------------------------------

    def peer(self) -> dict[str, float]:
        """The cold release by hand, part by part (seconds); its image removed afterwards."""
        args = " ".join(f"--build-arg {k}={v}" for k, v in self.build_args.items())
        parts = {"build": sh(f"docker build --no-cache -t {PEER_TAG} {args} {self.peer_ctx}", {"DOCKER_BUILDKIT": "0"})}
        parts["save"] = sh(f"docker save {PEER_TAG} | zstd -T0 -3 -q | tee {self.peer_file} | sha256sum")
        start = time.monotonic()
        scratch = ScratchEngine()
        with scratch:
            parts["start"] = time.monotonic() - start
            parts["load"] = sh(f"zstd -dc {self.peer_file} | docker load", {"DOCKER_HOST": scratch.engine.address})
            stop = time.monotonic()
        parts["stop"] = time.monotonic() - stop
        # The sum: build + save + load. Starting and stopping the fresh engine are timed apart: ours
        # pays them inside its run, and they could overlap other work; "with engine" counts them too.
        parts["total"] = parts["build"] + parts["save"] + parts["load"]
        parts["with engine"] = parts["total"] + parts["start"] + parts["stop"]
        self.peer_file.unlink()
        self.log(f"    by hand: {parts['total']:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()
                                                              if k not in ("total", "with engine")) + ")")
        return parts

    @property
    def reproducible(self) -> bool:
        """Every cold release gave the same archive, byte for byte."""
        return len(self.cold_sha256) == 1
