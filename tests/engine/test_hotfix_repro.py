"""Reproducible builds and hotfix releases, on the real engine."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from unibake import templates
from unibake.repro import list_layer
from unibake.scratch import ScratchEngine
from unibake.sha256state import AVAILABLE as RESUMABLE

EPOCH = "1700000000"


def release(cli, profiles: Path, version: str, out: Path, *extra: str, epoch: str = EPOCH):
    return cli("--config", str(profiles), "--version", version, "--out", str(out), *extra,
               env={"CI": "true", "SOURCE_DATE_EPOCH": epoch})


def test_the_layers_unibake_adds_carry_the_epoch_and_no_owner_names(cli, engine, busybox_product, version, images):
    tag = f"unibake-test:{version}"
    images(tag)
    result = cli("--config", str(busybox_product), "--version", version, "--stage", "build",
                 env={"CI": "true", "SOURCE_DATE_EPOCH": EPOCH})
    assert result.code == 0, result.err
    info = engine.inspect_image(tag)
    assert info.labels["io.unibake.source-date-epoch"] == EPOCH
    assert info.created.startswith("2023-11-14T22:13:20")
    base = engine.inspect_image("localhost/unibake-busybox:1")
    assert info.diff_ids[: len(base.diff_ids)] == base.diff_ids  # the base's layers are untouched
    for index in range(len(base.diff_ids), len(info.diff_ids)):
        entries = list_layer(engine, tag, info.diff_ids[index])
        assert entries and {e[4] for e in entries.values()} == {int(EPOCH)}
    history = engine.api.history(tag)
    assert {h["Created"] for h in history} == {int(EPOCH)}


def test_repro_passes_on_the_example_product(cli, demo_product, version, images):
    images(f"demo-llm:{version}")
    result = cli("repro", "--config", str(demo_product), "--version", version,
                 env={"CI": "true", "SOURCE_DATE_EPOCH": EPOCH})
    assert result.code == 0, result.err
    assert f"reproducible: demo-llm:{version} is sha256:" in result.err
    assert "DIFFERENT" not in result.err


def test_repro_names_the_layer_and_file_that_differ(cli, demo_product, version, images):
    images(f"demo-llm:{version}")
    source = demo_product.parent / "images/kernels/rmsnorm/rmsnorm.c"
    source.write_text(source.read_text() + '\nconst char *built_at(void) { return __DATE__ " " __TIME__; }\n')
    assert cli("lock", "--config", str(demo_product)).code == 0
    result = cli("repro", "--config", str(demo_product), "--version", version,
                 env={"CI": "true", "SOURCE_DATE_EPOCH": EPOCH})
    assert result.code == 3
    assert result.error_lines[-1].startswith("error: not reproducible: layer 3 differs")
    assert "opt/unibake/kernels/rmsnorm/librmsnorm.so: content" in result.error_lines[-1]


def test_two_releases_of_the_same_commit_give_the_same_archive(cli, busybox_product, version, images, tmp_path):
    images(f"unibake-test:{version}")
    sums = []
    for n in (1, 2):
        out = tmp_path / f"r{n}"
        assert release(cli, busybox_product, version, out, "--no-roundtrip", *(["--no-cache"] if n == 2 else [])).code == 0
        sums.append(json.loads((out / version / "manifest.json").read_text())["archive"]["sha256"])
    assert sums[0] == sums[1]


@pytest.fixture
def hotfix_pair(cli, demo_product, version, images, tmp_path):
    """Release 1 of the example product, then a hotfix that changes one tune-cache JSON."""
    out = tmp_path / "release"
    base, fix = f"{version}a", f"{version}b"
    images(f"demo-llm:{base}")
    images(f"demo-llm:{fix}")
    # a file of 4 MiB or more (an engine's library, weights): a zstd frame of its own in the kit, which the
    # hotfix's kit copies from the base release's
    weights = demo_product.parent / "images/engine/demo_engine/weights.bin"
    weights.write_bytes(random.Random(7).randbytes(1 << 20) * 5)
    assert cli("lock", "--config", str(demo_product)).code == 0
    assert release(cli, demo_product, base, out).code == 0
    tune = demo_product.parent / "images/tune/tp2/E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3.json"
    tune.write_text(tune.read_text().replace("{", '{"retuned": true, ', 1))
    assert cli("lock", "--config", str(demo_product)).code == 0
    result = cli("hotfix", "--from", base, "--version", fix, "--config", str(demo_product), "--out", str(out))
    assert result.code == 0, result.err
    # assembled: the steps below the build memo's marker built alone, on the base release's bottom layers
    assert "assembled: the steps below the build memo's marker built alone" in result.err, result.err
    # on the memo's image itself (CI reads the engine's storage: the top layers taken from there, no small base)
    assert "the steps below the build memo's marker built FROM its image" in result.err
    assert "in-image checks of tp1, tp2, tp4 passed on the assembled image" in result.err
    # the base release's pass recorded its layers: they are not read again, and its verify engine kept it
    assert f"bottom layers of release {base} as its pass recorded them (not read again)" in result.err
    assert f"1 of 1 large context files copied from the frames of demo-llm-{base}-kit.tar.zst" in result.err
    assert f"holding only the base image and the release {json.loads((out / base / 'manifest.json').read_text())['image_id'][:19]}" \
        in result.err
    return out / base, out / fix


def test_a_hotfix_ships_only_what_changed_and_equals_a_full_build(cli, engine, demo_product, hotfix_pair, tmp_path):
    base, fix = hotfix_pair
    full_manifest = json.loads((base / "manifest.json").read_text())
    manifest = json.loads((fix / "manifest.json").read_text())
    hotfix = manifest["hotfix"]
    assert hotfix["base_release"] == base.name and hotfix["base_image_id"] == full_manifest["image_id"]
    assert 0 < len(hotfix["shipped_diff_ids"]) < len(manifest["diff_ids"])
    ratio = manifest["archive"]["bytes"] / full_manifest["archive"]["bytes"]
    assert ratio < 0.01, ratio
    validation = json.loads((fix / "VALIDATION.json").read_text())
    assert validation["round_trip"]["image_id"] == manifest["image_id"]  # loaded on top of the base release
    assert validation["round_trip"]["method"] == "archive"  # the hotfix's archive file itself, not the stream
    # in the verify engine seeded with the base image: it held that and the base release (loaded without the
    # base image's layer files, which it held), nothing else
    base_image = engine.inspect_image("localhost/unibake-demo-base:bookworm")
    assert validation["round_trip"]["held_before"] == [full_manifest["image_id"], base_image.id]
    assert full_manifest["diff_ids"][:len(base_image.diff_ids)] == list(base_image.diff_ids)
    assert all(g["passed"] for g in validation["smoke"])
    notes = (fix / "RELEASE_NOTES.md").read_text()
    assert f"## Hotfix on top of {base.name}" in notes and hotfix["base_image_id"] in notes
    assert (fix / "apply.sh").exists() and "apply.sh" in (fix / "SHA256SUMS").read_text()
    # a hotfix on this hotfix would need its base's base too (round trip, apply.sh, push): refused up front
    chained = cli("hotfix", "--from", fix.name, "--version", f"{fix.name}c", "--config", str(demo_product),
                  "--out", str(fix.parent))
    assert chained.code == 2 and f"release {fix.name} is itself a hotfix on {base.name}" in chained.error_lines[-1]
    assert not (fix.parent / f"{fix.name}c").exists()
    print(f"\nhotfix delta {manifest['archive']['bytes']} bytes, full archive {full_manifest['archive']['bytes']} "
          f"bytes: {100 * ratio:.3f} %")

    # The same inputs built in full, from cold, give the very same image.
    out = tmp_path / "full"
    engine.remove_image(manifest["tag"])
    assert release(cli, demo_product, fix.name, out, "--no-cache", "--no-roundtrip").code == 0
    assert json.loads((out / fix.name / "manifest.json").read_text())["image_id"] == manifest["image_id"]
    # and the same SBOM (its serial number and time aside): the assembled hotfix's bottom layers, taken from
    # the base release's records, list what reading them lists
    sboms = [json.loads((folder / "sbom.cdx.json").read_text()) for folder in (fix, out / fix.name)]
    for sbom in sboms:
        sbom.pop("serialNumber", None)
        sbom.get("metadata", {}).pop("timestamp", None)
    assert sboms[0] == sboms[1] and len(sboms[0]["components"]) > 50
    assert cli("verify", str(fix)).code == 0
    # its kit, whose large file's frame was copied from the base release's kit, is the kit written from the
    # checkout with everything compressed anew, byte for byte
    kit = f"demo-llm-{fix.name}-kit.tar.zst"
    again = cli("kit", str(fix), "--out", str(tmp_path / "kit"), "--config", str(demo_product))
    assert again.code == 0, again.err
    assert (tmp_path / "kit" / kit).read_bytes() == (fix / kit).read_bytes()

    # The same hotfix made as one who cannot read the engine's storage makes it (--engine-save): assembled on a
    # small base, the checks run on an image loaded for them: the same image again.
    small = cli("hotfix", "--from", base.name, "--version", fix.name, "--config", str(demo_product),
                "--out", str(fix.parent), "--engine-save", "--force", "--no-smoke")
    assert small.code == 0, small.err
    assert "the steps below the build memo's marker built FROM a small base" in small.err
    assert "in-image checks of tp1, tp2, tp4 passed on the assembled image" in small.err
    assert json.loads((fix / "manifest.json").read_text())["image_id"] == manifest["image_id"]


def test_a_release_made_on_an_earlier_one_copies_its_frames_and_is_the_archive_a_cold_release_writes(
        cli, engine, demo_product, hotfix_pair, version, images, tmp_path):
    """build --from: after one tune-cache change, a whole release assembled on the earlier release's layers (as
    a hotfix is), its archive completed with that release's frames instead of compressing them again: the very
    archive a cold --no-cache release of the same inputs writes, byte for byte, and no hotfix."""
    base, _ = hotfix_pair
    whole = f"{version}w"
    images(f"demo-llm:{whole}")
    previous = json.loads((base / "manifest.json").read_text())
    result = cli("--from", base.name, "--version", whole, "--config", str(demo_product), "--out", str(base.parent))
    assert result.code == 0, result.err
    assert "assembled: the steps below the build memo's marker built alone" in result.err, result.err
    manifest = json.loads((base.parent / whole / "manifest.json").read_text())
    assert manifest["hotfix"] is None and manifest["source_date_epoch"] == int(EPOCH)
    lent = next(i for i, (a, b) in enumerate(zip(manifest["diff_ids"], previous["diff_ids"])) if a != b)
    assert 0 < lent < len(manifest["diff_ids"])
    assert (f"all {len(manifest['diff_ids'])} layers shipped, {lent} of them as release {base.name}'s archive "
            "compressed them (its frames copied, not compressed again)") in result.err
    # the copied big layers' diffIDs from this user's record of the base release's read back, which decoded those
    # very frames (each frame's sha256 matched); every frame still decoded, the other layers hashed
    assert "taken from this user's record of an earlier read back that decoded the same frames" in result.err, result.err
    # the copied frames come first, after the same headers (the biggest layer, then the others bottom up, before
    # the new top layers, whatever their digests): none of them decoded at all, the decoded stream's sha256 resumed
    # after each from the record (the cold release below publishes the same one, decoded whole)
    if RESUMABLE:
        said = re.search(r"(\d+) taken from this user's record of an earlier read back that decoded the same frames "
                         r"\(each copied frame's sha256 matched; (\d+) of them not decoded again: the archive's bytes up "
                         r"to their ends", result.err)
        assert said and said.group(1) == said.group(2), result.err
    assert not (base.parent / whole / "apply.sh").exists()
    validation = json.loads((base.parent / whole / "VALIDATION.json").read_text())
    assert validation["round_trip"]["image_id"] == manifest["image_id"] and validation["round_trip"]["method"] == "stream"
    base_image = engine.inspect_image("localhost/unibake-demo-base:bookworm")
    assert validation["round_trip"]["held_before"] == [previous["image_id"], base_image.id]
    assert all(g["passed"] for g in validation["smoke"])
    assert cli("verify", str(base.parent / whole)).code == 0

    # The same inputs released from cold, without --from, at the same SOURCE_DATE_EPOCH: the same archive.
    out = tmp_path / "cold"
    engine.remove_image(manifest["tag"])
    assert release(cli, demo_product, whole, out, "--no-cache", "--no-roundtrip").code == 0
    cold = json.loads((out / whole / "manifest.json").read_text())
    assert cold["image_id"] == manifest["image_id"] and cold["archive"] == manifest["archive"]
    assert (out / whole / cold["archive"]["name"]).read_bytes() == \
        (base.parent / whole / manifest["archive"]["name"]).read_bytes()


def test_a_hotfix_is_refused_where_its_base_is_missing_and_applies_where_it_is(cli, hotfix_pair):
    base, fix = hotfix_pair
    manifest = json.loads((fix / "manifest.json").read_text())
    with ScratchEngine() as scratch:
        env = {**os.environ, "DOCKER_HOST": scratch.engine.address}
        refused = cli("verify", str(fix), "--load", "--engine", scratch.engine.address)
        assert refused.code == 3 and f"this hotfix needs image {manifest['hotfix']['base_image_id']}" in refused.err
        apply = subprocess.run(["./apply.sh"], cwd=fix, capture_output=True, text=True, env=env)
        assert apply.returncode == 3
        assert f"error: this hotfix needs image {manifest['hotfix']['base_image_id']}" in apply.stderr
        shell = subprocess.run(["sh", str(Path(__file__).resolve().parents[2] / "scripts" / "verify-release.sh"),
                                str(fix)], capture_output=True, text=True, env=env)
        assert shell.returncode == 3 and (  # the base named, not the engine's missing blob
            f"this hotfix needs image {manifest['hotfix']['base_image_id']} (release {base.name})") in shell.stderr
        assert scratch.engine.inspect_image(manifest["image_id"]) is None  # nothing was loaded
        unreachable = subprocess.run(["./apply.sh"], cwd=fix, capture_output=True, text=True,
                                     env={**env, "DOCKER_HOST": f"unix://{fix}/no-engine.sock"})
        assert unreachable.returncode == 1 and "cannot reach the Docker engine" in unreachable.stderr  # not "import"
        bogus = subprocess.run(["./apply.sh", "--bogus"], cwd=fix, capture_output=True, text=True, env=env)
        assert bogus.returncode == 2 and bogus.stderr.startswith("error: usage: ./apply.sh"), bogus.stderr  # not a load
        helped = subprocess.run(["./apply.sh", "--help"], cwd=fix, capture_output=True, text=True, env=env)
        assert helped.returncode == 0 and "Usage: ./apply.sh" in helped.stdout

        # Loaded by hand anyway, the delta fails as a whole: no image, no tag, no layer of it remains.
        delta = fix / manifest["archive"]["name"]
        by_hand = subprocess.run(f"zstd -dc {delta} | docker load", shell=True, capture_output=True, text=True,
                                 env=env)
        assert by_hand.returncode != 0
        assert scratch.engine.inspect_image(manifest["image_id"]) is None
        assert scratch.engine.inspect_image(manifest["tag"]) is None
        assert scratch.engine.api.images(all=True) == []

        archive = base / json.loads((base / "manifest.json").read_text())["archive"]["name"]
        subprocess.run(f"zstd -dc {archive} | docker load", shell=True, check=True, env=env, capture_output=True)
        previous = json.loads((base / "manifest.json").read_text())
        scratch.engine.tag(previous["image_id"], manifest["tag"])  # the hotfix's tag on another image
        moved = subprocess.run(["./apply.sh"], cwd=fix, capture_output=True, text=True, env=env)
        assert moved.returncode == 3 and "loading would move that tag (nothing was loaded)" in moved.stderr
        assert scratch.engine.inspect_image(manifest["image_id"]) is None
        scratch.engine.api.remove_image(manifest["tag"])
        apply = subprocess.run(["./apply.sh"], cwd=fix, capture_output=True, text=True, env=env)
        assert apply.returncode == 0, apply.stderr
        assert scratch.engine.inspect_image(manifest["tag"]).id == manifest["image_id"]
        assert scratch.engine.inspect_image(previous["tag"]).id == previous["image_id"]  # the base is untouched


def test_a_hotfix_verified_in_a_named_engine_leaves_nothing_there(cli, demo_product, hotfix_pair, version, images,
                                                                   tmp_path):
    """--verify-engine: the round trip of a hotfix loads its base release there first (during the
    pass), then the hotfix; both are removed again at the end, as the engine held neither before."""
    base, _ = hotfix_pair
    again = f"{version}c"
    images(f"demo-llm:{again}")
    with ScratchEngine(tmp_path / "verify") as verify:
        result = cli("hotfix", "--from", base.name, "--version", again, "--config", str(demo_product),
                     "--out", str(base.parent), "--verify-engine", verify.engine.address, "--no-smoke")
        assert result.code == 0, result.err
        validation = json.loads((base.parent / again / "VALIDATION.json").read_text())
        assert validation["round_trip"]["engine"] == verify.engine.address and validation["passed"]
        assert verify.engine.api.images(all=True) == []


def test_a_repro_that_fails_after_its_build_leaves_no_repro_tag(cli, engine, busybox_product, version, monkeypatch):
    """The archive's temporary folder cannot be made (the build and normalise done): exit 1, and the
    build's unibake-repro/ tag is gone, as after an interrupt there (before: left in the engine)."""
    import errno

    from unibake import pipeline

    def no_room():
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/unibake-repro-x")
    monkeypatch.setattr(pipeline, "TempFolder", no_room)
    result = cli("repro", "--config", str(busybox_product), "--version", version,
                 env={"CI": "true", "SOURCE_DATE_EPOCH": EPOCH})
    assert result.code == 1 and "No space left" in result.error_lines[-1], result.err
    assert "==> normalise" in result.err
    assert not [t for image in engine.list_images() for t in image.tags if t.startswith("unibake-repro/")]


