"""The build stream parser (:meth:`DockerEngine.build`) against streams recorded from the real engine:
docker-py's decoded events of Engine 20.10's classic builder (tests/fixtures/build-streams/engine-20.10.json,
recorded with rm and forcerm as unibake builds). Every legitimate build is read without a refusal, each step
with its number, its image and whether the engine took it from the cache."""

from __future__ import annotations

import json

import pytest

from unibake import buildmemo
from unibake.builder import BuiltImage
from unibake.docker_engine import DockerEngine
from unibake.engine import BuildOutcome
from unibake.errors import BuildFailed

from ..conftest import REPO

STREAMS = json.loads((REPO / "tests/fixtures/build-streams/engine-20.10.json").read_text())["streams"]


def parse(events: list[dict], lines: list[str] | None = None) -> BuildOutcome:
    class API:  # what docker-py's APIClient.build yields, decoded
        def build(self, **kwargs):
            return iter(events)

    engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the recorded stream
    engine.address, engine.api = "fake://", API()
    return engine.build(None, tag="stream2-probe:1", buildargs={}, nocache=False,
                        on_line=(lines.append if lines is not None else lambda line: None))


def engine_images(events: list[dict]) -> list[str]:
    """The images the engine printed after each step (" ---> <id>"), outside any container's output."""
    return [e["stream"].split()[1] for e in events
            if e.get("stream", "").startswith(" ---> ") and e["stream"].split()[1] not in ("Using", "Running")]


@pytest.mark.parametrize("name", [n for n, s in STREAMS.items() if not any("error" in e for e in s["events"])])
def test_every_recorded_build_is_read_without_a_refusal(name):
    events = STREAMS[name]["events"]
    outcome = parse(events)
    total = int(next(e["stream"] for e in events if e.get("stream", "").startswith("Step ")).split()[1].split("/")[1])
    assert [s.number for s in outcome.steps] == list(range(1, total + 1))
    assert outcome.image_id == [e["aux"]["ID"] for e in events if "aux" in e][-1]
    assert [s.image for s in outcome.steps if s.image] == engine_images(events)
    segments, at = [], []  # the engine sends a step's line in an event of its own, its "\n" in the next
    for e in events:
        text = e.get("stream", "")
        if text.startswith("Step ") and "\n" not in text:
            segments.append(at := [])
        elif segments:
            at.append(text)
    segments = ["".join(seg) for seg in segments]
    assert [s.cached for s in outcome.steps] == [" ---> Using cache\n" in seg for seg in segments]


def test_the_multi_stage_builds_steps_images_and_cache():
    """Two stages after a meta ARG (a step with no image), every kind of step (ENV, ARG, WORKDIR, USER, LABEL,
    HEALTHCHECK, EXPOSE run in a container of their own), RUNs printing no newline at the end, \\r progress,
    invalid UTF-8, U+2028 and U+0085, a 40 kB line, stderr, and the engine's own lines of another build."""
    fresh, cached = parse(STREAMS["multi-nocache"]["events"]), parse(STREAMS["multi-cached"]["events"])
    assert [s.image for s in fresh.steps] == [s.image for s in cached.steps]
    assert fresh.steps[0].image == "" and fresh.steps[0].instruction.startswith("ARG BASE=")
    assert not any(s.cached for s in fresh.steps)
    assert [s.number for s in cached.steps if not s.cached] == [1, 2, 12]  # the meta ARG and the two FROMs
    assert fresh.stage_images == cached.stage_images == (fresh.steps[10].image,)
    target = parse(STREAMS["multi-target"]["events"])  # --target a: the first stage only, its own total
    assert len(target.steps) == 11 and target.stage_images == ()
    assert target.image_id.startswith("sha256:" + fresh.steps[10].image)


