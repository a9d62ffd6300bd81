"""The build memo on the real engine: a tune-cache change builds only the steps below the marker,
from a context without the engine folder, and gives the very image a whole build gives; a change
above the marker, a damaged memo, or --no-cache build the whole Dockerfile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

MEMO_LINE = "steps above the build memo's marker are unchanged"


def build(cli, profiles: Path, version: str, *extra: str):
    result = cli("--stage", "build", "--config", str(profiles), "--version", version, *extra)
    assert result.code == 0, result.err
    return result


def memo_file(profiles: Path) -> Path:
    # (beside it: the record of the diffIDs its image gets, NAME.lower.json, for an assembled hotfix)
    found = sorted(p for p in (profiles.parent / ".cache" / "build-memo").glob("*.json")
                   if not p.name.endswith(".lower.json"))
    assert len(found) == 1, found
    return found[0]


def test_a_tune_change_builds_from_the_memo_the_same_image_a_whole_build_gives(cli, engine, busybox_product,
                                                                                version, images):
    tag = f"unibake-test:{version}"
    images(tag)
    first = build(cli, busybox_product, version)
    assert MEMO_LINE not in first.err  # nothing recorded yet
    memo = json.loads(memo_file(busybox_product).read_text())
    assert engine.inspect_image(memo["lower"]) is not None

    (busybox_product.parent / "images/tune/tp2/cache-2.json").write_text('{"tp2_cache": "retuned"}\n')
    assert cli("lock", "--config", str(busybox_product)).code == 0
    from_memo = build(cli, busybox_product, version)
    assert MEMO_LINE in from_memo.err and "their context was not sent" in from_memo.err
    assert f"FROM {memo['lower']}" in from_memo.err  # the upper part only, on the recorded image
    assert "COPY ctx/engine/" not in from_memo.err.split(MEMO_LINE, 1)[1]
    memo_id = engine.inspect_image(tag).id

    whole = build(cli, busybox_product, version, "--no-cache")
    assert MEMO_LINE not in whole.err and "COPY ctx/engine/" in whole.err
    assert engine.inspect_image(tag).id == memo_id  # the same image, byte for byte


def test_a_change_above_the_marker_or_a_damaged_memo_builds_everything(cli, engine, busybox_product, version,
                                                                        images):
    tag = f"unibake-test:{version}"
    images(tag)
    build(cli, busybox_product, version)
    engine_file = next(p for p in sorted((busybox_product.parent / "images/engine").rglob("*")) if p.is_file())
    engine_file.write_text(engine_file.read_text() + "\n# changed\n")
    assert cli("lock", "--config", str(busybox_product)).code == 0
    changed = build(cli, busybox_product, version)
    assert MEMO_LINE not in changed.err and "COPY ctx/engine/" in changed.err
    assert MEMO_LINE in build(cli, busybox_product, version).err  # recorded again for the new inputs

    path = memo_file(busybox_product)
    good = json.loads(path.read_text())
    for damaged in ("{not json", json.dumps({**good, "lower": "sha256:" + "0" * 64}),
                    json.dumps({**good, "lower": "../../etc/passwd"}), json.dumps({**good, "stages": ["x"]}),
                    json.dumps([1, 2])):
        path.write_text(damaged)
        again = build(cli, busybox_product, version)
        assert MEMO_LINE not in again.err and "error" not in again.err.lower(), again.err
        assert json.loads(path.read_text())["lower"] == good["lower"]  # the whole build recorded it again


def test_a_step_that_fails_in_a_memo_build_is_named_by_its_number_in_the_whole_dockerfile(engine, busybox_product,
                                                                                          version, images, tmp_path):
    from dataclasses import replace

    from unibake.builder import build_image
    from unibake.errors import BuildFailed
    from unibake.plan import make_plan
    from unibake.render import render

    tag = f"unibake-test:{version}"
    images(tag)
    context = render(make_plan(busybox_product, cwd=busybox_product.parent, version=version))
    memo = tmp_path / "memo"
    lines: list[str] = []
    build_image(context, engine, product="unibake-test", revision="r", epoch=0, nocache=False,
                on_line=lines.append, memo=memo)
    whole = [line for line in lines if line.startswith("Step ")]
    total = int(whole[-1].split("/")[1].split()[0])
    failing = replace(context, dockerfile=context.dockerfile + "RUN echo broken >&2 && exit 3\n")
    lines.clear()
    with pytest.raises(BuildFailed) as failed:
        build_image(failing, engine, product="unibake-test", revision="r", epoch=0, nocache=False,
                    on_line=lines.append, memo=memo)
    assert any(MEMO_LINE in line for line in lines)  # built from the memo: the upper Dockerfile only
    steps = [line for line in lines if line.startswith("Step ")]
    # numbered as in the Dockerfile the user has: one more step than the whole build, the last one failing
    assert steps[-1] == f"Step {total + 1}/{total + 1} : RUN echo broken >&2 && exit 3"
    assert failed.value.step == f"Step {total + 1}: RUN echo broken >&2 && exit 3"
    assert str(failed.value).startswith(f"the build failed at Step {total + 1}: RUN echo broken")


def _built_once_with_a_memo(engine, busybox_product, version, images, tmp_path):
    """The busybox product built once with a memo in ``tmp_path``: its tag, context, memo folder, the build, and
    every tag the build left on its images (the tag and the build cache), as another CI job would replace them."""
    from unibake.builder import CACHE_REPOSITORY, build_image
    from unibake.plan import make_plan
    from unibake.render import render

    tag = f"unibake-test:{version}"
    images(tag)
    context = render(make_plan(busybox_product, cwd=busybox_product.parent, version=version))
    memo = tmp_path / "memo"
    first = build_image(context, engine, product="unibake-test", revision="r", epoch=0, on_line=lambda line: None,
                        memo=memo)
    first_tags = [t for i in engine.list_images() for t in i.tags
                  if t == tag or t.startswith(f"{CACHE_REPOSITORY}/unibake-test:")]
    return tag, context, memo, first, first_tags


def test_a_build_from_the_memo_keeps_its_images_when_another_run_removes_them_meanwhile(engine, busybox_product,
                                                                                       version, images, tmp_path):
    # two CI jobs of one selection on one engine: the other job's build cache replaces, and so removes, the
    # images this one builds FROM, just after this one looked them up (before: the build failed, "No such image")
    from unibake.builder import build_image

    tag, context, memo, first, first_tags = _built_once_with_a_memo(engine, busybox_product, version, images,
                                                                     tmp_path)
    lower = json.loads(next(memo.glob("*.json")).read_text())["lower"]
    removed: list[str] = []

    def other_run(line: str) -> None:
        if MEMO_LINE in line and not removed:  # every tag of the first build's images goes, and untagged images too
            for ref in first_tags:
                engine.untag(ref)
                removed.append(ref)

    second = build_image(context, engine, product="unibake-test", revision="r", epoch=0, on_line=other_run,
                         memo=memo)
    assert removed  # built from the memo, its images' tags removed meanwhile
    assert second.memoised and engine.inspect_image(tag).id == second.image_id
    kept = engine.inspect_image(lower)  # the new image's parent now: its layers are the new image's first
    assert kept is not None and second.diff_ids[:len(kept.diff_ids)] == first.diff_ids[:len(kept.diff_ids)]
    leftovers = [t for i in engine.list_images() for t in i.tags if "hold" in t]
    assert not leftovers  # the build's own hold on the memo's images is gone with it


def test_a_memo_whose_images_go_just_after_the_lookup_gives_a_whole_build(engine, busybox_product, version, images,
                                                                          tmp_path, monkeypatch):
    # the other job's clean-up lands between this build's memo lookup and its hold on the images it found
    from unibake import buildmemo
    from unibake.builder import build_image

    tag, context, memo, _, first_tags = _built_once_with_a_memo(engine, busybox_product, version, images, tmp_path)
    looked_up = buildmemo.lookup

    def lookup_then_the_other_run(*args, **kwargs):
        found = looked_up(*args, **kwargs)
        for ref in first_tags:
            engine.untag(ref)
        return found

    monkeypatch.setattr(buildmemo, "lookup", lookup_then_the_other_run)
    lines: list[str] = []
    second = build_image(context, engine, product="unibake-test", revision="r", epoch=0, on_line=lines.append,
                         memo=memo)
    assert any("the build memo's images went from the engine since they were looked up" in line for line in lines)
    assert not any(MEMO_LINE in line for line in lines) and not second.memoised  # the whole Dockerfile
    assert engine.inspect_image(tag).id == second.image_id
    assert not [t for i in engine.list_images() for t in i.tags if "hold" in t]
