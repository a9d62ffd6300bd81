"""The pipeline's stage list and runner, and a whole release of an existing image on fake engines:
inspect, scan, folder, archive, read back into a second engine, smoke gates, publish."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from unibake.console import Reporter
from unibake.engine import RunOutcome
from unibake.errors import DocumentPlaceRefused, PipelineError, VerificationError
from unibake.manifest import load_manifest
from unibake.metadata import METADATA_LABEL, PROFILES_LABEL
from unibake.pipeline import (ARCHIVE, BUILD, HOTFIX, REPRO, STAGES, STOP_AFTER, Request, Stage, check_wiring,
                              run_stages, selection)
from unibake.verify import verify_folder

from ..fake_engine import FakeEngine
from ..savefixtures import DEFAULT_LAYERS
from .test_smoke import metadata, server  # noqa: F401 - the fixture is used by name


class Quiet(Reporter):
    def __init__(self):
        import io
        self.stream = io.StringIO()
        super().__init__(env={"CI": "1"}, stream=self.stream)


@pytest.mark.parametrize("names,stop", [(BUILD, stop) for stop in sorted(STOP_AFTER)] + [
    (HOTFIX, "release"), (ARCHIVE, "release"), (REPRO, "release")], ids=lambda x: x if isinstance(x, str) else x[0])
def test_every_command_is_a_wired_selection_of_the_one_list(names, stop):
    stages = selection(names, stop)
    check_wiring(stages)
    order = [s.name for s in STAGES]
    assert [order.index(s.name) for s in stages] == sorted(order.index(s.name) for s in stages)
    assert all(s.about for s in stages)


def test_a_stage_whose_needs_no_earlier_stage_gives_is_refused_before_anything_runs():
    ran = []
    stages = (Stage(name="a", about="a", needs=("request",), gives=("x",), run=lambda run: ran.append("a") or (1,)),
              Stage(name="b", about="b", needs=("y",), gives=("z",), run=lambda run: (2,)))
    with pytest.raises(PipelineError, match="stage 'b' needs y, which no earlier stage gives"):
        run_stages(stages, Request(env={}, cwd=Path(".")), Quiet())
    assert ran == []


@pytest.mark.parametrize("skip_b", [False, True])
def test_what_a_stage_registers_to_let_go_is_let_go_right_after_that_stage_and_only_then(skip_b):
    """The scratch engine is stopped once the smoke gates are done (run or skipped), while the
    release's last stages run; a selection without that stage leaves it to the stack's exit."""
    events = []

    def a(run):
        run.after("b", lambda: events.append("let go"))
        events.append("a")
        return (1,)

    stages = (Stage(name="a", about="a", needs=("request",), gives=("x",), run=a),
              Stage(name="b", about="b", needs=("x",), gives=("y",), run=lambda run: events.append("b") or (2,),
                    skip=lambda run: "not today" if skip_b else None, on_skip=lambda why: (0,)),
              Stage(name="c", about="c", needs=("y",), gives=("z",), run=lambda run: events.append("c") or (3,)))
    run_stages(stages, Request(env={}, cwd=Path(".")), Quiet())
    assert events == (["a", "let go", "c"] if skip_b else ["a", "b", "let go", "c"])
    events.clear()
    run_stages(stages[:1], Request(env={}, cwd=Path(".")), Quiet())
    assert events == ["a"]


def test_a_skipped_stage_gives_its_placeholder_and_says_why():
    stages = (Stage(name="a", about="a", needs=("request",), gives=("x",), run=lambda run: (1,),
                    skip=lambda run: "not today", on_skip=lambda why: (why,)),
              Stage(name="b", about="b", needs=("x",), gives=("y",), run=lambda run: (run["x"] + "!",)))
    reporter = Quiet()
    results = run_stages(stages, Request(env={}, cwd=Path(".")), reporter)
    assert results["y"] == "not today!"
    assert [(s.name, s.status, s.detail) for s in reporter.stages][0] == ("a", "skipped", "not today")


@pytest.fixture
def engines(server):  # noqa: F811
    """The engine that holds an image unibake built, and a fresh one for the round trip."""
    source = FakeEngine(address="fake://source")
    labels = {METADATA_LABEL: metadata(server.server_port).to_json(), PROFILES_LABEL: "tp1",
              "org.opencontainers.image.version": "1.0", "io.unibake.source-date-epoch": "1700000000"}
    source.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                "history": [{"created_by": "x"}] * 3}, DEFAULT_LAYERS, tag="demo:1.0")
    return {None: source, "fake://verify": FakeEngine(address="fake://verify")}


def release(engines, out: Path, reporter: Reporter | None = None, **kw):
    request = Request(env={}, cwd=out.parent, out=out, image="demo:1.0", verify_engine="fake://verify", **kw)
    return run_stages(selection(ARCHIVE), request, reporter or Quiet(), connect=engines.__getitem__)


@pytest.mark.parametrize("where, said", [
    ("1.0", "inside the release folder"), ("1.0/build.json", "inside the release folder"),
    ("1.0/manifest.json", "inside the release folder"), ("../checksums/1.0.SHA256SUMS", "the checksums record")])
def test_a_metadata_file_in_the_release_folder_the_run_publishes_is_refused_before_the_engine_is_asked(
        engines, tmp_path, where, said):
    # found by probing: `--out OUT --metadata-file OUT/TAG` (or its manifest.json) passed the early check, then
    # failed after the release was published (exit 1, the run's document lost); OUT/TAG/x.json put a file the
    # release does not list into the published folder
    out = tmp_path / "release"
    with pytest.raises(DocumentPlaceRefused, match=f"--metadata-file .*: it is {said} this run publishes"):
        release(engines, out, metadata_file=(out / where).resolve())
    assert not out.exists() and not (tmp_path / "checksums").exists()
    assert engines["fake://verify"].inspect_image("demo:1.0") is None
    assert release(engines, out, metadata_file=out / "build.json")["release"].folder == out / "1.0"


def test_labels_holding_bidi_or_c1_characters_reach_the_notes_and_the_manifest_as_replacement_characters(
        server, tmp_path):  # noqa: F811
    # found by probing: an image's version, revision and created labels (archive IMAGE) went into RELEASE_NOTES.md
    # with U+202E and U+0085 as they were, and into manifest.json with C1 controls: C0 alone was replaced
    source = FakeEngine(address="fake://source")
    labels = {METADATA_LABEL: metadata(server.server_port).to_json(), PROFILES_LABEL: "tp1",
              "org.opencontainers.image.version": "1.0\u202efed\u009b2J",
              "org.opencontainers.image.revision": "abc\u202efed\u0085x",
              "org.opencontainers.image.created": "2026\u2066x\u200b", "io.unibake.source-date-epoch": "1700000000"}
    source.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                "history": [{"created_by": "x"}] * 3}, DEFAULT_LAYERS, tag="demo:1.0")
    folder = release({None: source, "fake://verify": FakeEngine(address="fake://verify")},
                     tmp_path / "release")["release"].folder
    notes = (folder / "RELEASE_NOTES.md").read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    fields = json.dumps({k: v for k, v in manifest.items() if k != "labels"}, ensure_ascii=False)  # (kept as given)
    for hidden in ("\u202e", "\u2066", "\u200b", "\u0085", "\u009b"):
        assert hidden not in notes and hidden not in fields, repr(hidden)
    assert manifest["version"] == "1.0\ufffdfed\ufffd2J" and "abc\ufffdfed\ufffdx" in notes
    assert not verify_folder(folder).failures


def test_a_build_of_a_tag_another_run_builds_on_the_same_engine_into_another_out_is_refused(busybox_product,
                                                                                            tmp_path):
    # found by probing: two runs of one tag under two --out (each holding its own release folder's lock) moved the
    # engine's tag under each other; both failed their checks (exit 3) and left images dangling
    import fcntl
    import hashlib

    from unibake.errors import UnibakeError
    from unibake.plan import make_plan

    from .test_supply_chain import Quiet

    plan = make_plan(busybox_product, cwd=busybox_product.parent)
    engine = FakeEngine(address="fake://shared")
    engine.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]}, "history": []}, [],
               tag=plan.base_image)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    folder = tmp_path / "cache" / "unibake" / "tags"
    folder.mkdir(parents=True)
    lock = folder / (hashlib.sha256(f"fake://shared\0{plan.tag}".encode()).hexdigest()[:32] + ".lock")
    with open(lock, "w") as held:  # the other run, under --out elsewhere
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        request = Request(env=env, cwd=tmp_path, out=tmp_path / "release", config=str(busybox_product),
                          require_lock=False)
        with pytest.raises(UnibakeError, match=f"^another run is building {re.escape(plan.tag)} on the engine at "
                                               r"fake://shared \(pid 4242\), into another --out"):
            run_stages(selection(BUILD), request, Quiet(), connect=lambda address: engine)
    assert engine.inspect_image(plan.tag) is None  # nothing built, nothing tagged
    assert [p.name for p in (tmp_path / "release").iterdir()] == [".0.1.0.lock"]  # (no staging folder left)
    # let go: the next run takes the lock (and gets as far as the fake engine's build)
    with pytest.raises(UnibakeError, match="the fake engine does not build"):
        run_stages(selection(BUILD), request, Quiet(), connect=lambda address: engine)
    # found by review: on a full disk the holder's pid could not be written: "a file: No space left on device" in
    # place of the run (the lock is held all the same, its pid left out)
    import errno

    real_pwrite = os.pwrite

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    os.pwrite = full
    try:
        with pytest.raises(UnibakeError, match="the fake engine does not build"):
            run_stages(selection(BUILD), request, Quiet(), connect=lambda address: engine)
    finally:
        os.pwrite = real_pwrite


def rewrite_manifest(folder: Path, document: dict) -> None:
    """``folder``'s manifest.json written as ``document``, its SHA256SUMS line to match: a folder as
    another unibake (or another time) published it, whole."""
    import hashlib
    import re
    text = json.dumps(document, indent=2) + "\n"
    (folder / "manifest.json").write_text(text)
    sums = folder / "SHA256SUMS"
    sums.write_text(re.sub(r"(?m)^[0-9a-f]{64}(  manifest\.json)$",
                           lambda m: hashlib.sha256(text.encode()).hexdigest() + m.group(1), sums.read_text()))


def test_an_image_unibake_built_is_released_through_every_stage(engines, tmp_path):
    reporter = Quiet()
    results = release(engines, tmp_path / "release", reporter)
    # the gate's line says what of run.sh's docker run its container had, and what not
    assert "tp1: passed (self-check " in reporter.stream.getvalue()
    assert "s); run with ipc host; not given its 1 GPU (the verify engine's host need not have them)\n" \
        in reporter.stream.getvalue(), reporter.stream.getvalue()
    folder = results["release"].folder
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["image_id"] == engines[None].inspect_image("demo:1.0").id
    assert manifest["default_profile"] == "tp1" and manifest["source_date_epoch"] == 1700000000
    validation = json.loads((folder / "VALIDATION.json").read_text())
    assert validation["round_trip"]["engine"] == "fake://verify" and validation["passed"]
    # (the fake verify engine's containers have no process on this host: asked from here, then the address step)
    assert [s["name"] for s in validation["smoke"][0]["steps"]] == ["self-check", "start", "health", "chat", "stability",
                                                                    "address"]
    assert engines["fake://verify"].inspect_image(manifest["image_id"]) is None  # removed from the verify engine
    assert subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=folder).returncode == 0
    assert not verify_folder(folder).failures


def test_a_failing_gate_publishes_nothing(engines, tmp_path):
    engines["fake://verify"].runner = lambda image, args, env: RunOutcome(exit_code=1,
                                                                           output="error: self-check[tp1]: broken\n")
    with pytest.raises(VerificationError, match="smoke gate failed for profile tp1 at step self-check"):
        release(engines, tmp_path / "release")
    assert [p.name for p in (tmp_path / "release").iterdir()] == [".1.0.lock"]


def test_archive_into_an_existing_release_is_refused_before_the_image_is_scanned(engines, tmp_path):
    from unibake.errors import InputError

    out = tmp_path / "release"
    release(engines, out)
    source = engines[None]  # the image now carries a token: a scan would fail, but it must not be reached
    config = json.loads(source.images[source.tags["demo:1.0"]].config)
    config["config"]["Env"].append("HF_TOKEN=hf_" + "AbCdEfGhIj" * 4)
    source.add(config, source.images[source.tags["demo:1.0"]].layers, tag="demo:1.0")
    with pytest.raises(InputError, match=r"release .*/1\.0 already exists; use --force"):
        release(engines, out)


@pytest.mark.parametrize("recorded", [True, False], ids=["first-release-recorded", "older-release"])
def test_a_force_re_release_keeps_when_the_release_was_first_published(engines, tmp_path, recorded, cli):
    # (before: the manifest recorded only when its folder was published: prune and previous_release
    # took 1.0 made again after 2.0 for the newer)
    out = tmp_path / "release"
    release(engines, out)
    path = out / "1.0" / "manifest.json"
    first = json.loads(path.read_text())
    assert first["first_published"] == first["published"]
    first["published"] = first["first_published"] = "2026-01-01T00:00:01Z"  # long ago
    if not recorded:  # a release made before the time was recorded
        del first["first_published"]
    rewrite_manifest(out / "1.0", first)
    release(engines, out, force=True)
    again = json.loads(path.read_text())
    assert again["first_published"] == "2026-01-01T00:00:01Z" < again["published"]
    # releases --json shows it beside published (it showed published only)
    listed = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert [(r["published"], r["first_published"]) for r in listed] == [(again["published"], "2026-01-01T00:00:01Z")]


def test_a_folder_planted_where_the_checksums_record_goes_is_refused_before_the_work(engines, tmp_path):
    # (before: the whole run went on, the release was published, then the record could not be renamed over
    # the folder: exit 1, "was published, but its checksums record ... was not written (Is a directory)")
    from unibake.errors import InputError
    planted = tmp_path / "checksums" / "1.0.SHA256SUMS"
    planted.mkdir(parents=True)
    with pytest.raises(InputError, match=rf"^{planted} is a folder where this release's checksums record goes"):
        release(engines, tmp_path / "release")
    assert os.listdir(tmp_path / "release") == [".1.0.lock"] and planted.is_dir()
    assert engines["fake://verify"].images == {}  # nothing was loaded: the run stopped at its folder


def test_without_the_round_trip_the_archive_is_still_read_back_and_the_gates_skipped(engines, tmp_path):
    results = release(engines, tmp_path / "release", roundtrip=False)
    validation = results["release"].validation
    assert validation.round_trip is None and validation.round_trip_skipped == "skipped with --no-roundtrip"
    assert validation.smoke == () and "round trip was skipped" in validation.smoke_skipped
    assert engines["fake://verify"].loads == 0


def test_with_no_smoke_the_round_trip_still_runs_and_only_the_gates_are_skipped(engines, tmp_path):
    results = release(engines, tmp_path / "release", smoke=False)
    validation = results["release"].validation
    assert validation.round_trip is not None and validation.round_trip_skipped is None
    assert validation.round_trip.image_id == engines[None].inspect_image("demo:1.0").id
    assert validation.smoke == () and validation.smoke_skipped == "skipped with --no-smoke"
    assert engines["fake://verify"].loads == 1
    notes = (results["release"].folder / "RELEASE_NOTES.md").read_text()
    assert "Smoke gates: not run (skipped with --no-smoke)." in notes


def test_the_revision_is_dirty_for_changed_sources_but_not_for_what_a_run_wrote(tmp_path):
    from unibake.pipeline import git_revision

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    for name in ("profiles/product.yaml", "release/1.0/manifest.json", "checksums/1.0.SHA256SUMS"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("one\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").strip()
    outputs = (tmp_path / "release", tmp_path / "checksums")
    root = tmp_path / "profiles"
    assert git_revision(root, outputs) == head
    # a run rewrote the tracked release folder and its checksums: still the same sources
    (tmp_path / "release/1.0/manifest.json").write_text("two\n")
    (tmp_path / "checksums/1.0.SHA256SUMS").write_text("two\n")
    assert git_revision(root, outputs) == head
    assert git_revision(root) == head + "-dirty"  # without outputs every tracked change counts
    git("mv", "release/1.0", "release/1.1")  # a rename inside the outputs: both paths are outputs
    assert git_revision(root, outputs) == head
    (tmp_path / "profiles/product.yaml").write_text("two\n")
    assert git_revision(root, outputs) == head + "-dirty"
    assert git_revision(tmp_path / "missing") == "unknown"  # no folder, no repository: said, not guessed


class _Run:
    """What the release-tag hook reads of a run: the engine, the reporter, its results."""

    def __init__(self, engine, results):
        import io

        self.engine, self.results = engine, results
        self.reporter = Reporter(env={"CI": "1"}, stream=io.StringIO())

    def get(self, name):
        return self.results.get(name)

    def __getitem__(self, name):
        return self.results[name]


@pytest.mark.parametrize("case", ["failed, the tag named an image before", "failed, the tag named nothing",
                                  "failed after the release was published", "succeeded"])
def test_the_release_tag_never_names_an_image_that_was_not_released(tmp_path, case):
    from types import SimpleNamespace

    from unibake.builder import cache_ref
    from unibake.pipeline import _release_tag_on_failure
    from unibake.platforms import KNOWN

    engine = FakeEngine()
    old = engine.add({"created": "old"}, [b"old"], tag="demo:1.0") if "named nothing" not in case else None
    new = engine.add({"created": "new"}, [b"new"], tag="demo:1.0")  # the build moved the tag
    folder = SimpleNamespace(committed="published" in case)
    # (an arm64 selection's name holds its platform: the failed build is kept as all-arm64-failed, as the builder
    # keeps one, not all-arm64-failed-arm64 beside it)
    run = _Run(engine, {"folder": folder, "context": SimpleNamespace(selection="all-arm64")})
    plan = SimpleNamespace(tag="demo:1.0", product="demo", platform=KNOWN["linux/arm64"])
    hook = _release_tag_on_failure(run, plan, old, [SimpleNamespace(image_id=new, replaced=old)])
    failed = case.startswith("failed")
    hook(RuntimeError if failed else None, RuntimeError("smoke gate failed") if failed else None, None)
    tag = engine.inspect_image("demo:1.0")
    if case == "failed, the tag named an image before":  # the old release's tag and image, as they were
        assert tag.id == old
        assert engine.inspect_image(cache_ref("demo", "all-arm64", "failed")).id == new
    elif case == "failed, the tag named nothing":
        assert tag is None and engine.inspect_image(cache_ref("demo", "all-arm64", "failed")).id == new
    else:  # published (even if clean-up failed after) or succeeded: the tag stays, the image it replaced goes
        assert tag.id == new and engine.inspect_image(old) is None
        assert engine.inspect_image(cache_ref("demo", "all-arm64", "failed")) is None


def test_the_rendered_copies_a_build_rewrote_do_not_make_the_next_run_of_the_same_commit_dirty(busybox_product):
    # a build rewrites the tracked dockerfiles/rendered/ copies (a new version's labels); a hotfix or a
    # --force run of that same commit then recorded '<commit>-dirty' in its manifest, provenance and notes
    from unibake.cli import Context, _request, build_parser, with_command

    root = busybox_product.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout

    def revision(*argv: str) -> str:
        args = build_parser().parse_args(with_command([*argv, "--config", str(busybox_product)]))
        return _request(args, Context(env={}, cwd=root, reporter=Quiet())).revision

    rendered = root / "dockerfiles/rendered/all/Dockerfile"
    rendered.parent.mkdir(parents=True)
    rendered.write_text("FROM the last release's version\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").strip()
    rendered.write_text("FROM this release's version\n")  # what the build of this commit wrote
    assert revision("build") == revision("hotfix", "--from", "0.1.0", "--version", "0.1.1") == head
    (busybox_product / "product.yaml").write_text((busybox_product / "product.yaml").read_text() + "\n")
    assert revision("build") == head + "-dirty"  # a source changed: still said


def test_a_force_re_release_follows_the_release_before_its_first_release_not_a_newer_version(engines, tmp_path):
    # (before: 1.0 made again with --force after 2.0 followed 2.0: its notes listed 2.0 -> 1.0 as the
    # changes and rolled back to 2.0, the newer version; the first 1.0 followed 0.9)
    import shutil
    out = tmp_path / "release"
    release(engines, out)
    path = out / "1.0" / "manifest.json"
    first = json.loads(path.read_text())
    for release_, published in (("0.9", "2026-01-01T00:00:00Z"), ("1.0", "2026-01-02T00:00:00Z"),
                                ("2.0", "2026-02-01T00:00:00Z")):
        if release_ != "1.0":
            shutil.copytree(out / "1.0", out / release_)
        other = {**first, "release": release_, "tag": f"demo:{release_}", "version": release_,
                 "published": published, "first_published": published}
        rewrite_manifest(out / release_, other)
    release(engines, out, force=True)
    again = json.loads(path.read_text())
    assert again["first_published"] == "2026-01-02T00:00:00Z" and again["previous"] == "0.9"


@pytest.mark.parametrize("forged", ["2099-01-01T00:00:00Z", "zzz", "2026-01-01T00:00:00+05:00"],
                         ids=["after-its-published", "not-a-time", "another-zone"])
def test_a_force_re_release_does_not_carry_over_a_first_published_that_is_no_utc_time_before_its_published(
        engines, tmp_path, forged):
    # (before: a hand-edited first_published, which the old folder's own sums refused, was carried over
    # into the new release and signed with it: ranked as text, 'zzz' or 2099 made 1.0 the newest version
    # for prune for ever, and verify passed it)
    out = tmp_path / "release"
    release(engines, out)
    path = out / "1.0" / "manifest.json"
    first = json.loads(path.read_text())
    first["first_published"] = forged
    path.write_text(json.dumps(first, indent=2) + "\n")
    with pytest.raises(VerificationError, match="first_published"):
        load_manifest(out / "1.0")  # listed by releases as unreadable, not ranked as text
    release(engines, out, force=True)
    again = json.loads(path.read_text())
    assert again["first_published"] == again["published"] != forged


@pytest.mark.parametrize("tamper", ["manifest", "sums", "no-sums"])
def test_a_force_re_release_does_not_carry_over_a_first_published_from_a_folder_that_does_not_check_out(
        engines, tmp_path, tamper):
    # (before: a well-formed but forged first_published, written into the folder after it was published
    # (its own SHA256SUMS no longer lists that manifest), was carried into the new, signed release:
    # 2000 made 1.0 the oldest version for prune and previous_release for ever)
    out = tmp_path / "release"
    release(engines, out)
    path = out / "1.0" / "manifest.json"
    first = json.loads(path.read_text())
    first["published"] = first["first_published"] = "2000-01-01T00:00:00Z"
    if tamper == "manifest":
        path.write_text(json.dumps(first, indent=2) + "\n")
    else:
        rewrite_manifest(out / "1.0", first)
        if tamper == "sums":  # the manifest's own line gone
            sums = out / "1.0" / "SHA256SUMS"
            sums.write_text("".join(line for line in sums.read_text().splitlines(True) if "manifest.json" not in line))
        else:
            (out / "1.0" / "SHA256SUMS").unlink()
    reporter = Quiet()
    release(engines, out, reporter=reporter, force=True)
    again = json.loads(path.read_text())
    assert again["first_published"] == again["published"] > "2026"
    said = reporter.stream.getvalue()
    assert f"{out / '1.0'}: when the release it replaces was first published is not carried over" in said
    assert "SHA256SUMS" in said


def test_a_force_re_release_of_a_release_made_by_a_clock_ahead_of_this_one_is_made(engines, tmp_path):
    # a release first published by a machine whose clock ran ahead (2099): its time, later than now, is
    # no first release of the new one (before the clamp: 'cannot describe the release', the run failed)
    out = tmp_path / "release"
    release(engines, out)
    path = out / "1.0" / "manifest.json"
    first = json.loads(path.read_text())
    first["published"] = first["first_published"] = "2099-01-01T00:00:00Z"
    rewrite_manifest(out / "1.0", first)
    release(engines, out, force=True)
    again = json.loads(path.read_text())
    assert again["first_published"] == again["published"] < "2099"


@pytest.mark.parametrize("kind", ["minisign", "openpgp"])
def test_a_signed_force_re_release_carries_over_first_published_only_from_a_sums_its_key_signed(
        engines, tmp_path, kind, minisign_key, gpg_home):
    """Whoever can rewrite both manifest.json and SHA256SUMS of the signed folder a --force run replaces forged the
    first_published it carried over (2000: 1.0 the oldest version for prune and previous_release for ever); a
    signed run now carries it only from the SHA256SUMS its own key signed."""
    env, _ = gpg_home
    sign = dict(sign="signer@example.invalid") if kind == "openpgp" else dict(sign_minisign=minisign_key[0])

    def release(engines, out, reporter=None, **kw):  # with the keyring's environment
        request = Request(env=env, cwd=out.parent, out=out, image="demo:1.0", verify_engine="fake://verify", **kw)
        return run_stages(selection(ARCHIVE), request, reporter or Quiet(), connect=engines.__getitem__)

    out = tmp_path / "release"
    release(engines, out, **sign)
    path = out / "1.0" / "manifest.json"
    first = json.loads(path.read_text())
    first["published"] = first["first_published"] = "2000-01-01T00:00:00Z"
    rewrite_manifest(out / "1.0", first)  # the signature of SHA256SUMS no longer holds
    reporter = Quiet()
    release(engines, out, reporter=reporter, force=True, **sign)
    again = json.loads(path.read_text())
    assert again["first_published"] == again["published"] > "2026"
    said = reporter.stream.getvalue()
    assert f"{out / '1.0'}: when the release it replaces was first published (2000-01-01T00:00:00Z) is not carried " \
           "over: its SHA256SUMS is not signed by this run's key (SHA256SUMS." in said
    kept = again["first_published"]  # a folder its key signed: carried over, without a word
    reporter = Quiet()
    release(engines, out, reporter=reporter, force=True, **sign)
    assert json.loads(path.read_text())["first_published"] == kept
    assert "not carried over" not in reporter.stream.getvalue()


def _released_with_a_skipped_gate(port: int, out, reporter) -> tuple[dict, list]:
    """Release 1.0 of profiles tp1 and tp2, tp2 with ``smoke.skip``: the run's results and the profiles
    whose engine started in the verify engine."""
    from unibake.metadata import ImageMetadata

    document = metadata(port).model_dump()
    document["profiles"]["tp2"] = {**document["profiles"]["tp1"], "smoke": {
        **document["profiles"]["tp1"]["smoke"], "skip": "needs 4 nodes with RDMA; gated on the cluster"}}
    skipping = ImageMetadata.model_validate(document, strict=False)
    source = FakeEngine(address="fake://source")
    labels = {METADATA_LABEL: skipping.to_json(), PROFILES_LABEL: "tp1,tp2",
              "org.opencontainers.image.version": "1.0", "io.unibake.source-date-epoch": "1700000000"}
    source.add({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"], "Labels": labels},
                "history": [{"created_by": "x"}] * 3}, DEFAULT_LAYERS, tag="demo:1.0")
    verify = FakeEngine(address="fake://verify")
    started: list = []
    verify.starter = lambda container: started.append(container.env["PROFILE"])
    return release({None: source, "fake://verify": verify}, out, reporter), started


def test_a_profile_whose_smoke_skip_says_why_is_released_with_its_gate_shown_skipped_never_passed(server, tmp_path,  # noqa: F811
                                                                                                   cli):
    reporter = Quiet()
    results, started = _released_with_a_skipped_gate(server.server_port, tmp_path / "release", reporter)
    assert started == ["tp1"]  # tp2's engine never started
    folder = results["release"].folder
    validation = json.loads((folder / "VALIDATION.json").read_text())
    gates = {g["profile"]: g for g in validation["smoke"]}
    assert gates["tp1"]["passed"] and gates["tp1"]["skipped"] is None
    assert gates["tp2"] == {"profile": "tp2", "steps": [], "chats": [], "restart_count": None, "oom_killed": None,
                            "skipped": "needs 4 nodes with RDMA; gated on the cluster", "passed": False}
    assert validation["passed"] is False  # not every gate ran: never said to have passed them all
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["profiles"]["tp2"]["smoke"]["skip"] == "needs 4 nodes with RDMA; gated on the cluster"
    notes = (folder / "RELEASE_NOTES.md").read_text()
    assert "| `tp2` | - | - | - | - | - | - | **SKIPPED**: `needs 4 nodes with RDMA; gated on the cluster` |" in notes
    assert "**Not every gate ran**: `tp2` was\nreleased without a smoke gate" in notes
    assert "smoke gate of profile tp2 SKIPPED (its smoke.skip: needs 4 nodes with RDMA; gated on the cluster)" \
        in reporter.stream.getvalue()
    assert not verify_folder(folder).failures
    verified = cli("verify", str(folder))
    assert verified.code == 0, verified.err
    assert "profile tp2 was released without its smoke gate (smoke.skip: needs 4 nodes with RDMA; gated on the " \
           "cluster)" in verified.err
    assert json.loads(cli("verify", str(folder), "--json").out)["smoke_skipped"] == {
        "tp2": "needs 4 nodes with RDMA; gated on the cluster"}


def test_releases_shows_a_release_whose_gate_was_skipped_with_the_profile_and_its_reason(server, tmp_path,  # noqa: F811
                                                                                        cli):
    # (before: the table and --json said only "verifies", as for a release whose every gate ran)
    out = tmp_path / "release"
    _released_with_a_skipped_gate(server.server_port, out, Quiet())
    listed = cli("releases", "--out", str(out))
    assert listed.code == 0, listed.err
    assert listed.error_lines == []
    assert "warning: release 1.0: profile tp2 was released without its smoke gate (smoke.skip: needs 4 nodes with " \
           "RDMA; gated on the cluster)" in listed.err
    header, row = [line.split() for line in listed.err.splitlines() if line.startswith("  ")][:2]
    assert header[-2:] == ["gates", "skipped"] and row[0] == "1.0" and row[-2:] == ["verifies", "tp2"]
    [record] = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert record["state"] == "verifies"
    assert record["smoke_skipped"] == {"tp2": "needs 4 nodes with RDMA; gated on the cluster"}


@pytest.mark.parametrize("skipped", [{"smoke": False}, {"roundtrip": False}])
def test_releases_shows_a_release_made_without_any_gate_with_every_profile_and_why(engines, tmp_path, cli, skipped):
    # (before: a --no-smoke or --no-roundtrip release was listed "verifies", as one whose every gate ran)
    out = tmp_path / "release"
    release(engines, out, **skipped)
    listed = cli("releases", "--out", str(out))
    assert listed.code == 0 and listed.error_lines == [], listed.err
    why = "skipped with --no-smoke" if "smoke" in skipped else \
        "they run on the loaded image, and the round trip was skipped"
    assert f"warning: release 1.0: profile tp1 was released without its smoke gate (no gate ran: {why})" \
        in listed.err
    [record] = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert record["state"] == "verifies" and record["smoke_skipped"] == {"tp1": why}
    verified = cli("verify", str(out / "1.0"))  # as verify says it too (before: no word)
    assert verified.code == 0 and f"warning: profile tp1 was released without its smoke gate (no gate ran: {why})" \
        in verified.err, verified.err
    assert json.loads(cli("--json", "verify", str(out / "1.0")).out)["smoke_skipped"] == {"tp1": why}


def test_releases_shows_no_skipped_gate_for_a_release_whose_gates_all_ran(engines, tmp_path, cli):
    out = tmp_path / "release"
    release(engines, out)
    listed = cli("releases", "--out", str(out))
    assert listed.code == 0 and "warning" not in listed.err and "gates skipped" not in listed.err, listed.err
    [record] = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert record["state"] == "verifies" and record["smoke_skipped"] == {}