def test_a_runs_output_is_kept_as_it_came_and_the_engines_lines_too():
    lines: list[str] = []
    parse(STREAMS["multi-nocache"]["events"], lines)
    assert "Step 99/99 : fake" in lines and "no-newline-1" in lines and "to-stderr-1" in lines
    assert "100% [#####]" in lines and "\u2028 ls \x85 nel" in lines


def test_a_failed_run_names_its_step_its_output_and_the_last_good_image():
    with pytest.raises(BuildFailed) as failed:
        parse(STREAMS["fail"]["events"])
    assert failed.value.step == "Step 3: RUN echo failing-1; printf 'partial'; exit 3"
    assert failed.value.output == ("failing-1", "partial")
    assert failed.value.last_image == engine_images(STREAMS["fail"]["events"])[-1]
    with pytest.raises(BuildFailed, match="COPY failed: file not found"):
        parse(STREAMS["fail-missing-copy"]["events"])
    with pytest.raises(BuildFailed) as check:
        parse(STREAMS["self-check-fail"]["events"])
    assert "error: self-check[tp1]: bad ledger" in check.value.output  # its stderr, the engine's colour dropped


def test_the_memo_records_the_image_the_engine_committed_above_the_marker_and_rebuilds_it():
    """A Dockerfile shaped as unibake renders it: the memo's step above the marker and its stage image are the
    engine's; the part below the marker built FROM that image gives the same image as the whole build."""
    dockerfile = STREAMS["rendered-nocache"]["dockerfile"]
    cut = buildmemo.split(dockerfile.replace(
        "# --- unibake: the steps above are memoised by the digest of their inputs; those below run every build ---",
        buildmemo.MARKER))
    assert cut is not None
    whole = parse(STREAMS["rendered-nocache"]["events"])
    step = whole.steps[cut.lower_steps - 1]
    assert step.number == cut.lower_steps and step.instruction.startswith("COPY --from=kernels /out/kernels/")
    assert STREAMS["rendered-memo-upper"]["dockerfile"].split("\n")[1] == f"FROM sha256:{step.image}" + \
        STREAMS["rendered-memo-upper"]["dockerfile"].split("\n")[1][len(f"FROM sha256:{step.image}"):]
    assert whole.stage_images == (engine_images(STREAMS["rendered-nocache"]["events"])[3],)
    upper = parse(STREAMS["rendered-memo-upper"]["events"])
    assert upper.image_id == whole.image_id == parse(STREAMS["rendered-cached"]["events"]).image_id


def built(outcome: BuildOutcome) -> BuiltImage:
    return BuiltImage(image_id=outcome.image_id, tag="stream2-probe:3", diff_ids=(), steps=outcome.steps,
                      stage_images=outcome.stage_images, seconds=0.0)


def test_onbuild_triggers_run_in_the_from_step():
    """A parent's ONBUILD RUN, ENV and COPY run in the child's FROM step ("# Executing 3 build triggers"): its
    containers' output is read as output, and the FROM step's image is the one after its triggers."""
    fresh = parse(STREAMS["onbuild-child"]["events"])
    assert [(s.number, s.image) for s in fresh.steps] == list(enumerate(engine_images(
        STREAMS["onbuild-child"]["events"]), 1))
    one = parse(STREAMS["onbuild-child1"]["events"])
    assert [s.number for s in one.steps] == [1, 2]


def test_a_from_whose_onbuild_triggers_came_from_the_cache_is_not_counted_as_a_reused_step():
    """The triggers' " ---> Using cache" lines come in the FROM step: the report said "2 of 1 steps reused"
    (more steps reused than could be), and the build record's cached_steps exceeded its steps."""
    image = built(parse(STREAMS["onbuild-child-cached"]["events"]))
    assert len(image.cacheable_steps) == 1
    assert image.cached_steps == 1


BUSY = ": driver \"overlay2\" failed to remove root filesystem: unlinkat /var/lib/docker/overlay2/0f1e/merged: " \
       "device or resource busy"


