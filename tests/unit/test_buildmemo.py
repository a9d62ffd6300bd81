"""The build memo's cut of the rendered Dockerfile (pure): where it falls, what each side reads, and
the Dockerfile of the part below it."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

from unibake.builder import build_image
from unibake.buildmemo import MARKER, Memo, instructions, split, upper_context
from unibake.engine import BuildOutcome, BuildStep
from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.render import render

from ..conftest import REPO, terminated_as_the_cli
from ..fake_engine import FakeEngine

LOWER = "sha256:" + "a" * 64
STAGE = "sha256:" + "b" * 64
KEY = b"k" * 32  # the user's key of the memos' HMAC


def demo():
    return render(make_plan(REPO / "profiles", profiles=["all"], cwd=REPO))


def test_the_cut_falls_below_the_prebuilt_kernels_and_above_the_tune_caches():
    context = demo()
    cut = split(context.dockerfile)
    assert cut is not None and cut.stages == ("kernels",)
    assert cut.bases == ("localhost/unibake-demo-builder:bookworm", "localhost/unibake-demo-base:bookworm")
    low = instructions(cut.lower)
    assert low[-3:] == ["COPY ctx/prebuilt/ /opt/unibake/", 'ENTRYPOINT ["/opt/unibake/meta/entrypoint.sh"]',
                        'CMD ["serve"]'] and len(low) == cut.lower_steps
    assert "ctx/engine/" in cut.lower_sources and "ctx/prebuilt/" in cut.lower_sources
    assert cut.upper_sources == ("ctx/overlays/", "ctx/upper/")
    # every instruction of the whole Dockerfile is on one side or the other
    assert instructions(cut.lower) + instructions(cut.upper) == instructions(context.dockerfile)


def test_the_upper_context_builds_from_the_recorded_images_with_only_what_it_reads():
    context = demo()
    cut = split(context.dockerfile)
    upper = upper_context(context, cut, Memo(key="k", lower=LOWER, stages=(STAGE,)))
    steps = instructions(upper.dockerfile)
    assert steps[0] == f"FROM {LOWER}" and steps[1:] == [
        s.replace("--from=kernels ", f"--from={STAGE} ") for s in instructions(cut.upper)]
    names = {f.name for f in upper.files}
    assert "Dockerfile" in names and any(n.startswith("ctx/upper/profiles/") for n in names)
    assert not any(n.startswith(("ctx/engine/", "ctx/kernels/", "ctx/prebuilt/", "ctx/sidecars/")) for n in names)
    dockerfile = next(f for f in upper.files if f.name == "Dockerfile")
    assert dockerfile.read().decode() == upper.dockerfile


def test_a_dockerfile_the_memo_cannot_cut_cleanly_is_built_whole():
    text = demo().dockerfile
    assert split(text.replace(MARKER + "\n", "")) is None  # no marker
    assert split(text + MARKER + "\n") is None  # two
    assert split(text.replace(MARKER, MARKER + "\nFROM busybox AS late")) is None  # a stage below it
    assert split(text.replace("COPY --from=kernels /out/kernels.sha256", "COPY --from=elsewhere /out/kernels.sha256")) \
        is None  # an image that is not a builder stage
    assert split(text.replace("COPY ctx/prebuilt/ /opt/unibake/\n", "")) is not None


def test_instructions_join_continuations_and_skip_comments():
    text = "# c\nFROM a AS b\n\nRUN x \\\n    y\n# d\nCOPY p q\n"
    assert instructions(text) == ["FROM a AS b", "RUN x y", "COPY p q"]


class BuildingEngine(FakeEngine):
    """A fake engine that builds: one image per instruction of the Dockerfile it is sent, none cached."""

    def build(self, context, *, tag, buildargs, nocache, on_line, platform=None) -> BuildOutcome:
        with tarfile.open(fileobj=context) as tar:
            dockerfile = tar.extractfile("Dockerfile").read().decode()
        steps, image_id = [], ""
        for n, text in enumerate(instructions(dockerfile), 1):
            image_id = self.add({"step": n, "dockerfile": dockerfile}, [f"{n}{dockerfile}".encode()])
            steps.append(BuildStep(number=n, instruction=text, cached=False, image=image_id[7:19]))
        self.tags[tag] = image_id
        return BuildOutcome(image_id=image_id, steps=tuple(steps))


def test_a_memo_build_counts_as_memoised_only_steps_it_counts_as_cached(busybox_product, tmp_path):
    # the memo's part holds FROM lines, which no build reports as cached: counted as memoised, they
    # made the summary say "1 of 8 steps from the build cache (2 of them from the build memo)"
    engine = BuildingEngine()
    engine.add({"architecture": "amd64", "os": "linux"}, [b"base"], tag="localhost/unibake-busybox:1")
    memo = tmp_path / "memo"
    build = dict(engine=engine, product="unibake-test", revision="r", epoch=1700000000, memo=memo, memo_key=KEY)
    first = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert first.memoised == 0 and first.cached_steps == 0
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text().replace("Tree", "Ring"))
    second = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert second.memoised == second.cached_steps == 3  # the engine's COPY, ENTRYPOINT, CMD above the marker; not FROM


def test_a_line_separator_in_a_value_does_not_move_the_cut(demo_product):
    """U+2028 or U+0085 in a kernel's build.run ends no line for the engine, which counts steps at "\\n":
    read as a line end, the steps above the marker were one too many, and the memo recorded the image of
    the tune caches' COPY below it (a tune cache removed since stayed in the next image)."""
    product = demo_product / "product.yaml"
    text = product.read_text()
    plain = render(make_plan(demo_product, cwd=demo_product.parent, verify_lock=False)).dockerfile
    run = next(line for line in text.split("\n") if line.strip().startswith("run: "))
    for separator in ("\u2028", "\u0085", "\u2029"):
        command = yaml.safe_load(run.strip())["run"] + f" # built by ci{separator}see notes"
        product.write_text(text.replace(run, run.split("run: ")[0] + "run: " + json.dumps(command)))  # escaped
        if separator == "\u0085":  # a C1 control: refused at the plan now, as every control character is
            with pytest.raises(InputError, match=r"key 'kernels\[\d+\]\.build\.run' contains a control character"):
                make_plan(demo_product, cwd=demo_product.parent, verify_lock=False)
            continue
        dockerfile = render(make_plan(demo_product, cwd=demo_product.parent, verify_lock=False)).dockerfile
        assert separator in dockerfile
        assert split(dockerfile).lower_steps == split(plain).lower_steps == len(instructions(plain.split(MARKER)[0]))
        assert len(instructions(dockerfile)) == len(instructions(plain))