def test_a_hotfix_on_a_base_whose_lower_steps_changed_since_is_built_whole_not_assembled(cli, engine, busybox_product,
                                                                                         version, images, tmp_path):
    """The build memo holds the steps above its marker as they are now (the engine changed since the
    base release, and a first hotfix built them): a second hotfix on that base is built and exported
    whole, not assembled on the base release's bottom layers (which hold the old engine), and equals a
    cold build of its inputs."""
    out = tmp_path / "release"
    first, second, third = f"{version}a", f"{version}b", f"{version}c"
    for v in (first, second, third):
        images(f"unibake-test:{v}")
    assert release(cli, busybox_product, first, out, "--no-smoke").code == 0
    served = busybox_product.parent / "images/engine/serve.sh"
    served.write_text(served.read_text() + "\n# changed since the base release\n")
    assert cli("lock", "--config", str(busybox_product)).code == 0
    hotfix = ("--config", str(busybox_product), "--out", str(out), "--no-smoke")
    made = cli("hotfix", "--from", first, "--version", second, *hotfix)
    assert made.code == 0, made.err
    assert "(not assembled): the build memo holds no image of the steps above its marker" in made.err
    tune = busybox_product.parent / "images/tune/tp1/cache-1.json"
    tune.write_text(tune.read_text().replace("{", '{"retuned": true, ', 1))
    assert cli("lock", "--config", str(busybox_product)).code == 0
    made = cli("hotfix", "--from", first, "--version", third, *hotfix)
    assert made.code == 0, made.err
    assert f"(not assembled): the steps above the build memo's marker changed since release {first}" in made.err
    manifest = json.loads((out / third / "manifest.json").read_text())
    base = json.loads((out / first / "manifest.json").read_text())
    assert manifest["diff_ids"][1] != base["diff_ids"][1] and manifest["diff_ids"][1] in manifest["hotfix"][
        "shipped_diff_ids"]  # the changed engine's layer ships
    engine.remove_image(manifest["tag"])
    assert release(cli, busybox_product, third, tmp_path / "full", "--no-cache", "--no-roundtrip", "--no-smoke").code == 0
    assert json.loads((tmp_path / "full" / third / "manifest.json").read_text())["image_id"] == manifest["image_id"]


