#!/usr/bin/env python3
"""The performance benchmark: one command, a table, and docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/bench.py              # the full run, about 20 minutes, the engine to itself
    .venv/bin/python benchmarks/bench.py --quick      # tiny sizes, 1 round: the test suite's check (prints only)

What it measures, in one run:
  - the realistic product (benchmarks/realistic.py: the example product on a base holding the unpacked
    PyTorch CPU wheel, with the wheel's libtorch_cpu.so in its engine folder; about 1.31 GB): a cold
    release against the same work by hand, a release after one tune-cache JSON change, a hotfix --from
    release, and where the time goes (benchmarks/releases.py);
  - the archive stage on two payloads, today's mostly incompressible one (benchmarks/payload.py) and a
    compressible one (copies of the unpacked wheel), against the engine's bare export and the peer
    `docker save | zstd -T0 -3 | tee FILE | sha256sum`, with its peak RSS at two sizes;
  - the round trip against `zstd -dc FILE | docker load`, and compression with long-distance matching.

Every comparison is measured in the same run, alternating the contenders within each round, and
reported as the median of the rounds with min and max; targets are ratios against what is measured
alongside, because the machine is noisy. Give it the engine to itself: at the end it removes every tag
and dangling image that appeared while it ran (what it made; --keep-images keeps the payload and base
images for another run), and another user's work would disturb the timings too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import realistic  # noqa: E402
from benchmarks.engine_state import Snapshot, restore, snapshot  # noqa: E402
from benchmarks.payload import ensure_image  # noqa: E402
from benchmarks.releases import Measured, Releases, sh  # noqa: E402
from unibake.docker_engine import DockerEngine  # noqa: E402
from unibake.scratch import ScratchEngine  # noqa: E402

PY = sys.executable
GB = 1e9


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Series:
    name: str
    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def cell(self, unit: str = "s") -> str:
        if len(self.values) == 1:
            return f"{self.values[0]:.0f} MiB" if unit == "MiB" else f"{self.values[0]:.2f} s"
        if unit == "MiB":
            return f"{self.median:.0f} MiB (min {min(self.values):.0f}, max {max(self.values):.0f})"
        return f"{self.median:.2f} s (min {min(self.values):.2f}, max {max(self.values):.2f})"


def child(args: list[str]) -> tuple[float, dict]:
    """Wall time and JSON output of a Python child."""
    start = time.monotonic()
    run = subprocess.run([PY, *args], stdout=subprocess.PIPE, cwd=ROOT)
    if run.returncode != 0:
        raise SystemExit(f"error: {' '.join(args)} failed ({run.returncode})")
    return time.monotonic() - start, json.loads(run.stdout or b"{}")


def ours_archive(image: str, folder: Path, *extra: str) -> tuple[float, int, dict]:
    """Our archive stage in a child of its own: wall time, its own peak RSS (MiB), what it reported."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    seconds, out = child(["-m", "benchmarks.archive_once", image, str(folder), *extra])
    return seconds, out["peak_rss_mib"], out


# ---------------------------------------------------------------------------------------------
# The archive stage, the round trip, compression


@dataclass
class ArchiveRun:
    """The archive stage on one payload against the bare export and the peer, with its peak RSS."""

    image: str
    save: Series = field(default_factory=lambda: Series("save"))
    peer: Series = field(default_factory=lambda: Series("peer"))
    ours: Series = field(default_factory=lambda: Series("ours"))  # the stage and a sha256 of its archive
    stage: Series = field(default_factory=lambda: Series("stage"))  # the stage alone, as inside a release
    via_save: Series = field(default_factory=lambda: Series("ours, --engine-save"))
    rss: Series = field(default_factory=lambda: Series("rss"))
    small_rss: Series = field(default_factory=lambda: Series("rss"))
    info: dict = field(default_factory=dict)


# both payloads lie under /opt/payload: the stage hashes their libraries for the SBOM, as a release's does
# those under /opt/unibake
INSPECT = ("--inspect-root", "/opt/payload")