def test_a_step_line_holding_a_line_separator_is_one_step_of_the_build_stream():
    """The engine echoes each step ("Step 3/9 : RUN ...") on one line; a U+2028 in the RUN (a build.run)
    cut it, and its rest was read as the step's output: the failing kernel was named '%s', with the RUN's
    own text as the compiler's error."""
    from unibake.docker_engine import DockerEngine
    from unibake.errors import BuildFailed

    run = ("RUN set -eu; if ! sh -c 'make # ci\u2028note' >/tmp/log 2>&1; then printf 'error: kernel-build[%s]: %s\\n' "
           "rope \"$(cat /tmp/log)\"; exit 1; fi")
    events = [{"stream": "Step 1/2 : FROM base AS kernels\n"}, {"stream": " ---> " + "1" * 12 + "\n"},
              {"stream": f"Step 2/2 : {run}\n"}, {"stream": " ---> Running in 0123\n"},
              {"stream": "error: kernel-build[rope]: rope.cpp:3: error: expected ';'\n"},
              {"error": "The command returned a non-zero code: 1"}]

    class API:  # what docker-py's APIClient.build yields, decoded
        def build(self, **kwargs):
            return iter(events)

    engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the stream above
    engine.address, engine.api = "fake://", API()
    with pytest.raises(BuildFailed) as failed:
        engine.build(None, tag="t:1", buildargs={}, nocache=False, on_line=lambda line: None)
    assert failed.value.step == f"Step 2: {run}"
    assert [line for line in failed.value.output if "kernel-build" in line] == [
        "error: kernel-build[rope]: rope.cpp:3: error: expected ';'"]