def test_an_assembled_hotfix_keeps_its_small_image_when_another_run_of_its_selection_replaces_it(
        cli, engine, busybox_product, version, images, tmp_path, monkeypatch):
    """Two CI jobs of one selection on one engine: the other job's small build moves the selection's cache tag
    to its own image and removes the image the tag named, just after this job's small build and before its
    export read it (before: the small image went with the tag, and the hotfix failed "No such image"). The
    small image is held by a tag of the run's own, and the run leaves none behind."""
    from unibake import pipeline
    from unibake.builder import CACHE_REPOSITORY, cache_ref

    out = tmp_path / "release"
    first, second = f"{version}a", f"{version}b"
    for v in (first, second):
        images(f"unibake-test:{v}")
    assert release(cli, busybox_product, first, out, "--no-smoke").code == 0
    tune = busybox_product.parent / "images/tune/tp1/cache-1.json"
    tune.write_text(tune.read_text().replace("{", '{"retuned": true, ', 1))
    assert cli("lock", "--config", str(busybox_product)).code == 0
    assembled, other_run = pipeline._assembled, []

    def then_another_run(run, plan, *args):
        built = assembled(run, plan, *args)
        if built is not None and built.assembled is not None:
            small_ref = cache_ref(plan.product, run["context"].selection, "assembled")
            assert engine.inspect_image(small_ref).id == built.assembled.small
            engine.tag(f"unibake-test:{first}", small_ref)  # (any other image: the other job's small one)
            other_run.append((small_ref, built.assembled.small, engine.remove_if_unused(built.assembled.small)))
        return built

    monkeypatch.setattr(pipeline, "_assembled", then_another_run)
    made = cli("hotfix", "--from", first, "--version", second, "--config", str(busybox_product), "--out", str(out),
               "--no-smoke")
    assert made.code == 0, made.err
    [(small_ref, small, removed)] = other_run
    assert not removed  # the run's own tag kept it
    assert (out / second / "manifest.json").is_file()
    # the run's own tags (the small image's, the small base's) are gone with it, and so is its small image, which
    # no tag names now
    own = [t for i in engine.list_images() for t in i.tags
           if t.startswith(f"{CACHE_REPOSITORY}/unibake-test:") and "-assembled" in t and t != small_ref]
    assert not own and engine.inspect_image(small) is None
    engine.untag(small_ref)

