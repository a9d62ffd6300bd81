"""The build memo's cut of the rendered Dockerfile (pure): where it falls, what each side reads, and
the Dockerfile of the part below it."""

from __future__ import annotations

import tarfile

from unibake.builder import build_image
from unibake.buildmemo import MARKER, Memo, instructions, split, upper_context
from unibake.engine import BuildOutcome, BuildStep
from unibake.plan import make_plan
from unibake.render import render

from ..conftest import REPO
from ..fake_engine import FakeEngine

LOWER = "sha256:" + "a" * 64
STAGE = "sha256:" + "b" * 64


def demo():
    return render(make_plan(REPO / "profiles", profiles=["all"], cwd=REPO))


def test_the_cut_falls_below_the_prebuilt_kernels_and_above_the_tune_caches():
    context = demo()
    cut = split(context.dockerfile)
    assert cut is not None and cut.stages == ("kernels",)
    assert cut.bases == ("localhost/unibake-demo-builder:bookworm", "localhost/unibake-demo-base:bookworm")
    low = instructions(cut.lower)
    assert low[-1] == "COPY ctx/prebuilt/ /opt/unibake/" and len(low) == cut.lower_steps
    assert "ctx/engine/" in cut.lower_sources and "ctx/prebuilt/" in cut.lower_sources
    assert cut.upper_sources == ("ctx/profiles/", "ctx/overlays/", "ctx/meta/")
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
    assert "Dockerfile" in names and any(n.startswith("ctx/profiles/") for n in names)
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
    build = dict(engine=engine, product="unibake-test", revision="r", epoch=1700000000, memo=memo)
    first = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert first.memoised == 0 and first.cached_steps == 0
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text().replace("Tree", "Ring"))
    second = build_image(render(make_plan(busybox_product, profiles=["all"], cwd=tmp_path)), **build)
    assert second.memoised == second.cached_steps == 1  # the engine's COPY above the marker; not its FROM