def test_the_classic_builders_colour_around_a_run_steps_stderr_is_not_shown_as_escapes():
    """Engine 20.10 wraps what a RUN writes to stderr in "\\x1b[91m" ... "\\x1b[0m": every failed check's
    or compiler's line was shown as "\\x1b[91merror: ...", and the reset as a line of its own."""
    from unibake.console import Reporter
    from unibake.docker_engine import DockerEngine
    from unibake.errors import BuildFailed

    events = [{"stream": "Step 1/2 : FROM base\n"}, {"stream": " ---> " + "1" * 12 + "\n"},
              {"stream": "Step 2/2 : RUN self-check\n"}, {"stream": " ---> Running in 0123\n"},
              {"stream": "self-check[tp1]: ok: platform\n"},
              {"stream": "\x1b[91merror: self-check[tp1]: python3 is not in the image\n\x1b[0m"},
              {"error": "The command returned a non-zero code: 1"}]

    class API:  # what docker-py's APIClient.build yields, decoded
        def build(self, **kwargs):
            return iter(events)

    out = io.StringIO()
    reporter = Reporter(env={"CI": "true"}, stream=out)
    engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the stream above
    engine.address, engine.api = "fake://", API()
    with pytest.raises(BuildFailed) as failed:
        engine.build(None, tag="t:1", buildargs={}, nocache=False, on_line=reporter.build_line)
    assert failed.value.output[-2:] == ("self-check[tp1]: ok: platform",
                                        "error: self-check[tp1]: python3 is not in the image")
    assert "\\x1b" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert "    error: self-check[tp1]: python3 is not in the image\n" in out.getvalue()


# Engine 20.10's build stream, as recorded (docker-py, decoded) for a Dockerfile of two stages whose step 6 RUN
# prints the engine's own lines: the RUN's output comes in the same "stream" events as the engine's
def _recorded_stream(step6_output: list[str]) -> list[dict]:
    def step(n, text):
        return [{"stream": f"Step {n}/7 : {text}"}, {"stream": "\n"}]

    def container(cid, output, image):
        return ([{"stream": f" ---> Running in {cid}\n"}] + [{"stream": o} for o in output] +
                [{"stream": f"Removing intermediate container {cid}\n"}, {"stream": f" ---> {image}\n"}])

    return [*step(1, "FROM localhost/unibake-busybox:1 AS one"), {"stream": " ---> a483e8fbfa2e\n"},
            *step(2, "RUN echo hi"), *container("c7da109668f6", ["hi\n"], "d1d9868a7071"),
            {"aux": {"ID": "sha256:d1d9868a707143f2af19ffc254a296070e93b76db6906e590db22725bbbd58bc"}},
            *step(3, "FROM localhost/unibake-busybox:1"), {"stream": " ---> a483e8fbfa2e\n"},
            *step(4, "ENV A=1"), *container("0d171cd90b66", [], "abc4668892bf"),
            *step(5, "COPY Dockerfile /x"), {"stream": " ---> 7700763ae873\n"},
            *step(6, "RUN ./test.sh"), *container("0483ff53ea4a", step6_output, "ad48d24a564f"),
            *step(7, "RUN true"), *container("29d1226d534b", [], "f7e6c9eaa87f"),
            {"aux": {"ID": "sha256:f7e6c9eaa87f673d652b6f01ebaf6039c2e3a6fa65046343576b9d99db4dafc8"}},
            {"stream": "Successfully built f7e6c9eaa87f\n"}, {"stream": "Successfully tagged probe:1\n"}]


def _parse(events: list[dict]) -> BuildOutcome:
    from unibake.docker_engine import DockerEngine

    class API:  # what docker-py's APIClient.build yields, decoded
        def build(self, **kwargs):
            return iter(events)

    engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the stream above
    engine.address, engine.api = "fake://", API()
    return engine.build(None, tag="probe:1", buildargs={}, nocache=False, on_line=lambda line: None)