def containers(events: list[dict]) -> list[str]:
    return [e["stream"].split()[-1] for e in events if e.get("stream", "").startswith(" ---> Running in ")]


def with_removals(events: list[dict], lines: dict[str, list[str]]) -> list[dict]:
    """The recorded stream with the engine's line that removed container C replaced by ``lines[C]``: what
    Engine 20.10 prints when a removal fails (builder/dockerfile/containerbackend.go: "Error removing
    intermediate container C: <why>", C kept on its list, and every container on it tried again, in the map's
    order, after each later step, stopping at the first it cannot remove)."""
    out = []
    for e in events:
        cid = e.get("stream", "").removeprefix("Removing intermediate container ").strip()
        out.extend({"stream": f"{text}\n"} for text in lines[cid]) if cid in lines else out.append(e)
    return out


def summary(outcome: BuildOutcome):
    return [(s.number, s.instruction, s.cached, s.image) for s in outcome.steps], outcome.stage_images, outcome.image_id


@pytest.mark.parametrize("order", ["older first", "newer first", "fails again"])
def test_a_container_the_engine_could_not_remove_does_not_refuse_the_build(order):
    """The engine's storage busy (a leaked mount), it says "Error removing intermediate container C: ..." where it
    would say "Removing ...", keeps the build going and tries C again after each later step. That line did not end
    C's output for the parser: the step's image and the next steps were read as C's output, and the build was
    refused as one whose RUN imitated the engine's lines (or recorded a step with the next one's image)."""
    events = STREAMS["multi-nocache"]["events"]
    a, b, c, *_ = containers(events)  # steps 3 (RUN), 4 (ENV), 5 (ARG)
    failed = f"Error removing intermediate container {a}{BUSY}"
    retry = {"older first": {a: [failed], b: [f"Removing intermediate container {a}", f"Removing intermediate container {b}"]},
             "newer first": {a: [failed], b: [f"Removing intermediate container {b}", f"Removing intermediate container {a}"]},
             "fails again": {a: [failed], b: [failed],  # tried first: b not tried, both kept, then both removed
                             c: [f"Removing intermediate container {b}", f"Removing intermediate container {c}",
                                 f"Removing intermediate container {a}"]}}[order]
    lines: list[str] = []
    assert summary(parse(with_removals(events, retry), lines)) == summary(parse(events))
    assert failed in lines


def test_the_last_steps_container_the_engine_could_not_remove_does_not_refuse_the_build():
    events = STREAMS["rendered-nocache"]["events"]
    last = containers(events)[-1]
    outcome = parse(with_removals(events, {last: [f"Error removing intermediate container {last}{BUSY}"]}))
    assert summary(outcome) == summary(parse(events))


def test_a_run_imitating_a_failed_removal_of_its_own_container_is_still_refused():
    from unibake.errors import EngineError

    events = STREAMS["multi-nocache"]["events"]
    at = next(i for i, e in enumerate(events) if e.get("stream") == "to-stdout\n")  # step 18's RUN
    own = containers(events[:at])[-1]
    forged = [{"stream": f"Error removing intermediate container {own}: busy\n ---> 0123456789ab\n"
                         "Step 19/22 : RUN fake\n"}]
    with pytest.raises(EngineError, match=r"imitated the engine's own lines \(.Step 19/22 : RUN "):
        parse(events[:at] + forged + events[at:])


def test_a_run_opening_a_container_of_its_own_to_hide_the_rest_of_the_build_is_refused():
    """Having ended its own output ("Removing intermediate container <its ID>"), a RUN printed " ---> Running in
    <an ID>" that no step ever ends: every line after it, the engine's own too, was read as that container's output,
    and the build was accepted with its steps cut at that RUN (no stage image, no later step, nothing cached)."""
    from unibake.errors import EngineError

    events = STREAMS["rendered-nocache"]["events"]
    at = next(i for i, e in enumerate(events) if e.get("stream", "").startswith(" ---> Running in "))
    own = containers(events)[0]
    forged = [{"stream": f"Removing intermediate container {own}\n ---> Running in 0123456789ab\n"}]
    with pytest.raises(EngineError, match=r"imitated the engine's own lines \(' ---> Running in 0123456789ab'\)"):
        parse(events[:at + 1] + forged + events[at + 1:])