def measure_archive(image: str, small: str, work: Path, rounds: int) -> ArchiveRun:
    run = ArchiveRun(image)
    work.mkdir(parents=True, exist_ok=True)
    for r in range(rounds):
        order = ["save", "peer", "ours", "via_save"]
        for who in order[r % 4:] + order[:r % 4]:
            if who == "save":
                run.save.values.append(sh(f"docker save {image} > /dev/null"))
            elif who == "peer":
                peer_file = work / "peer.tar.zst"
                run.peer.values.append(sh(f"docker save {image} | zstd -T0 -3 -q | tee {peer_file} | sha256sum"))
                run.info["peer_bytes"] = peer_file.stat().st_size
            elif who == "via_save":  # the same stage made to read the engine's save (--engine-save)
                _, _, out = ours_archive(image, work / "ours", "--engine-save", *INSPECT)
                if out["source"] != "save" or out["bytes"] != run.info.get("bytes", out["bytes"]):
                    raise SystemExit(f"error: --engine-save on {image} read {out['source']} or wrote another archive")
                run.via_save.values.append(out["seconds"] + out["digest_seconds"])
            else:
                _, mib, out = ours_archive(image, work / "ours", *INSPECT)
                if out["bytes"] != run.info.get("bytes", out["bytes"]):
                    raise SystemExit(f"error: the archive stage on {image} wrote another archive than before")
                # the peer hashes its archive (`| sha256sum`); the stage does not (a release's round trip
                # reads the archive back and hashes it): the comparison adds that digest to the stage
                run.ours.values.append(out["seconds"] + out["digest_seconds"])
                run.stage.values.append(out["seconds"])
                run.rss.values.append(mib)
                run.info.update(out)
    for _ in range(rounds):
        run.small_rss.values.append(ours_archive(small, work / "small", *INSPECT)[1])
    shutil.rmtree(work / "small", ignore_errors=True)
    return run


def measure_round_trip(work: Path, rounds: int) -> tuple[Series, Series, Series]:
    """Both round trips of the archives ``measure_archive`` left in ``work``, each into a fresh engine."""
    shell, ours, wall = Series("shell"), Series("ours"), Series("ours, whole command")
    for r in range(rounds):
        for who in (["shell", "ours"] if r % 2 == 0 else ["ours", "shell"]):
            with ScratchEngine() as scratch:
                if who == "shell":
                    shell.values.append(sh(f"zstd -dc {work / 'peer.tar.zst'} | docker load",
                                           {"DOCKER_HOST": scratch.engine.address}))
                else:
                    seconds, out = child(["-m", "benchmarks.roundtrip_once", str(work / "ours"),
                                          scratch.engine.address])
                    ours.values.append(out["seconds"])
                    wall.values.append(seconds)  # with the interpreter's start, as the shell's is timed
    return shell, ours, wall


def measure_compression(image: str, work: Path) -> dict:
    _, _, default = ours_archive(image, work / "c3", *INSPECT)
    _, _, long = ours_archive(image, work / "c3long", "--long", *INSPECT)
    shutil.rmtree(work / "c3", ignore_errors=True)
    shutil.rmtree(work / "c3long", ignore_errors=True)
    return {"default_s": default["seconds"], "long_s": long["seconds"], "default_bytes": default["bytes"],
            "long_bytes": long["bytes"], "uncompressed": default["uncompressed"]}


# ---------------------------------------------------------------------------------------------
# The realistic product's releases


@dataclass
class ReleaseRuns:
    cold: list[Measured] = field(default_factory=list)
    tune: list[Measured] = field(default_factory=list)
    hotfix: list[Measured] = field(default_factory=list)
    peer: list[dict[str, float]] = field(default_factory=list)
    noop_first: Measured | None = None  # the hotfix's inputs built whole the first time (the hotfix was assembled)
    noop: Measured | None = None  # the same command again: a true no-op
    tune_alone: Measured | None = None  # once: a release after one tune-cache JSON change, made alone (--no-from)
    fan_first: Measured | None = None  # once: a release --from the cold release, which the verify engine no longer kept
    fan: Measured | None = None  # then a second one --from the cold release: kept with the first, as the engine started
    first: Measured | None = None  # the first cold release on this base: the verify engine keeps its base image
    no_seed: Measured | None = None  # a cold release with --no-seed: the round trip in an empty engine
    reproducible: bool = False
    base: str = ""
    base_size: int = 0