def test_a_run_step_printing_step_lines_of_another_build_fakes_no_step():
    """A RUN whose output holds "Step N/M :" lines (a nested build's log, a test printing one) was read as the
    engine's steps: their numbers, images and "Using cache" were recorded (the memo could record the image
    a RUN printed as the image of the step above its marker)."""
    outcome = _parse(_recorded_stream(["Step 7/7 : RUN true\n", " ---> 0123456789ab\n", " ---> Using cache\n",
                                       "Step 3/7 : FROM evil AS x\n", " ---> Running in 29d1226d534b\n",
                                       "Step 1/2 : FROM other\n"]))
    assert [(s.number, s.instruction, s.cached, s.image) for s in outcome.steps] == [
        (1, "FROM localhost/unibake-busybox:1 AS one", False, "a483e8fbfa2e"),
        (2, "RUN echo hi", False, "d1d9868a7071"), (3, "FROM localhost/unibake-busybox:1", False, "a483e8fbfa2e"),
        (4, "ENV A=1", False, "abc4668892bf"), (5, "COPY Dockerfile /x", False, "7700763ae873"),
        (6, "RUN ./test.sh", False, "ad48d24a564f"), (7, "RUN true", False, "f7e6c9eaa87f")]
    assert outcome.stage_images == ("d1d9868a7071",)
    assert outcome.image_id == "sha256:f7e6c9eaa87f673d652b6f01ebaf6039c2e3a6fa65046343576b9d99db4dafc8"


def test_a_run_step_imitating_the_engines_end_of_its_own_container_is_refused():
    """A RUN knows its container's ID (its host name): printing "Removing intermediate container <it>", then a
    step image and the next step, it ended its own output for the parser. What it printed is found when the
    engine's own line for that container comes: the build is refused, not recorded with a faked step."""
    from unibake.errors import EngineError

    forged = ["Removing intermediate container 0483ff53ea4a\n ---> 0123456789ab\nStep 7/7 : RUN fake\n"]
    with pytest.raises(EngineError, match=r"^the build of probe:1 finished, but a step's output imitated the "
                                          r"engine's own lines \('Removing intermediate container 0483ff53ea4a'\)"):
        _parse(_recorded_stream(forged))
    reopened = forged + [" ---> Running in 0483ff53ea4a\n"]  # and opened "its" container again
    with pytest.raises(EngineError, match=r"imitated the engine's own lines \(' ---> Running in 0483ff53ea4a'\)"):
        _parse(_recorded_stream(reopened))


def test_a_base_with_onbuild_triggers_makes_the_memo_digest_every_context_file(busybox_product, tmp_path):
    """A base's ONBUILD COPY runs in the FROM step above the marker and reads context files no COPY line there
    names: a profile changed since (a file only the part below the marker was thought to read) gave the same
    inputs digest, and the memo's image, holding the old file, was built on."""
    engine = BuildingEngine()
    engine.add({"architecture": "amd64", "os": "linux", "config": {"OnBuild": ["COPY ctx/ /onbuild/"]}}, [b"base"],
               tag="localhost/unibake-busybox:1")
    build = dict(engine=engine, product="unibake-test", revision="r", epoch=1700000000, memo=tmp_path / "memo",
                 memo_key=KEY)
    first = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert first.memoised == 0
    again = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert again.memoised == 3  # nothing changed: the memo still serves (the COPY, ENTRYPOINT and CMD)
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text().replace("Tree", "Ring"))
    changed = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert changed.memoised == 0  # the trigger's COPY read the changed profile: the whole Dockerfile is built


def test_a_memo_file_a_checkout_brought_naming_an_image_of_its_choice_is_not_built_on(busybox_product, tmp_path):
    """The memo lives in the project (.cache/build-memo/): a checkout holding one, with the inputs digest (made of
    what the checkout itself holds and the public base's ID) and an image the engine holds (an older release, its
    ID in its manifest), had the build go on FROM that image. A memo carries an HMAC under the user's key now."""
    import json as _json

    from unibake import buildmemo

    engine = BuildingEngine()
    engine.add({"architecture": "amd64", "os": "linux"}, [b"base"], tag="localhost/unibake-busybox:1")
    old = engine.add({"architecture": "amd64", "os": "linux", "old": 1}, [b"old release"], tag="unibake-test:0.9")
    context = render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path))
    cut = split(context.dockerfile)
    memo = tmp_path / "memo"
    memo.mkdir()
    planted = {"version": buildmemo.VERSION, "key": buildmemo.inputs_digest(context, cut, engine, None), "lower": old,
               "stages": [old] * len(cut.stages)}
    for mac in ({}, {"mac": "0" * 64}, {"mac": buildmemo._mac(b"another user's key".ljust(32), planted["key"], old,
                                                                (old,) * len(cut.stages))}):
        (memo / f"{context.selection}-native.json").write_text(_json.dumps({**planted, **mac}))
        built = build_image(context, engine, product="unibake-test", revision="r", epoch=1700000000, memo=memo,
                            memo_key=KEY)
        assert built.memoised == 0  # the whole Dockerfile built, not FROM the planted image
    (memo / f"{context.selection}-native.json").write_text("[" * 100_000)  # nested deeper than the stack: no memo
    assert build_image(context, engine, product="unibake-test", revision="r", epoch=1700000000, memo=memo,
                       memo_key=KEY).memoised == 0
    again = build_image(context, engine, product="unibake-test", revision="r", epoch=1700000000, memo=memo,
                        memo_key=KEY)
    assert again.memoised == 3  # the memo this user recorded serves