def test_the_engines_own_stream_of_a_container_it_could_not_remove_is_read_without_a_refusal():
    """Recorded from the real engine: step 2's container could not be removed after steps 2 and 3 (the engine
    stopped at it, step 3's container not tried), and all three went after step 4."""
    events = json.loads((REPO / "tests/fixtures/build-streams/engine-20.10-removal-failed.json").read_text())["events"]
    lines: list[str] = []
    outcome = parse(events, lines)
    assert [(s.number, s.image) for s in outcome.steps] == list(enumerate(engine_images(events), 1))
    assert outcome.image_id == [e["aux"]["ID"] for e in events if "aux" in e][-1]
    assert sum(line.startswith("Error removing intermediate container ") for line in lines) == 2


def test_a_run_printing_a_failed_removal_then_using_cache_is_refused_not_counted_as_reused():
    """On the engine's own stream of a container it could not remove (58f2e7d969ff, kept after step 2), step 3's
    RUN printed "Error removing intermediate container 58f2e7d969ff: x", which ended its output for the parser,
    then " ---> Using cache": the step was counted as reused though it ran, and the build was accepted."""
    from unibake.errors import EngineError

    events = json.loads((REPO / "tests/fixtures/build-streams/engine-20.10-removal-failed.json").read_text())["events"]
    at = next(i for i, e in enumerate(events) if e.get("stream") == "s3\n") + 1
    forged = [{"stream": "Error removing intermediate container 58f2e7d969ff: x\n ---> Using cache\n"}]
    with pytest.raises(EngineError, match=r"imitated the engine's own lines \(' ---> Using cache'\)"):
        parse(events[:at] + forged + events[at:])


@pytest.mark.parametrize("events", [
    [5], [["stream"]], [{"stream": 7}, "x"],
], ids=["a number", "a list", "a string after an odd stream"])
def test_an_engine_answering_a_build_with_other_than_events_is_one_error_not_a_traceback(events):
    from unibake.errors import EngineError

    with pytest.raises(EngineError, match=r"^the engine answered the build of stream2-probe:1 with something that "
                                          r"is not its progress \(JSON events\) \(engine at fake://\)$"):
        parse(events)


@pytest.mark.parametrize("event, said", [
    ({"errorDetail": "no object", "error": "the step failed"}, "the step failed"),
    ({"errorDetail": {"message": 3}}, "3"),
    ({"error": None}, "no reason given"),
])
def test_an_odd_error_event_fails_the_build_with_what_it_says(event, said):
    with pytest.raises(BuildFailed, match=rf"^the build failed at before the first step: {said}$"):
        parse([{"aux": "ID"}, {"aux": {"ID": 4}}, event])


def test_a_build_answer_cut_in_the_middle_of_an_event_is_one_error_not_a_traceback():
    from docker.utils.json_stream import json_stream

    from unibake.errors import EngineError

    class API:  # docker-py's own decoder (decode=True) over an answer whose last event the engine never finished
        def build(self, **kwargs):
            return json_stream(iter(['{"stream": "Step 1/1 : FROM x"}\r\n', '{"stream": "\\n"}\r\n{"str']))

    engine = DockerEngine.__new__(DockerEngine)
    engine.address, engine.api = "fake://", API()
    with pytest.raises(EngineError, match=r"^the engine's answer to the build of stream2-probe:1 ended in the middle "
                                          r"of an event"):
        engine.build(None, tag="stream2-probe:1", buildargs={}, nocache=False, on_line=lambda line: None)