def measure_releases(engine, work: Path, wheel: Path, rounds: int, made: set[str]) -> ReleaseRuns:
    """Per round: the engine back to the bases only and the inputs to the cold release's; the cold
    release and the same work by hand (alternating which goes first); then the tune-cache release and
    the hotfix on top of it."""
    releases = Releases(engine, work, wheel, log=log)
    releases.prepare()
    made.add(releases.base)
    out = ReleaseRuns(base=releases.base, base_size=engine.inspect_image(releases.base).size)
    clean = snapshot(engine)  # the bases only: what every round starts from
    # Once, before the rounds: the first release on this base loads its whole image into the verify engine,
    # empty, which keeps the base image from it (in the work folder's scratch folder, for the rounds).
    releases.reset()
    out.first = releases.cold("first")
    if not releases.seeded(out.first):
        raise SystemExit("error: the first cold release did not start the verify engine empty and leave it seeded "
                         "with its base image in the scratch folder")
    _restore(engine, clean)
    out.no_seed = releases.cold("no-seed", "--no-seed")
    for r in range(rounds):
        log(f"  round {r + 1} of {rounds}")
        _restore(engine, clean)
        releases.reset()
        for who in (["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]):
            if who == "ours":
                out.cold.append(releases.cold(r))
            else:
                out.peer.append(releases.peer())
        out.tune.append(releases.tune(r))
        out.hotfix.append(releases.hotfix(r))
    out.noop_first = releases.noop(rounds - 1, "noop-first")
    out.noop = releases.noop(rounds - 1)
    out.tune_alone = releases.tune("alone", "--no-from")
    # Two more releases made --from the cold release (each after one more change): the first finds it no longer kept
    # (the verify engine kept the release alone made), the second finds it kept with the first, and loads only itself
    out.fan_first = releases.tune("fan1", "--from", "cold")
    out.fan = releases.tune("fan2", "--from", "cold")
    if out.fan_first.kept or not out.fan.kept:
        raise SystemExit("error: the second release made --from the cold release did not find it kept in the verify "
                         f"engine, or the first did (kept: {out.fan_first.kept}, then {out.fan.kept})")
    out.reproducible = releases.reproducible
    return out


def keeping(before: Snapshot, tags: set[str]) -> Snapshot:
    """``before`` as if ``tags`` had been there too: what a restore leaves alone."""
    return Snapshot(tags=before.tags | tags, dangling=before.dangling)


def _restore(engine, to: Snapshot) -> None:
    left = restore(engine, to)
    if left:
        raise SystemExit(f"error: the benchmark could not remove what it made: {', '.join(left)}")


def series(name: str, values) -> Series:
    return Series(name, list(values))


# ---------------------------------------------------------------------------------------------
# The report


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def engine_version(engine) -> str:
    try:
        return engine.version()
    except Exception:  # the report still says which engine it was, as far as known
        return "unknown"


def stage_table(rel: ReleaseRuns) -> list[str]:
    """Where the time goes: each stage's median over the rounds, per scenario."""
    runs = {"cold release": rel.cold, "after one tune-cache JSON change": rel.tune, "`hotfix --from`": rel.hotfix}
    names: list[str] = []
    for measured in (m for ms in runs.values() for m in ms):
        names += [n for n in measured.stages if n not in names]

    def med(ms: list[Measured], name: str) -> str:
        values = [m.stages[name] for m in ms if name in m.stages]
        return f"{statistics.median(values):.1f} s" if values else "-"

    lines = ["| stage | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(med(ms, name) for ms in runs.values()) + " |")
    lines.append("| outside the stages (start-up and imports; waiting at the end for the scratch engine, "
                 "stopped and removed in a thread since the smoke gates) | " + " | ".join(
        f"{statistics.median(m.seconds - sum(m.stages.values()) for m in ms):.1f} s" for ms in runs.values()) + " |")
    lines.append("| **whole run (wall)** | " + " | ".join(
        f"**{statistics.median(m.seconds for m in ms):.1f} s**" for ms in runs.values()) + " |")
    lines.append("| build steps from the build cache | " + " | ".join(ms[-1].cached for ms in runs.values()) + " |")

    def shipped(m: Measured) -> str:
        a, hotfix, layers = m.manifest.get("archive") or {}, m.manifest.get("hotfix"), m.manifest.get("diff_ids", ())
        which = f"{len(hotfix.get('shipped_diff_ids', ()))} of {len(layers)} layers" if hotfix else \
            f"all {len(layers)} layers"
        return f"{a.get('bytes', 0):,} bytes, {which}"

    lines.append("| archive shipped | " + " | ".join(shipped(ms[-1]) for ms in runs.values()) + " |")
    return lines


def build_seconds(m: Measured, normalise: float | None = None) -> float:
    """The build and normalise stages of a release: what `--stage build` costs, less start-up and planning.
    A one-pass release has no normalise stage (its export rewrites, hashes, compresses and loads at once):
    ``normalise`` then stands for it; None: its export does (more than a normalise: a numerator's choice)."""
    if "normalise" in m.stages:
        return m.stages.get("build", 0.0) + m.stages["normalise"]
    return m.stages.get("build", 0.0) + (m.stages.get("export", 0.0) if normalise is None else normalise)


# issue 11's targets: each goal's title is written from its number here, and its verdict compares with it
COLD_MAX = 1.0  # a cold release against the same work by hand
CHANGE_MAX = 0.15  # a release (or hotfix) after one tune-cache change, against the cold release
ARCHIVE_MAX = 0.9  # the archive stage and its digest, against the peer
RSS_MAX_MIB = 256  # the archive stage's peak RSS
RSS_FLAT = 0.10  # how far the bigger payload's peak RSS may be from the smaller's


def within(value: float, peer: float, most: float) -> bool:
    """A verdict: ``value`` is at most ``most`` times ``peer``."""
    return value <= most * peer


def flat(bigger: float, smaller: float) -> bool:
    """A verdict: the bigger payload's peak RSS is within RSS_FLAT of the smaller's, either way."""
    return abs(bigger / smaller - 1) <= RSS_FLAT


READ = {"store": "from the engine's storage", "save": "through the engine's save: this user cannot read its storage"}


def report(args, engine, big: ArchiveRun, libs: ArchiveRun, trip: tuple[Series, Series, Series], comp: dict,
           rel: ReleaseRuns, wall: float) -> str:
    rt_shell, rt_ours, rt_wall = trip
    cold, peer = series("cold", (m.seconds for m in rel.cold)), series("peer", (p["total"] for p in rel.peer))
    with_engine = series("peer", (p["with engine"] for p in rel.peer))
    tune, hotfix = series("tune", (m.seconds for m in rel.tune)), series("hotfix", (m.seconds for m in rel.hotfix))
    m0 = rel.cold[-1].manifest
    image_size, archive_bytes, saved = m0["image_size"], m0["archive"]["bytes"], m0["archive"]["uncompressed_bytes"]
    rss_max = max(big.rss.median, libs.rss.median)
    ratios = {run.image: run.rss.median / run.small_rss.median for run in (big, libs)}
    goals = [
        ("1", f"cold release, build to published folder, <= {COLD_MAX} x the same work by hand",
         f"{cold.median:.1f} s against {peer.median:.1f} s ({with_engine.median:.1f} s counting the fresh engine's "
         f"start and stop: {cold.median / with_engine.median:.3f}); the round trip in the seeded verify engine. "
         f"Once per base image, the first release (its round trip loads the whole image into that engine, empty, "
         f"which keeps the base image from it): {rel.first.seconds:.1f} s "
         f"({rel.first.seconds / peer.median:.3f}); with `--no-seed` (an empty engine, as by hand): "
         f"{rel.no_seed.seconds:.1f} s ({rel.no_seed.seconds / peer.median:.3f})", cold.median / peer.median,
         within(cold.median, peer.median, COLD_MAX)),
        ("2", "release after one tune-cache JSON change (no `--from`: made on the cold release, the newest at its "
              f"epoch) <= {CHANGE_MAX * 100:.0f} % of the cold release",
         f"{tune.median:.1f} s against {cold.median:.1f} s", tune.median / cold.median,
         within(tune.median, cold.median, CHANGE_MAX)),
        ("2", f"`hotfix --from` after one tune-cache JSON change <= {CHANGE_MAX * 100:.0f} % of the cold release",
         f"{hotfix.median:.1f} s against {cold.median:.1f} s", hotfix.median / cold.median,
         within(hotfix.median, cold.median, CHANGE_MAX)),
        ("3", f"archive stage and a sha256 of its archive <= {ARCHIVE_MAX} x the peer (whose `sha256sum` takes one), "
              "today's payload (mostly incompressible)",
         f"{big.ours.median:.2f} s against {big.peer.median:.2f} s (the image read {READ[big.info['source']]}; "
         f"through its save, `--engine-save`: {big.via_save.median:.2f} s, {big.via_save.median / big.peer.median:.3f})",
         big.ours.median / big.peer.median,
         within(big.ours.median, big.peer.median, ARCHIVE_MAX)),
        ("3", f"archive stage and a sha256 of its archive <= {ARCHIVE_MAX} x the peer, compressible payload (copies "
              "of the unpacked wheel)",
         f"{libs.ours.median:.2f} s against {libs.peer.median:.2f} s (the image read {READ[libs.info['source']]}; "
         f"through its save, `--engine-save`: {libs.via_save.median:.2f} s, {libs.via_save.median / libs.peer.median:.3f})",
         libs.ours.median / libs.peer.median,
         within(libs.ours.median, libs.peer.median, ARCHIVE_MAX)),
        ("3", f"peak RSS of the archive stage <= {RSS_MAX_MIB} MiB (both payloads, the bigger size)",
         f"{big.rss.median:.0f} and {libs.rss.median:.0f} MiB", None, rss_max <= RSS_MAX_MIB),
        ("3", f"peak RSS flat in image size: the bigger size within {RSS_FLAT * 100:.0f} % of the smaller, both payloads",
         f"{args.size:g} GB against {args.small:g} GB: " + " and ".join(f"{x:.3f}" for x in ratios.values()),
         max(ratios.values(), key=lambda x: abs(x - 1)),
         all(flat(run.rss.median, run.small_rss.median) for run in (big, libs))),
        ("1, 2", "every release measured kept its guarantees: round trip into an engine that never saw the image "
              "(holding only the base image; a hotfix's, or a release's made on another, also that release) "
              "with the image ID compared, the engine's image ID released, cold archives byte-identical in every round",
         f"{len(rel.cold) + len(rel.tune) + len(rel.hotfix) + 5} releases", None,
         rel.reproducible),
    ]
    save, whole = big.save.median, big.stage.median + rt_ours.median
    # the cold build and normalise: the cold releases' build, and a whole image's normalise, measured in the first
    # whole build of the last hotfix's inputs (the cold releases' one-pass export has no normalise stage of its own)
    cold_build = statistics.median(build_seconds(m, rel.noop_first.stages.get("normalise", 0.0)) for m in rel.cold)
    tune_build = statistics.median(build_seconds(m) for m in rel.tune)
    earlier = [
        ("archive stage <= 1.3 x `docker save > /dev/null`, today's payload", big.stage.median / save,
         big.stage.median <= 1.3 * save),
        ("archive stage <= 1.3 x `docker save > /dev/null`, compressible payload",
         libs.stage.median / libs.save.median, libs.stage.median <= 1.3 * libs.save.median),
        ("our round trip (the whole command, as the shell's is timed) <= 1.05 x the shell round trip",
         rt_wall.median / rt_shell.median, rt_wall.median <= 1.05 * rt_shell.median),
        ("build + normalise after one tune-cache change (its build and one-pass export) <= 10 % of the cold build "
         "+ normalise (realistic product)", tune_build / cold_build, tune_build <= 0.10 * cold_build),
        ("no-op rebuild (`--stage build`, whole command) <= 5 % of the cold build + normalise (realistic product)",
         rel.noop.seconds / cold_build, rel.noop.seconds <= 0.05 * cold_build),
        ("compressed size at the default level <= the peer's, today's payload", comp["default_bytes"] /
         big.info["peer_bytes"], comp["default_bytes"] <= big.info["peer_bytes"]),
        ("stretch: archive + round trip <= 2.0 x bare export, today's payload", whole / save, whole <= 2.0 * save),
    ]

    command = " ".join([".venv/bin/python", "benchmarks/bench.py"] + sys.argv[1:])
    lines = [
        "# Benchmarks", "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}, "
        f"commit {subprocess.run(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip() or 'unknown'}, "
        f"{os.cpu_count()} cores, Engine {engine_version(engine)}; {args.rounds} rounds, medians (min, max); "
        f"the whole benchmark took {wall / 60:.1f} minutes; load average {args.load_before} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after (the machine is shared: other work inflates both "
        "sides of every ratio). Regenerate it with the same command; `benchmarks/bench.py --help` says what each "
        "part measures.", "",
        "## The goals of issue 11 (release cost proportional to what changed)", "",
        "Each goal's ratio is ours over what it is compared with, from this run; smoke gates are left out of "
        "every release measured (`--no-smoke`), the round trip is not.", "",
        "| goal | what | measured | ratio | result |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {what} | {measured} | {'' if ratio is None else f'{ratio:.3f}'} | {verdict(ok)} |"
              for n, what, measured, ratio, ok in goals]
    peer_parts = {k: series(k, (p[k] for p in rel.peer)) for k in ("build", "save", "start", "load", "stop", "total")}
    lines += [
        "", "## The realistic product", "",
        f"The example product (`profiles/`, `images/`) renamed `{realistic.PRODUCT}`, its base replaced by "
        f"`{rel.base}` ({gb(rel.base_size)}: `{realistic.DEMO_BASE}` with the unpacked wheel "
        f"`{args.wheel_name}` in `{realistic.SITE}`), and the wheel's `{realistic.LIB}` added to its engine folder "
        f"(`{realistic.ENGINE_LIB}`), then `build.py lock`: a {gb(image_size)} image ({gb(saved)} as saved), a "
        f"{gb(archive_bytes)} archive (ratio {saved / archive_bytes:.2f}). Made by `benchmarks/realistic.py`.", "",
        "Before the rounds, once: the first cold release, whose round trip loads the whole image into the verify "
        "engine, empty (the round trip's scratch engine, kept in the benchmark's own scratch folder), which keeps "
        "the base image from it and holds only that for the rounds, and a cold "
        "release with `--no-seed`. `build.py` keeps its Python bytecode between runs, as a user's Python "
        "does (the first release compiles it). "
        "Each round: the engine back to the bases alone (the last round's images removed, so the cold run is "
        "cold) and the inputs to the cold release's; then the cold release and the same work by hand, "
        "alternating which goes first; then one tune-cache JSON of tp2 changed, `build.py lock` and a release of "
        "a new version as a user makes it, without `--from` (made on the cold release, the newest release at its "
        "`SOURCE_DATE_EPOCH`, as `--from` it would be: the benchmark stops if it was not); then another such change "
        "and `build.py hotfix --from` that release. Once, after the rounds: one more such change and a release made "
        "alone (`--no-from`, every release's path before 2026-12-06); then two releases made `--from` the cold "
        "release, each after one more such change (the first finds the cold release no longer kept in the verify "
        "engine, which kept the last release, and loads it; the second finds it kept with the first).", "",
        "| run | time |", "|---|---|",
        f"| ours, cold: `build.py --profile all --no-cache --no-smoke --version cold --force` | {cold.cell()} |",
        f"| ours, cold, the first release on this base (once, before the rounds: the round trip into the verify "
        f"engine, empty, which keeps the base image from it) | {rel.first.seconds:.2f} s |",
        f"| ours, cold, `--no-seed` (once: the round trip in an empty scratch engine, as by hand) | "
        f"{rel.no_seed.seconds:.2f} s |",
        f"| by hand: `docker build --no-cache` (classic builder, as ours) of the context unibake renders, unpacked "
        f"into a folder | {peer_parts['build'].cell()} |",
        f"| by hand: `docker save IMAGE \\| zstd -T0 -3 \\| tee FILE \\| sha256sum` | {peer_parts['save'].cell()} |",
        f"| by hand: `zstd -dc FILE \\| docker load` into a fresh engine | {peer_parts['load'].cell()} |",
        f"| **by hand, in all** (the issue's sum of the three above; no verification of any kind) | "
        f"{peer_parts['total'].cell()} |",
        f"| not in that sum: the fresh engine started (`unibake.scratch.ScratchEngine`, as ours uses) | "
        f"{peer_parts['start'].cell()} |",
        f"| not in that sum: that engine stopped and its data removed | {peer_parts['stop'].cell()} |",
        f"| ours, after one tune-cache JSON change: `build.py --profile all --no-smoke --version tuneN` (made on the "
        f"cold release) | {tune.cell()} |",
        f"| ours, after one tune-cache JSON change, made alone (once): `build.py --profile all --no-smoke "
        f"--version tunealone --no-from` | {rel.tune_alone.seconds:.2f} s |",
        f"| ours, `build.py hotfix --from tuneN --no-smoke` after one more such change | {hotfix.cell()} |",
        f"| ours, after one tune-cache JSON change, `--from` the cold release when the verify engine no longer kept it "
        f"(once): its round trip loads the cold release first | {rel.fan_first.seconds:.2f} s |",
        f"| ours, a second release made `--from` the cold release (once, right after the one above): the verify "
        f"engine kept the cold release with the first, so it loads only itself | {rel.fan.seconds:.2f} s |",
        f"| ours, the last hotfix's inputs built whole (`build.py --stage build`), the first time: the assembled "
        f"hotfix built only a small image, so the steps above the memo's marker run | {rel.noop_first.seconds:.2f} s |",
        f"| ours, no-op rebuild: the same `build.py --stage build` again, on unchanged inputs | "
        f"{rel.noop.seconds:.2f} s |", "",
        "### Where the time goes", "",
        "Medians of the stage times `build.py` prints in its closing summary (stderr; `--json` and "
        "`--metadata-file` give the release manifest), 0.1 s resolution:", ""]
    lines += stage_table(rel)
    lines += ["", "## The archive stage on two payloads", ""]
    for title, run in (("today's payload (`benchmarks/payload.py`: 60 % random weights, ELF-like libraries, "
                        "Python, JSON)", big),
                       ("the compressible payload (copies of the unpacked wheel: real shared libraries, executables, "
                        "Python, headers; one layer per copy)", libs)):
        ratio = run.info["uncompressed"] / run.info["bytes"]
        lines += [f"### {title[0].upper()}{title[1:]}", "",
                  f"Image `{run.image}`, {run.info['uncompressed']:,} bytes as saved, zstd -3 ratio {ratio:.2f}.", "",
                  "| measurement | time / size |", "|---|---|",
                  f"| `docker save IMAGE > /dev/null` (the engine's export) | {run.save.cell()} |",
                  f"| peer: `docker save \\| zstd -T0 -3 \\| tee FILE \\| sha256sum` | {run.peer.cell()} |",
                  f"| ours: archive stage (compress, diffIDs, canonical writer, the SBOM's reader: "
                  f"{run.info['libraries']} libraries hashed; the stage's own time) and a sha256 of the archive it "
                  f"wrote (the peer's `sha256sum`), the image read {READ[run.info['source']]} (`unibake.layerstore`: "
                  "the storage is the default where it can be read) | "
                  f"{run.ours.cell()} |",
                  f"| ours: the stage alone (a release's round trip reads the archive back and hashes it) | "
                  f"{run.stage.cell()} |",
                  f"| ours: the same stage and sha256 through the engine's save (`--engine-save`) | "
                  f"{run.via_save.cell()} |",
                  f"| peak RSS of our archive stage, {args.size:g} GB | {run.rss.cell('MiB')} |",
                  f"| peak RSS of our archive stage, {args.small:g} GB | {run.small_rss.cell('MiB')} |", ""]
    lines += ["## Other measurements, today's payload", "", "| measurement | time / size |", "|---|---|",
              f"| round trip, shell: `zstd -dc FILE \\| docker load` (fresh engine) | {rt_shell.cell()} |",
              f"| round trip, ours: load + sha256 of both streams, one read (the stage's own time) | "
              f"{rt_ours.cell()} |",
              f"| round trip, ours: the whole command (`python -m benchmarks.roundtrip_once`, with the interpreter's "
              f"start) | {rt_wall.cell()} |",
              f"| compression, level 3 | {comp['default_s']:.2f} s, {comp['default_bytes']:,} bytes "
              f"(ratio {comp['uncompressed'] / comp['default_bytes']:.3f}); peer {big.info['peer_bytes']:,} bytes |",
              f"| compression, level 3 + long-distance matching | {comp['long_s']:.2f} s, {comp['long_bytes']:,} bytes "
              f"(ratio {comp['uncompressed'] / comp['long_bytes']:.3f}) |", "",
              "## Earlier targets (not issue 11's)", "",
              "| target | ratio | result |", "|---|---|---|"]
    lines += [f"| {name} | {value:.3f} | {verdict(ok)} |" for name, value, ok in earlier]
    notes = Path(__file__).with_name("NOTES.md")
    if notes.exists() and not args.quick:  # the analysis of the figures above, kept by hand
        lines += ["", notes.read_text().strip()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=float, default=2.5, help="payload size in GB, both payloads (default 2.5)")
    parser.add_argument("--small", type=float, default=1.0, help="the second size for the RSS check, GB (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measurement (default 3)")
    parser.add_argument("--wheel", default=None, help="the PyTorch CPU wheel (default: the one in /opt/wheels)")
    parser.add_argument("--quick", action="store_true",
                        help="16 MB payloads, a stand-in wheel of a few MB, 1 round: checks every path runs")
    parser.add_argument("--out", default=None,
                        help="where to write the report (default: docs/BENCHMARKS.md; with --quick none, printed only: "
                             "its figures are no measurement)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed at the end)")
    parser.add_argument("--keep-images", action="store_true",
                        help="keep the payload and base images for the next run (everything else is removed)")
    args = parser.parse_args()
    if args.quick:
        args.size, args.small, args.rounds = 0.016, 0.008, 1
    if args.rounds < 1:
        raise SystemExit("error: --rounds must be 1 or more")
    started = time.monotonic()
    args.load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    engine = DockerEngine()
    engine.version()
    before = snapshot(engine)
    made: set[str] = set()  # the payload and base images, which --keep-images keeps
    work = Path(args.work or tempfile.mkdtemp(prefix="unibake-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        wheel = realistic.stand_in_wheel(work) if args.quick else Path(args.wheel or realistic.find_wheel())
        args.wheel_name = wheel.name
        log(f"releases of the realistic product (from {wheel.name}), {args.rounds} rounds")
        rel = measure_releases(engine, work / "releases", wheel, args.rounds, made)
        shutil.rmtree(work / "releases", ignore_errors=True)
        _restore(engine, keeping(before, made if args.keep_images else set()))  # many GB the payloads want
        log(f"payload images ({args.size:g} and {args.small:g} GB), made once and found by tag afterwards")
        big_image, small_image = ensure_image(engine, int(args.size * GB)), ensure_image(engine, int(args.small * GB))
        made.update((big_image, small_image))
        libs_image = realistic.ensure_libs_image(engine, int(args.size * GB), wheel)
        libs_small = realistic.ensure_libs_image(engine, int(args.small * GB), wheel)
        made.update((libs_image, libs_small))
        log(f"archive stage: {big_image}, {args.rounds} rounds")
        big = measure_archive(big_image, small_image, work / "big", args.rounds)
        log("round trip")
        trip = measure_round_trip(work / "big", args.rounds)
        log("compression")
        comp = measure_compression(big_image, work / "big")
        log(f"archive stage: {libs_image}, {args.rounds} rounds")
        libs = measure_archive(libs_image, libs_small, work / "libs", args.rounds)
        text = report(args, engine, big, libs, trip, comp, rel, time.monotonic() - started)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        left = restore(engine, keeping(before, made if args.keep_images else set()))
        if left:  # said here too, in case another error is on its way out
            log(f"error: the benchmark could not remove what it made: {', '.join(left)}")
    if left:
        return 1
    print(text)
    out = args.out or (None if args.quick else ROOT / "docs" / "BENCHMARKS.md")
    if out is not None:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