def test_the_memo_key_is_the_users_own_made_once_and_private(tmp_path):
    from unibake.buildmemo import secret

    key = secret({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    path = tmp_path / "cache" / "unibake" / "build-memo.key"
    assert len(key) == 32 and path.read_bytes() == key and path.stat().st_mode & 0o777 == 0o600
    assert secret({"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache")}) == key
    other = secret({"XDG_CACHE_HOME": "relative", "HOME": str(tmp_path / "home")})  # a relative one is no place
    assert len(other) == 32 and other != key and (tmp_path / "home/.cache/unibake/build-memo.key").read_bytes() == other
    (tmp_path / "cache/unibake/build-memo.key").write_bytes(b"short")  # not a key: a new one (old memos ignored)
    assert secret({"XDG_CACHE_HOME": str(tmp_path / "cache")}) not in (key, b"short")


def test_two_first_uses_at_once_keep_one_memo_key(tmp_path, monkeypatch):
    """Two builds that both find no key: the one that writes it second takes the first's, not its own over
    it (the first's memos, signed with the key it made, would all be ignored)."""
    import os

    from unibake import buildmemo

    path = tmp_path / "cache" / "unibake" / "build-memo.key"
    first = b"k" * 32
    real = os.urandom

    def racing(n):  # the other build's first use writes its key while this one makes its own
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(first)
        path.chmod(0o600)
        return real(n)

    monkeypatch.setattr(buildmemo.os, "urandom", racing)
    assert buildmemo.secret({"XDG_CACHE_HOME": str(tmp_path / "cache")}) == first
    assert path.read_bytes() == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["build-memo.key"]  # no temporary file left


def test_the_memo_key_is_private_from_its_first_byte(tmp_path, monkeypatch):
    """The key is written into a file only its user can read: ~/.cache/unibake may be others' to enter (the
    secret scan's cache makes it 0755), and a file they opened while it was 0644 they could read later."""
    import os
    import stat

    from unibake import buildmemo

    (tmp_path / "cache" / "unibake").mkdir(parents=True, mode=0o755)
    modes = []
    real = os.fchmod

    def watch(fd, mode):  # the file's mode once the key is in it, before it is made private
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            modes.append(info.st_mode & 0o777)
        return real(fd, mode)

    monkeypatch.setattr(buildmemo.os, "fchmod", watch)
    old = os.umask(0)
    try:
        assert len(buildmemo.secret({"XDG_CACHE_HOME": str(tmp_path / "cache")})) == 32
    finally:
        os.umask(old)
    assert modes == [0o600]


def test_a_memo_key_others_can_read_or_replace_is_not_used(tmp_path):
    """A key another user can read (a copied home, a chmod), or one another user owns, is no secret: memos
    they sign with it would be built FROM. It is replaced by a new one; in a folder anyone may write (where
    anyone could put their own key), or another user's, no memo is used at all."""
    import os

    from unibake.buildmemo import secret

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    key = secret(env)
    path = tmp_path / "cache" / "unibake" / "build-memo.key"
    path.chmod(0o644)
    again = secret(env)
    assert len(again) == 32 and again != key and path.read_bytes() == again and path.stat().st_mode & 0o777 == 0o600
    if os.geteuid() == 0:  # another owner (only root can give a file away)
        os.chown(path, 4242, -1)
        third = secret(env)
        assert third not in (key, again) and path.stat().st_uid == 0 and path.read_bytes() == third
    path.parent.chmod(0o777)
    assert secret(env) is None
    path.parent.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(path.parent, 4242, -1)
        assert secret(env) is None


@pytest.mark.parametrize("where", ["as a hold tag is put", "as the memo build is said"])
def test_an_interrupt_just_after_the_memo_s_images_are_held_leaves_no_hold_tag(busybox_product, tmp_path, where):
    """The hold's tags were put before the try whose finally removes them: Ctrl-C (or SIGTERM) as a tag was put, or
    as the line saying the build goes FROM the memo was printed, left ``unibake-cache/...:...-holdPIDx...`` in the
    engine for good (only ``prune`` removed it)."""
    import os
    import signal


    class InterruptedEngine(BuildingEngine):
        armed = False

        def tag(self, image, ref):
            super().tag(image, ref)
            if self.armed and "-hold" in ref:  # the engine tagged it; the signal lands before the answer is used
                os.kill(os.getpid(), signal.SIGTERM)

    def said(line):
        if where == "as the memo build is said" and "building FROM" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    engine = InterruptedEngine()
    engine.add({"architecture": "amd64", "os": "linux"}, [b"base"], tag="localhost/unibake-busybox:1")
    build = dict(engine=engine, product="unibake-test", revision="r", epoch=1700000000, memo=tmp_path / "memo",
                 memo_key=KEY)
    context = render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path))
    assert build_image(context, **build).memoised == 0  # the memo recorded
    engine.armed = where == "as a hold tag is put"
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            build_image(context, on_line=said, **build)
    assert [t for t in engine.tags if "-hold" in t] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder root owns, as a sudo run leaves it, needs root to make")