def test_a_hotfix_on_a_release_whose_dockerfile_laid_its_steps_out_otherwise_is_built_whole(
        cli, engine, busybox_product, version, images, tmp_path, monkeypatch):
    """A release rendered with ENTRYPOINT and CMD at the Dockerfile's end, as unibake did before they moved
    above the build memo's marker: the same layers under other steps. A hotfix on it, once the build memo
    holds the new layout's image, is built and exported whole, the reason said (not assembled on a history
    that is not the memo image's, which the export would refuse), and its image is the one a cold build gives."""
    old = tmp_path / "templates"
    shutil.copytree(templates.TEMPLATES, old)
    text = (old / "Dockerfile.j2").read_text()
    launcher = 'ENTRYPOINT ["{{ root }}/meta/entrypoint.sh"]\nCMD ["serve"]\n'
    assert text.count(launcher) == 1 and text.endswith('io.unibake.schema="1"\n')
    (old / "Dockerfile.j2").write_text(text.replace(launcher, "") + launcher)
    out = tmp_path / "release"
    first, second, third = f"{version}a", f"{version}b", f"{version}c"
    for v in (first, second, third):
        images(f"unibake-test:{v}")
    with monkeypatch.context() as patched:
        patched.setattr(templates, "TEMPLATES", old)
        patched.setattr(templates, "environment", templates.environment.__wrapped__)
        assert release(cli, busybox_product, first, out, "--no-smoke").code == 0
    assert 'CMD ["serve"]' in engine.history(f"unibake-test:{first}")[-1]  # (the old layout: the launcher last)
    hotfix = ("--config", str(busybox_product), "--out", str(out), "--no-smoke")
    tune = busybox_product.parent / "images/tune/tp1/cache-1.json"
    for v, mark in ((second, "1"), (third, "2")):
        tune.write_text(tune.read_text().replace("{", f'{{"retuned{mark}": true, ', 1))
        assert cli("lock", "--config", str(busybox_product)).code == 0
        made = cli("hotfix", "--from", first, "--version", v, *hotfix)
        assert made.code == 0, made.err
    assert "(not assembled): the build memo holds no image of the steps above its marker" not in made.err
    assert (f"(not assembled): release {first}'s history of the steps above the build memo's marker is not the memo "
            "image's") in made.err
    manifest = json.loads((out / third / "manifest.json").read_text())
    assert manifest["diff_ids"][:2] == json.loads((out / first / "manifest.json").read_text())["diff_ids"][:2]
    engine.remove_image(manifest["tag"])
    assert release(cli, busybox_product, third, tmp_path / "full", "--no-cache", "--no-roundtrip", "--no-smoke").code == 0
    assert json.loads((tmp_path / "full" / third / "manifest.json").read_text())["image_id"] == manifest["image_id"]


def test_a_release_without_from_is_made_on_the_newest_release_at_its_epoch_and_is_the_same_bytes(
        cli, engine, busybox_product, version, images, tmp_path):
    """build without --from, after one tune-cache change: made on the newest earlier release under --out at the
    same SOURCE_DATE_EPOCH, as --from it would be (its verify engine holding it), and the very release --no-from
    makes; one at another epoch, or an earlier release that does not verify, leaves the release made alone."""
    out = tmp_path / "release"
    first, second, third, fourth, fifth, sixth = (f"{version}{s}" for s in "abcdef")
    for v in (first, second, third, fourth, fifth, sixth):
        images(f"unibake-test:{v}")
    base_id = engine.inspect_image("localhost/unibake-busybox:1").id
    tune = busybox_product.parent / "images/tune/tp2/cache-1.json"

    def change(text: str) -> None:
        tune.write_text(json.dumps({"tp2_cache": text}))
        assert cli("lock", "--config", str(busybox_product)).code == 0

    def validation(v: str) -> dict:
        return json.loads((out / v / "VALIDATION.json").read_text())

    def flip_a_byte_of_the_archive(v: str) -> None:
        archive = out / v / json.loads((out / v / "manifest.json").read_text())["archive"]["files"][0]["name"]
        data = bytearray(archive.read_bytes())
        data[len(data) // 2] ^= 0xFF
        archive.write_bytes(bytes(data))

    made = release(cli, busybox_product, first, out, "--no-smoke")
    assert made.code == 0, made.err
    assert f"no release of tp1, tp2 under --out at SOURCE_DATE_EPOCH={EPOCH}: this release is made alone" in made.err
    first_id = json.loads((out / first / "manifest.json").read_text())["image_id"]

    change("retuned")
    made = release(cli, busybox_product, second, out, "--no-smoke")
    assert made.code == 0, made.err
    assert f"made on release {first}, the newest under --out at SOURCE_DATE_EPOCH={EPOCH}" in made.err
    assert validation(second)["round_trip"]["held_before"] == [first_id, base_id]
    provenance = json.loads((out / second / "provenance.intoto.json").read_text())
    assert provenance["predicate"]["buildDefinition"]["externalParameters"]["made_on"] == first
    on_first = json.loads((out / second / "manifest.json").read_text())
    assert on_first["hotfix"] is None and not (out / second / "apply.sh").exists()
    assert cli("verify", str(out / second)).code == 0

    alone = release(cli, busybox_product, second, out, "--no-smoke", "--force", "--no-from")
    assert alone.code == 0, alone.err
    assert "made on release" not in alone.err and validation(second)["round_trip"]["held_before"] == [base_id]
    manifest = json.loads((out / second / "manifest.json").read_text())
    assert (manifest["image_id"], manifest["archive"]) == (on_first["image_id"], on_first["archive"])
    assert "made_on" not in json.loads((out / second / "provenance.intoto.json").read_text())[
        "predicate"]["buildDefinition"]["externalParameters"]

    # another SOURCE_DATE_EPOCH (a commit since): every layer of ours differs; made alone, --from said
    change("again")
    made = release(cli, busybox_product, third, out, "--no-smoke", epoch=str(int(EPOCH) + 60))
    assert made.code == 0, made.err
    assert (f"no release of tp1, tp2 under --out at SOURCE_DATE_EPOCH={int(EPOCH) + 60}: this release is made alone "
            f"(--from "
            f"{second} makes it on release {second}") in made.err
    assert validation(third)["round_trip"]["held_before"] == [base_id]

    # the newest at the epoch does not verify: said, and the release made alone
    sums = out / second / "SHA256SUMS"
    sums.write_text(sums.read_text().replace("  manifest.json", "  manifest.json\n" + "0" * 64 + "  run.sh", 1))
    made = release(cli, busybox_product, fourth, out, "--no-smoke")
    assert made.code == 0, made.err
    assert f"warning: release {second} under --out is not used to make this release on: " in made.err
    assert validation(fourth)["round_trip"]["held_before"] == [base_id]

    # its archive found changed only as it is read, beside the build: exit 3 naming it, and --no-from
    flip_a_byte_of_the_archive(fourth)
    change("once more")
    made = release(cli, busybox_product, fifth, out, "--no-smoke")
    assert made.code == 3 and made.error_lines[-1].startswith(f"error: the base release {out / fourth}: "), made.err
    assert made.error_lines[-1].endswith("this release was being made on it, the newest release under --out at its "
                                         "SOURCE_DATE_EPOCH (--no-from makes a release without it)")
    assert not (out / fifth).exists()
    made = release(cli, busybox_product, fifth, out, "--no-smoke", "--no-from")
    assert made.code == 0, made.err
    assert validation(fifth)["round_trip"]["held_before"] == [base_id]

    # the newest no longer in the engine: built whole, and its archive (changed here) not waited for nor read
    engine.remove_image(f"unibake-test:{fifth}")
    flip_a_byte_of_the_archive(fifth)
    change("and again")
    made = release(cli, busybox_product, sixth, out, "--no-smoke")
    assert made.code == 0, made.err
    assert f"the engine does not hold release {fifth}'s image" in made.err
    assert f"release {fifth} is not used after all: this release is made alone" in made.err
    assert validation(sixth)["round_trip"]["held_before"] == [base_id]
    assert "made_on" not in json.loads((out / sixth / "provenance.intoto.json").read_text())[
        "predicate"]["buildDefinition"]["externalParameters"]  # (made alone after all: on no release)

    # a hotfix made on the newest since: the next release is made on that one (never on a hotfix), and follows the
    # hotfix all the same, as the release made alone (--no-from) does; what it is made on changes none of its files
    hot, after = f"{version}g", f"{version}h"
    for v in (hot, after):
        images(f"unibake-test:{v}")
    change("hot")
    made = cli("hotfix", "--from", sixth, "--version", hot, "--config", str(busybox_product), "--out", str(out),
               "--no-smoke", env={"CI": "true"})
    assert made.code == 0, made.err
    change("after the hotfix")
    made = release(cli, busybox_product, after, out, "--no-smoke")
    assert made.code == 0, made.err
    assert f"made on release {sixth}, the newest under --out at SOURCE_DATE_EPOCH={EPOCH}" in made.err
    assert json.loads((out / after / "manifest.json").read_text())["previous"] == hot


def test_a_release_of_one_profile_is_made_on_an_earlier_release_of_that_profile_never_on_another_selection(
        cli, engine, busybox_product, version, images, tmp_path):
    """The in-image checks of another selection of profiles are another step: a tp2 release at the epoch of a newer
    release of tp1 and tp2 is made on the earlier tp2 release, and one of tp1 and tp2 is not made on a tp2 one.
    Asked for with --from, a release of another selection is built whole on it (before: made on the newest at the
    epoch whatever its profiles, a tp2 release after a tp1 one failed, exit 3, "make the hotfix with --full-build")."""
    out = tmp_path / "release"
    first, second, third, fourth = (f"{version}{s}" for s in "abcd")
    for tag in (f"{first}-tp2", second, f"{third}-tp2", f"{fourth}-tp2"):
        images(f"unibake-test:{tag}")
    tune = busybox_product.parent / "images/tune/tp2/cache-1.json"

    def change(text: str) -> None:
        tune.write_text(json.dumps({"tp2_cache": text}))
        assert cli("lock", "--config", str(busybox_product)).code == 0

    made = release(cli, busybox_product, first, out, "--no-smoke", "--profile", "tp2")
    assert made.code == 0, made.err
    change("retuned")
    made = release(cli, busybox_product, second, out, "--no-smoke")
    assert made.code == 0, made.err
    assert f"no release of tp1, tp2 under --out at SOURCE_DATE_EPOCH={EPOCH}: this release is made alone" in made.err
    change("again")
    made = release(cli, busybox_product, third, out, "--no-smoke", "--profile", "tp2")
    assert made.code == 0, made.err
    assert f"made on release {first}-tp2, the newest under --out at SOURCE_DATE_EPOCH={EPOCH}" in made.err
    assert "assembling the image: " in made.err and "the whole image is built" not in made.err
    made = release(cli, busybox_product, fourth, out, "--no-smoke", "--profile", "tp2", "--from", second)
    assert made.code == 0, made.err
    assert (f"the whole image is built and exported (not assembled): release {second}'s in-image checks are another "
            "step than this build's") in made.err
    assert cli("verify", str(out / f"{fourth}-tp2")).code == 0