def test_a_memo_folder_this_user_cannot_write_costs_the_memo_not_the_build(tmp_path):
    # (before: a .cache/build-memo left root's by an earlier sudo run failed every run after its whole build,
    # exit 1, as the memo could never be written)
    from types import SimpleNamespace

    from unibake.buildmemo import Split, record

    from ..conftest import as_nobody

    image = "sha256:" + "a" * 64
    engine = SimpleNamespace(inspect_image=lambda ref: SimpleNamespace(id=image))  # (what the build reported)
    cut = Split(lower="FROM x\n", upper="", lower_steps=1, stages=(), bases=("x",), lower_sources=(),
                upper_sources=())
    steps = (SimpleNamespace(number=1, image="aaaaaaaaaaaa"),)
    top = Path(tempfile.mkdtemp())
    try:
        top.chmod(0o755)
        memo = top / "build-memo"
        memo.mkdir(mode=0o755)  # root's, as a sudo run left it
        found = as_nobody(lambda: record(memo, "tp1", None, "k" * 64, cut, steps, (), engine, b"k" * 32).lower)
        assert found == f"ok: {image}"
        assert list(memo.iterdir()) == []
        linked = top / "linked-memo"
        linked.symlink_to(top / "elsewhere")
        (top / "elsewhere").mkdir()
        assert record(linked, "tp1", None, "k" * 64, cut, steps, (), engine, b"k" * 32).lower == image
        assert list((top / "elsewhere").iterdir()) == []  # nothing written through a checkout's link
    finally:
        shutil.rmtree(top)


def test_a_base_tag_moved_during_the_build_records_no_memo_under_the_old_base(busybox_product, tmp_path):
    # found by review: the memo's digest names the FROM images as the build began; a pull that moved the base's tag
    # during the build had the engine build on the new base, recorded under the old one's digest: built on again
    # whenever the tag named the old base, a release shipping steps made on another image than its records say
    class MovingEngine(BuildingEngine):
        def build(self, context, **kw):
            self.tags["localhost/unibake-busybox:1"] = self.moved_to  # a pull, while the engine builds
            return super().build(context, **kw)

    engine = MovingEngine()
    engine.add({"architecture": "amd64", "os": "linux"}, [b"base"], tag="localhost/unibake-busybox:1")
    engine.moved_to = engine.add({"architecture": "amd64", "os": "linux", "pulled": 1}, [b"newer base"])
    lines = []
    build = dict(engine=engine, product="unibake-test", revision="r", epoch=1700000000, memo=tmp_path / "memo",
                 memo_key=KEY, on_line=lines.append)
    first = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert first.memoised == 0 and not (tmp_path / "memo").exists()
    assert "a FROM image's tag moved (or the image went) during the build: the build memo is not recorded for it" \
        in lines
