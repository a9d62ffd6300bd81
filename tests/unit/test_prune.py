"""prune: old release images and build cache leave the engine; kept releases and foreign images stay."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from unibake.archive_reader import read_archive
from unibake.builder import cache_ref, keep_as_cache
from unibake.metadata import METADATA_LABEL
from unibake.prune import prune
from unibake.publish import find_releases

from ..fake_engine import FakeEngine
from ..forge import resum
from ..savefixtures import layer_tar
from .test_publish import METADATA, make_release


def built_by_unibake(tag: str) -> dict[str, str]:
    """The labels unibake's build gives a release's image: its metadata names the product and tag."""
    return {METADATA_LABEL: json.dumps({**METADATA, "version": tag, "tag": f"demo-llm:{tag}"})}


# unibake's Dockerfile ends so (templates/Dockerfile.j2), in the classic builder's words
OWN_HISTORY = [{"created_by": "/bin/sh -c #(nop) COPY dir:abc in /opt/unibake/engine/"},
               {"created_by": "/bin/sh -c #(nop)  LABEL org.opencontainers.image.title=demo-llm io.unibake.schema=1"},
               {"created_by": '/bin/sh -c #(nop)  ENTRYPOINT ["/opt/unibake/meta/entrypoint.sh"]'},
               {"created_by": '/bin/sh -c #(nop)  CMD ["serve"]'}]


def test_prune_keeps_the_newest_releases_and_removes_the_rest(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    for n, tag in enumerate(("1.3.0", "1.3.1", "1.3.2")):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag))
        engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))  # the engine holds each release's image
    dangling = engine.add({"config": {"Labels": built_by_unibake("1.2.9")}, "history": OWN_HISTORY}, [b"an old build"])
    cache = engine.add({"config": {}}, [b"cache"])
    keep_as_cache(engine, cache_ref("demo-llm", "all", "build"), cache)
    foreign = engine.add({"config": {}}, [b"not ours"], tag="someone/else:1")
    # a killed repro's build tag (each run's its own since they no longer share unibake-repro/P:1)
    dead = f"unibake-repro/demo-llm:1-{_ended_pid()}xabcdef"
    engine.add({"config": {}}, [b"repro"], tag=dead)

    # more to keep than there are versions (the default --keep 3 of 3, or 5): every release stays
    for keep in (3, 5):
        assert not any(r.ref.startswith("demo-llm:") for r in prune(engine, out, keep=keep, dry_run=True))
    planned = prune(engine, out, keep=2, dry_run=True)
    assert {r.ref for r in planned} == {"demo-llm:1.3.0", "unibake-cache/demo-llm:all-build", dangling,
                                        dead}
    assert engine.inspect_image("demo-llm:1.3.0") is not None  # a dry run removes nothing

    prune(engine, out, keep=2)
    assert engine.inspect_image("demo-llm:1.3.0") is None
    assert engine.inspect_image("demo-llm:1.3.2") is not None and engine.inspect_image("demo-llm:1.3.1") is not None
    assert engine.inspect_image(cache_ref("demo-llm", "all", "build")) is None
    assert engine.inspect_image(foreign) is not None
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["1.3.0", "1.3.1", "1.3.2"]


def _ended_pid() -> int:
    """The ID of a process that has ended (not reused in the moment a test takes)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_prune_keeps_the_own_tags_of_a_run_still_going_and_removes_a_killed_one_s(tmp_path):
    # a run's own tags hold what it reads (the memo's images, an assembled hotfix's small image, a kit rebuild,
    # a repro's build): prune while it runs untagged them, and the last tag took a leaf image with it
    engine = FakeEngine()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = [f"unibake-cache/demo-llm:all-hold{running.pid}xabcdef-0",
                f"unibake-cache/demo-llm:all-assembled-{running.pid}x0a1b2c",
                f"unibake-cache/demo-llm:all-assembled-base-{running.pid}x0a1b2c",
                f"unibake-cache/demo-llm:kit-1.3.1-rebuild{running.pid}xfedcba",
                f"unibake-repro/demo-llm:2-{running.pid}xabcdef"]
        ended = f"unibake-cache/demo-llm:all-hold{_ended_pid()}xabcdef-0"
        for n, tag in enumerate([*live, ended]):
            engine.add({"config": {}}, [b"image %d" % n], tag=tag)
        done = {r.ref: r for r in prune(engine, tmp_path / "release", keep=2)}
        assert set(done) == {*live, ended}
        for tag in live:
            assert done[tag].kept == f"the run of process {running.pid} holds it, and that process is running"
            assert engine.inspect_image(tag) is not None
        assert not done[ended].kept and engine.inspect_image(ended) is None
    finally:
        running.kill()
        running.wait()
    assert not any(r.kept for r in prune(engine, tmp_path / "release", keep=2))  # its run ended: they go
    assert not any(engine.inspect_image(tag) for tag in live)


def test_copies_of_one_release_folder_name_its_image_once(tmp_path):
    # found by probing: a release folder copied under --out twice (1.3.0, and copies named otherwise) listed
    # `would remove demo-llm:1.3.0` three times, and counted it three times
    import shutil

    out = tmp_path / "release"
    engine = FakeEngine()
    for n, tag in enumerate(("1.3.0", "1.3.1", "1.3.2")):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag))
        engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))
    for copy in ("1.3.0-copy", "1.3.0-old"):
        shutil.copytree(out / "1.3.0", out / copy)
    planned = prune(engine, out, keep=2, dry_run=True)
    assert [r.ref for r in planned] == ["demo-llm:1.3.0"], planned


def test_keeping_a_cache_role_replaces_and_removes_the_image_it_named():
    engine = FakeEngine()
    old, new = engine.add({"config": {}}, [b"old"]), engine.add({"config": {}}, [b"new"])
    ref = cache_ref("demo", "all", "build")
    keep_as_cache(engine, ref, old)
    keep_as_cache(engine, ref, new)
    assert engine.inspect_image(ref).id == new and engine.inspect_image(old) is None
    long = cache_ref("demo", "-".join(f"tp{i}" for i in range(40)), "stage1")
    assert len(long.split(":", 1)[1]) <= 128


def test_a_folder_naming_an_image_unibake_did_not_make_removes_nothing(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    for n, tag in enumerate(("1.0", "1.1")):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag))
        engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))
    foreign = engine.add({"config": {}}, [b"a database"], tag="postgres:15")
    forged = out / "zz-forged"  # a folder holding only a manifest that names the foreign image, as old
    forged.mkdir()
    manifest = json.loads((out / "1.0" / "manifest.json").read_text())
    manifest.update(tag="postgres:15", image_id=foreign, published="1970-01-01T00:00:00Z",
                    first_published="1970-01-01T00:00:00Z")
    (forged / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(forged)  # (its SHA256SUMS lists it: one that did not would be an unreadable folder, keeping every image)
    planned = prune(engine, out, keep=1)
    assert "postgres:15" not in {r.ref for r in planned} and engine.inspect_image("postgres:15") is not None
    assert engine.inspect_image("demo-llm:1.0") is None  # the real old release still goes


def _release(out, engine, tag, n, force=False, **fields):
    """A release folder of demo-llm:``tag`` whose image the engine holds; ``fields`` rewrite its manifest
    (``published`` its first release's time too, unless ``first_published`` is given)."""
    folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag),
                             force=force)
    engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))
    manifest = json.loads((folder / "manifest.json").read_text())
    if "published" in fields:
        fields.setdefault("first_published", fields["published"])
    manifest.update(fields)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)  # (as a release whose manifest says so was published: its SHA256SUMS lists it)
    return manifest


def test_an_image_built_from_a_release_is_the_users_and_a_container_keeps_any_image(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    labels = {**built_by_unibake("1.3.0"), "io.unibake.source-date-epoch": "0"}
    ours = engine.add({"config": {"Labels": labels}, "history": OWN_HISTORY}, [b"an old build"])
    used = engine.add({"config": {"Labels": labels}, "history": OWN_HISTORY[1:]}, [b"an older build"])
    engine.start(used, ["true"])  # docker create --name c <id>
    # FROM demo-llm:1.3.0 / RUN echo x >/u, left untagged: it inherits every label of the release
    child = engine.add({"config": {"Labels": labels},
                        "history": [*OWN_HISTORY, {"created_by": "/bin/sh -c echo x >/u"}]}, [b"an old build", b"x"])
    again = engine.add({"config": {"Labels": labels},  # FROM the release, its own last steps written again
                        "history": [*OWN_HISTORY, *OWN_HISTORY[2:]]}, [b"an old build"])
    cache = engine.add({"config": {}}, [b"cache"])
    keep_as_cache(engine, cache_ref("demo-llm", "all", "build"), cache)
    engine.start(cache, ["true"])

    planned = prune(engine, out, keep=2, dry_run=True)
    assert {r.ref for r in planned} == {ours, used, "unibake-cache/demo-llm:all-build"}
    lines = []
    done = prune(engine, out, keep=2, on_line=lines.append)
    assert engine.inspect_image(ours) is None
    assert engine.inspect_image(child) is not None and engine.inspect_image(again) is not None
    assert engine.inspect_image(used) is not None and engine.inspect_image(cache_ref("demo-llm", "all", "build"))
    assert {r.ref for r in done if r.kept} == {used, "unibake-cache/demo-llm:all-build"}
    assert f"    kept {used} (a dangling image unibake built; a container or another image uses it)" in lines


def test_the_base_of_a_kept_hotfix_is_kept_with_it(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    base = _release(out, engine, "hk1", 1, published="2026-01-01T00:00:01Z")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    _release(out, engine, "hk3", 3, published="2026-01-01T00:00:03Z")
    _release(out, engine, "hk4", 4, published="2026-01-01T00:00:04Z")
    hotfix = {"base_release": "hk1", "base_tag": base["tag"], "base_image_id": base["image_id"],
              "base_archive_bytes": 1, "omitted_diff_ids": [], "shipped_diff_ids": []}
    _release(out, engine, "hk5", 5, published="2026-01-01T00:00:05Z", hotfix=hotfix)  # hotfix --from hk1
    planned = prune(engine, out, keep=2, dry_run=True)
    assert {r.ref for r in planned} == {"demo-llm:hk2", "demo-llm:hk3"}  # hk1: what verify --load hk5 needs
    hk2 = engine.tags.pop("demo-llm:hk2")  # the tags moved on: hk1's and hk2's images are dangling now
    engine.add({"config": {}}, [b"another"], tag="demo-llm:hk2")
    del engine.tags["demo-llm:hk1"]
    planned = prune(engine, out, keep=2)
    assert {r.ref for r in planned} == {hk2, "demo-llm:hk3"}
    assert engine.inspect_image(base["image_id"]) is not None and engine.inspect_image(hk2) is None


def test_the_platforms_of_a_version_count_as_one_release(tmp_path):
    out = tmp_path / "release"
    engine = FakeEngine()
    _release(out, engine, "hk3", 3, published="2026-01-01T00:00:03Z")
    _release(out, engine, "hk3-arm64", 30, published="2026-01-01T00:00:03Z", version="hk3")
    _release(out, engine, "hk4", 4, published="2026-01-01T00:00:04Z")  # --platform linux/amd64,linux/arm64
    _release(out, engine, "hk4-arm64", 40, published="2026-01-01T00:00:04Z", version="hk4")
    planned = prune(engine, out, keep=1, dry_run=True)
    assert {r.ref for r in planned} == {"demo-llm:hk3", "demo-llm:hk3-arm64"}


def test_a_force_re_release_of_an_older_version_keeps_its_place_by_its_first_release(tmp_path):
    # (before: versions were ranked by when their folders were published: hk1 made again with --force
    # after hk2 was the newer, and --keep 1 removed hk2's image, the newest release's)
    out = tmp_path / "release"
    engine = FakeEngine()
    old = _release(out, engine, "hk0", 0, published="2026-01-01T00:00:00Z")
    del old["first_published"]  # a release made before the first release's time was recorded
    (out / "hk0" / "manifest.json").write_text(json.dumps(old, indent=2) + "\n")
    resum(out / "hk0")
    _release(out, engine, "hk1", 1, published="2026-01-01T00:00:01Z")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    _release(out, engine, "hk1", 11, force=True, published="2026-01-01T00:00:03Z",
             first_published="2026-01-01T00:00:01Z")
    assert [r.folder.name for r in find_releases(out)] == ["hk0", "hk1", "hk2"]
    assert {r.ref for r in prune(engine, out, keep=1, dry_run=True)} == {"demo-llm:hk0", "demo-llm:hk1"}
    assert {r.ref for r in prune(engine, out, keep=2, dry_run=True)} == {"demo-llm:hk0"}


def test_a_release_folder_that_cannot_be_read_keeps_every_release_image_and_is_said(tmp_path):
    # the newest release, a hotfix on hk1, has a damaged manifest: counted out, it let prune --keep 1
    # keep hk2 and remove hk1's image, the base the newest release needs
    out = tmp_path / "release"
    engine = FakeEngine()
    base = _release(out, engine, "hk1", 1, published="2026-01-01T00:00:01Z")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    hotfix = {"base_release": "hk1", "base_tag": base["tag"], "base_image_id": base["image_id"],
              "base_archive_bytes": 1, "omitted_diff_ids": [], "shipped_diff_ids": []}
    _release(out, engine, "hk5", 5, published="2026-01-01T00:00:05Z", hotfix=hotfix)
    assert {r.ref for r in prune(engine, out, keep=1, dry_run=True)} == {"demo-llm:hk2"}
    manifest = out / "hk5" / "manifest.json"
    manifest.write_text(manifest.read_text()[:-1])
    del engine.tags["demo-llm:hk1"]  # its image dangling, as after a build that moved the tag
    cache = engine.add({"config": {}}, [b"cache"])
    keep_as_cache(engine, cache_ref("demo-llm", "all", "build"), cache)
    warnings = []
    done = prune(engine, out, keep=1, on_warning=warnings.append)
    assert {r.ref for r in done} == {"unibake-cache/demo-llm:all-build"}  # build cache still goes
    assert engine.inspect_image(base["image_id"]) is not None and engine.inspect_image("demo-llm:hk2") is not None
    [warning] = warnings
    assert warning.startswith(f"the release folder {out / 'hk5'} has a manifest.json that cannot be read, or that its "
                              "SHA256SUMS does not list: prune cannot tell which images it needs, so it removes build "
                              f"cache only; check it with python build.py verify {out / 'hk5'}, then fix or move it ("), \
        warning


def test_a_folder_whose_sums_do_not_list_its_manifest_is_neither_the_previous_release_nor_ranked_by_prune(tmp_path):
    # found by review: a copy of a release with first_published 2099 (not summed again) was the newest: the next
    # release's notes and roll-back named it, and prune --keep 1 removed the real newest release's image
    from unibake.publish import previous_release

    out = tmp_path / "release"
    engine = FakeEngine()
    _release(out, engine, "hk1", 1, published="2026-01-01T00:00:01Z")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    shutil.copytree(out / "hk1", out / "hk0")
    manifest = json.loads((out / "hk0" / "manifest.json").read_text())
    manifest.update(release="hk0", published="2099-01-01T00:00:00Z", first_published="2099-01-01T00:00:00Z")
    (out / "hk0" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    assert previous_release(out, "demo-llm", "hk3").release == "hk2"
    warnings = []
    done = prune(engine, out, keep=1, on_warning=warnings.append)
    assert not [r for r in done if r.ref.startswith("demo-llm:")]  # nothing of a release, as for an unreadable one
    assert engine.inspect_image("demo-llm:hk2") is not None and engine.inspect_image("demo-llm:hk1") is not None
    assert [f"{out / 'hk0'} has a manifest.json that cannot be read, or that its SHA256SUMS does not list" in w
            and "does not list manifest.json as it is" in w for w in warnings] == [True], warnings

@pytest.mark.parametrize("published", ["zzz", "2026-01-01T00:00:09+05:00", "9999"])
def test_a_hand_edited_published_that_is_no_utc_time_is_an_unreadable_folder_not_ranked_as_text(tmp_path, cli,
                                                                                                 published):
    # (before: published had no format of its own: a hand-edited 'zzz', without first_published, was
    # ranked as text above every time, hk1 counted as the newest and prune --keep 1 removed hk2's image)
    out = tmp_path / "release"
    engine = FakeEngine()
    old = _release(out, engine, "hk1", 1, published=published)
    del old["first_published"]  # as a release made before it was recorded
    (out / "hk1" / "manifest.json").write_text(json.dumps(old, indent=2) + "\n")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    warnings = []
    done = prune(engine, out, keep=1, on_warning=warnings.append)
    assert done == [] and engine.inspect_image("demo-llm:hk2") is not None
    assert engine.inspect_image("demo-llm:hk1") is not None
    assert [f"{out / 'hk1'} has a manifest.json that cannot be read, or that its SHA256SUMS does not list" in w
            for w in warnings] == [True]
    assert [r.folder.name for r in find_releases(out) if r.manifest is None] == ["hk1"]
    assert "published" in find_releases(out)[-1].problem
    listed = cli("releases", "--out", str(out))
    assert "published" in listed.out + listed.err


def test_prune_keeps_the_image_of_a_release_a_run_holds_a_hotfix_on_it_or_a_force_run(tmp_path):
    # a hotfix on hk1, older than --keep, reads hk1 until it ends (the local engine's hk1 saves it
    # loading the shared layers back); a --force run of hk1 puts its old image back if it fails
    import pytest

    from unibake.errors import UnibakeError
    from unibake.publish import ReleaseFolder, hold_release, lock_release

    out = tmp_path / "release"
    engine = FakeEngine()
    for n in (1, 2, 3):
        _release(out, engine, f"hk{n}", n, published=f"2026-01-01T00:00:0{n}Z")
    hotfix = hold_release(out, "hk1")
    lines = []
    done = prune(engine, out, keep=1, on_line=lines.append)
    assert {(r.ref, bool(r.kept)) for r in done} == {("demo-llm:hk1", True), ("demo-llm:hk2", False)}
    assert f"    kept demo-llm:hk1 (release hk1 of demo-llm, older than the newest 1; a run is using release " \
           f"{out / 'hk1'} (pid {os.getpid()}))" in lines
    assert engine.inspect_image("demo-llm:hk1") is not None and engine.inspect_image("demo-llm:hk2") is None
    hotfix.close()
    (out / ".hk2.lock").write_text("1\n")  # the pid of the run that wrote hk2, long gone
    lock = lock_release(out, "hk2")  # as prune holds it while it removes hk2's image
    with pytest.raises(UnibakeError, match=rf"another run is writing release {out / 'hk2'} \(pid {os.getpid()}\)"):
        ReleaseFolder(out, "hk2", force=True).__enter__()
    lock.close()
    with ReleaseFolder(out, "hk1", force=True):  # build --version hk1 --force, under way
        assert [r.kept for r in prune(engine, out, keep=1, dry_run=True)] == \
            [f"a run is using release {out / 'hk1'} (pid {os.getpid()})"]
    assert [r.ref for r in prune(engine, out, keep=1) if not r.kept] == ["demo-llm:hk1"]


def test_prune_through_a_linked_release_folder_keeps_an_image_a_run_under_the_link_s_target_uses(tmp_path):
    # (before: prune held release/.hk1.lock only: a hotfix made on /mnt/big/hk1 with --out /mnt/big, or a
    # --force run there, holds /mnt/big/.hk1.lock, and prune --keep 1 removed the image it was using)
    from unibake.publish import ReleaseFolder, hold_release

    out, big = tmp_path / "release", tmp_path / "big"
    engine = FakeEngine()
    _release(big, engine, "hk1", 1, published="2026-01-01T00:00:01Z")
    out.mkdir()
    (out / "hk1").symlink_to(big / "hk1")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    hotfix = hold_release(big, "hk1")
    lines = []
    done = prune(engine, out, keep=1, on_line=lines.append)
    assert [(r.ref, r.kept) for r in done] == [("demo-llm:hk1", f"a run is using release {big / 'hk1'} "
                                                                 f"(pid {os.getpid()})")]
    assert engine.inspect_image("demo-llm:hk1") is not None
    hotfix.close()
    with ReleaseFolder(big, "hk1", force=True):  # build --out /mnt/big --version hk1 --force, under way
        assert [r.kept for r in prune(engine, out, keep=1, dry_run=True)] == \
            [f"a run is using release {big / 'hk1'} (pid {os.getpid()})"]
    assert [r.ref for r in prune(engine, out, keep=1) if not r.kept] == ["demo-llm:hk1"]
    assert sorted(os.listdir(big)) == [".hk1.lock", "hk1"]


def test_prune_removes_what_killed_runs_left_under_out_but_not_what_a_run_is_writing(tmp_path):
    # a SIGKILLed run leaves .TAG.partial (its staged archive: gigabytes), a killed commit .TAG.old
    # beside TAG; only the next run of that very tag removed them
    from unibake.prune import remove_leftovers
    from unibake.publish import ReleaseFolder

    out = tmp_path / "release"
    _release(out, FakeEngine(), "1.0", 1)
    for name in (".1.0.old", ".1.1.partial", ".1.0.amend", ".2.0.old"):
        (out / name).mkdir()
        (out / name / "demo-llm-x.tar.zst").write_bytes(b"x" * 100)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / ".1.2.partial").symlink_to(elsewhere)
    with ReleaseFolder(out, "1.3", force=False):  # a run writing 1.3: its staging folder is its own
        assert remove_leftovers(out, dry_run=True) == [out / ".1.0.amend", out / ".1.0.old", out / ".1.1.partial"]
        assert (out / ".1.1.partial").is_dir()  # a dry run removes nothing
        assert remove_leftovers(out) == [out / ".1.0.amend", out / ".1.0.old", out / ".1.1.partial"]
        assert (out / ".1.3.partial").is_dir()
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock")) == \
        [".1.2.partial", ".2.0.old", "1.0"]  # .2.0.old is release 2.0, set aside: the next run of 2.0 puts it back
    assert elsewhere.is_dir()


def test_prune_removes_the_checksums_record_a_killed_run_left_but_not_a_running_one_s_nor_another_out_s(tmp_path):
    # (before: checksums/.1.0.SHA256SUMS.tmp, written before the commit, stayed when the run was killed)
    from unibake.prune import remove_leftovers
    from unibake.publish import ReleaseFolder, record_temp

    out, sibling = tmp_path / "release", tmp_path / "release-b"
    _release(out, FakeEngine(), "1.0", 1)
    (out / ".1.1.lock").touch()  # the killed run's lock file stays, let go
    killed = record_temp(tmp_path / "checksums" / "1.1.SHA256SUMS", out / "1.1")
    running = record_temp(tmp_path / "checksums" / "1.3.SHA256SUMS", out / "1.3")
    others = record_temp(tmp_path / "checksums" / "1.1.SHA256SUMS", sibling / "1.1")
    for path in (killed, running, others):
        path.write_text("x" * 64 + "  demo-llm-x.tar.zst\n")
    with ReleaseFolder(out, "1.3", force=False):  # a run writing 1.3: its record is its own
        assert remove_leftovers(out, dry_run=True) == [killed]
        assert killed.exists()
        assert remove_leftovers(out) == [killed]
    assert sorted(os.listdir(tmp_path / "checksums")) == sorted(["1.0.SHA256SUMS", running.name, others.name])


def test_prune_removes_the_checksums_record_an_older_unibake_s_killed_run_left_unless_a_run_of_its_tag_is_on(
        tmp_path):
    # (before: checksums/.1.1.SHA256SUMS.tmp, the temporary record of an unibake that named it by the tag
    # alone, was never removed: no --out's key in its name, so no prune took it for its own)
    from unibake.prune import remove_leftovers
    from unibake.publish import ReleaseFolder

    out, sibling = tmp_path / "release", tmp_path / "release-b"
    _release(out, FakeEngine(), "1.0", 1)
    checksums = tmp_path / "checksums"
    (out / ".1.1.lock").touch()  # the killed run's lock file stays, let go
    killed, running = checksums / ".1.1.SHA256SUMS.tmp", checksums / ".1.2.SHA256SUMS.tmp"
    for path in (killed, running):
        path.write_text("x" * 64 + "  demo-llm-x.tar.zst\n")
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own\n")
    (checksums / ".1.4.SHA256SUMS.tmp").symlink_to(mine)  # never followed nor removed: no run makes links
    (checksums / ".1.5.SHA256SUMS.tmp").mkdir()
    os.mkfifo(checksums / ".1.6.SHA256SUMS.tmp")
    (checksums / "..SHA256SUMS.tmp").write_text("no tag\n")
    before = sorted(os.listdir(checksums))
    with ReleaseFolder(sibling, "1.2", force=False):  # a run of 1.2 under another --out: the name may be its
        assert remove_leftovers(out, dry_run=True) == [killed]
        assert sorted(os.listdir(checksums)) == before
        assert remove_leftovers(out) == [killed]
    assert sorted(os.listdir(checksums)) == sorted(set(before) - {killed.name})
    assert mine.read_text() == "the user's own\n"
    assert remove_leftovers(out) == [running]  # that run ended (killed): its tag's lock let go


def test_a_release_folder_that_is_a_link_is_listed_and_its_image_kept_and_a_second_name_is_not_counted(tmp_path, cli):
    # release/hk1 -> /mnt/big/hk1: skipped, its hotfix showed "base absent" and prune --keep 1 removed
    # its image (the base the kept hotfix needs) as a dangling image unibake built
    out, big = tmp_path / "release", tmp_path / "big"
    engine = FakeEngine()
    base = _release(big, engine, "hk1", 1, published="2026-01-01T00:00:01Z", version="hk1")
    out.mkdir()
    (out / "hk1").symlink_to(big / "hk1")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z", version="hk2")
    hotfix = {"base_release": "hk1", "base_tag": base["tag"], "base_image_id": base["image_id"],
              "base_archive_bytes": 1, "omitted_diff_ids": [], "shipped_diff_ids": []}
    _release(out, engine, "hk5", 5, published="2026-01-01T00:00:05Z", version="hk5", hotfix=hotfix)
    (out / "latest").symlink_to("hk5")  # a second name of a folder already here: not a second release
    assert [found.folder.name for found in find_releases(out)] == ["hk1", "hk2", "hk5"]
    del engine.tags["demo-llm:hk1"]  # no tag names the base's image: dangling
    planned = prune(engine, out, keep=1)
    assert {r.ref for r in planned} == {"demo-llm:hk2"}
    assert engine.inspect_image(base["image_id"]) is not None
    assert (big / "hk1" / "manifest.json").is_file() and (out / "hk1").is_symlink()
    listed = json.loads(cli("--json", "releases", "--out", str(out)).out)["releases"]
    assert [r["release"] for r in listed] == ["hk1", "hk2", "hk5"]


def test_a_folder_added_to_an_older_version_later_does_not_make_it_the_newer(tmp_path):
    # --profile tp4 --version hk1 made after hk2: hk1 ranked by that folder, prune --keep 1 kept hk1
    # and removed hk2, the version released last (README: "keeps the newest N versions")
    out = tmp_path / "release"
    engine = FakeEngine()
    _release(out, engine, "hk1", 1, published="2026-01-01T00:00:01Z")
    _release(out, engine, "hk2", 2, published="2026-01-01T00:00:02Z")
    _release(out, engine, "hk1-tp4", 10, published="2026-01-01T00:00:03Z", version="hk1")
    planned = prune(engine, out, keep=1, dry_run=True)
    assert {r.ref for r in planned} == {"demo-llm:hk1", "demo-llm:hk1-tp4"}


def test_an_older_release_rebuilt_from_its_kit_loses_the_kit_tag_too(tmp_path):
    # build.py rebuild tags unibake-kit/<product>:<release>: left alone, that tag would keep an old
    # release's image in the engine for ever once prune untagged the release
    out = tmp_path / "release"
    engine = FakeEngine()
    old = _release(out, engine, "1.3.0", 0)
    _release(out, engine, "1.3.1", 1)
    engine.tag(old["image_id"], "unibake-kit/demo-llm:1.3.0")
    engine.tag(old["image_id"], "unibake-kit/demo-llm:9.9")  # not a release's name: not ours to judge
    planned = {r.ref for r in prune(engine, out, keep=1, dry_run=True)}
    assert {"demo-llm:1.3.0", "unibake-kit/demo-llm:1.3.0"} <= planned and "unibake-kit/demo-llm:9.9" not in planned
    prune(engine, out, keep=1)
    assert engine.inspect_image("unibake-kit/demo-llm:1.3.0") is None
    assert engine.inspect_image("demo-llm:1.3.1") is not None


def _killed_writing(*args: str, cwd, env=None, at: str | None = None) -> int:
    """``build.py ARGS`` (or, with ``args[0] == "write"``, write_atomic(FOLDER, NAME)) SIGKILLed as its first
    write_atomic (or, with ``at``, its first of a file named ``at``) renames its temporary file: what a kill at that
    moment leaves. (The writes before ``at``'s go through: a render writes the inputs' digest memo first when the
    inputs are older than its settling time, which on a slow machine they may be.)"""
    import subprocess
    import sys

    from ..conftest import REPO

    script = ("import os, signal, sys\n"
              "_replace, _at = os.replace, os.environ.pop('KILL_AT', '')\n"
              "def _kill(src, dst, **kw):\n"
              "    if _at and os.path.basename(dst) != _at:\n"
              "        return _replace(src, dst, **kw)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "os.replace = _kill\n"
              "if sys.argv[1] == 'write':\n"
              "    from pathlib import Path\n"
              "    from unibake.files import write_atomic\n"
              "    write_atomic(Path(sys.argv[2]), sys.argv[3], 'x')\n"
              "from unibake.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "CI": "1", **(env or {}),
                               **({"KILL_AT": at} if at else {})}).returncode


def test_prune_removes_the_temporary_files_killed_writes_left_and_nothing_else(tmp_path, busybox_product):
    # (before: a SIGKILLed lock, render or memo left .NAME.XXXXXXXX.tmp beside NAME, and nothing removed it: each
    # writer has a name of its own, so the next run did not replace it either)
    import signal
    import time

    from unibake.cli import _temporary_places
    from unibake.files import ATOMIC_TEMP_AGE
    from unibake.prune import remove_temporary_files

    root, cache = busybox_product.parent, tmp_path / "home/.cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    assert _killed_writing("lock", "--config", str(busybox_product), cwd=root, at="inputs.lock") == -signal.SIGKILL
    # (killed at the Dockerfile: the memos' writes before it, in the user's cache or the project's, go through)
    assert _killed_writing("--stage", "render", "--config", str(busybox_product), cwd=root,
                           env={"XDG_CACHE_HOME": "relative-is-none"}, at="Dockerfile") == -signal.SIGKILL
    for folder, name in ((root / ".cache/normalised", "v2-" + "a" * 64 + "-0"),
                         (root / ".cache/build-memo", "all-native.json"),
                         (root / ".cache/build-memo/layers", "c" * 64 + ".json"),  # (an assembled hotfix's records)
                         (root / ".cache/build-memo/configs", "d" * 64 + ".json"),
                         (root / ".cache/build-memo/frames", "frames.json"),  # (before: left for good, up to 16 MiB)
                         (cache / "unibake/sanitise", "r1-" + "b" * 64 + ".json")):
        folder.mkdir(parents=True, exist_ok=True)
        assert _killed_writing("write", str(folder), name, cwd=root) == -signal.SIGKILL
    left = sorted(p for p in [*root.rglob(".*.tmp"), *cache.rglob(".*.tmp")])
    assert sorted(p.name.split(".")[1] for p in left) == sorted(["v2-" + "a" * 64 + "-0", "all-native", "Dockerfile",
                                                                 "inputs", "r1-" + "b" * 64, "c" * 64, "d" * 64,
                                                                 "frames"]), left
    # what is not a killed write's: a user's file of a name no writer there writes, a link, another user's file
    mine = [busybox_product / ".notes.abcdefgh.tmp", root / "dockerfiles/rendered/all/.README.abcdefgh.tmp",
            root / "dockerfiles/.Dockerfile.abcdefgh.tmp", busybox_product / ".inputs.lock.tmp"]
    for path in mine:
        path.write_text("mine\n")
    (root / "dockerfiles/rendered/all/.entrypoint.sh.abcdefgh.tmp").symlink_to(busybox_product / "product.yaml")
    if os.geteuid() == 0:
        (root / ".cache/normalised/.x.abcdefgh.tmp").write_text("")
        os.chown(root / ".cache/normalised/.x.abcdefgh.tmp", 65534, 65534)
    places = _temporary_places(busybox_product, False, env)
    assert remove_temporary_files(places) == []  # its writer may still be on
    later = time.time() + ATOMIC_TEMP_AGE + 1
    assert sorted(remove_temporary_files(places, dry_run=True, now=later)) == left
    assert all(p.exists() for p in left)
    assert sorted(remove_temporary_files(places, now=later)) == left
    assert not any(p.exists() for p in left)
    assert all(p.read_text() == "mine\n" for p in mine)
    assert (root / "dockerfiles/rendered/all/.entrypoint.sh.abcdefgh.tmp").is_symlink()
    assert (busybox_product / "product.yaml").is_file()
    if os.geteuid() == 0:
        assert (root / ".cache/normalised/.x.abcdefgh.tmp").exists()


def test_prune_looks_into_no_linked_folder_and_refuses_a_config_that_is_no_profiles_folder(tmp_path, busybox_product,
                                                                                           cli):
    import time

    from unibake.cli import _temporary_places
    from unibake.files import ATOMIC_TEMP_AGE
    from unibake.prune import remove_temporary_files

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".all-native.json.abcdefgh.tmp").write_text("")
    (busybox_product.parent / ".cache").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "build-memo").mkdir()
    (elsewhere / "build-memo/.all-native.json.abcdefgh.tmp").write_text("")
    places = _temporary_places(busybox_product, False, {})
    assert remove_temporary_files(places, now=time.time() + ATOMIC_TEMP_AGE + 1) == []
    assert (elsewhere / "build-memo/.all-native.json.abcdefgh.tmp").exists()
    result = cli("prune", "--dry-run", "--config", str(tmp_path), "--engine", "unix:///nowhere.sock")
    assert result.code == 2 and result.error_lines == [
        f"error: --config {tmp_path}: no product.yaml there: give the profiles folder of the project"], result.err


def _three_releases(tmp_path, engine, tags=("1.3.0", "1.3.1", "1.3.2")):
    out = tmp_path / "release"
    for n, tag in enumerate(tags):
        folder, _ = make_release(out, tag, layers=[layer_tar({"v": b"%d" % n})], image_labels=built_by_unibake(tag))
        engine.load(read_archive(folder, [f"demo-llm-{tag}.tar.zst"]))
    return out


def _as_hotfix_of(folder, base_folder):
    """``folder``'s manifest made to record a hotfix on ``base_folder``'s release, SHA256SUMS made to match."""
    base = json.loads((base_folder / "manifest.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["hotfix"] = {"base_release": base["release"], "base_tag": base["tag"], "base_image_id": base["image_id"],
                          "base_archive_bytes": 1, "omitted_diff_ids": [], "shipped_diff_ids": manifest["diff_ids"]}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    resum(folder)


def _give_away(folder):
    os.chown(folder, 65534, 65534)  # (the test runs as root, as CI does: the folder made another user's)
    for path in folder.iterdir():
        os.chown(path, 65534, 65534)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to another user: root only (CI runs as root)")
def test_a_hotfix_of_this_user_s_on_another_user_s_hotfix_keeps_the_first_base_too(tmp_path):
    # found by review: 1.0 (this user's) <- 1.0.1 (another user's hotfix) <- 1.0.2 (this user's hotfix): the closure
    # over the bases stopped at 1.0.1, already kept as another user's, and prune --keep 1 removed 1.0
    engine = FakeEngine()
    out = _three_releases(tmp_path, engine, ("1.0", "1.0.1", "1.0.2"))
    _as_hotfix_of(out / "1.0.1", out / "1.0")
    _as_hotfix_of(out / "1.0.2", out / "1.0.1")
    _give_away(out / "1.0.1")
    warned = []
    done = prune(engine, out, keep=1, on_warning=warned.append)
    assert not [r.ref for r in done if not r.kept and r.ref.startswith("demo-llm:")], done
    assert all(engine.inspect_image(f"demo-llm:{t}") is not None for t in ("1.0", "1.0.1", "1.0.2"))
    assert warned == [f"the release folder {out / '1.0.1'} is another user's (uid 65534): its image and its base are "
                      "kept, and it counts toward no --keep here; that user's prune removes what it no longer needs"]


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to another user: root only (CI runs as root)")
def test_release_folders_another_user_put_under_a_shared_out_never_have_an_image_removed(tmp_path):
    # found by review: folders planted under a shared --out (a newer release, vouched for by its own SHA256SUMS)
    # ranked as releases: prune --keep 1 removed this user's real releases, and could remove another product's
    engine = FakeEngine()
    out = _three_releases(tmp_path, engine, ("1.3.0", "1.3.1"))
    planted, _ = make_release(out, "9.9", layers=[layer_tar({"v": b"planted"})], image_labels=built_by_unibake("9.9"))
    engine.load(read_archive(planted, ["demo-llm-9.9.tar.zst"]))
    _give_away(planted)
    removed = {r.ref for r in prune(engine, out, keep=1) if not r.kept}
    assert removed == {"demo-llm:1.3.0"}  # 1.3.1 is this user's newest; 9.9 is kept, and ranks nothing
    assert engine.inspect_image("demo-llm:1.3.1") is not None and engine.inspect_image("demo-llm:9.9") is not None


def test_a_release_set_aside_by_a_killed_force_commit_keeps_prune_to_build_cache(tmp_path):
    # found by review: a SIGKILL between the renames of a --force commit leaves only .1.3.2.old, which find_releases
    # does not see: prune ranked the others and removed what that release (a hotfix's base, say) needs
    engine = FakeEngine()
    out = _three_releases(tmp_path, engine)
    (out / "1.3.2").rename(out / ".1.3.2.old")
    planned = prune(engine, out, keep=1, dry_run=True)
    assert not any(r.ref.startswith("demo-llm:") for r in planned), planned
    warned = []
    prune(engine, out, keep=1, dry_run=True, on_warning=warned.append)
    assert any(".1.3.2.old" in w and "the next run of 1.3.2 puts it back" in w for w in warned), warned


def test_a_release_published_while_prune_waits_for_a_lock_keeps_the_image_it_needs(tmp_path, monkeypatch):
    # found by review: prune planned its removals, then took each release's lock; a hotfix on 1.3.0 that held that
    # lock published meanwhile, and prune removed its base all the same
    from unibake import prune as prune_module
    engine = FakeEngine()
    out = _three_releases(tmp_path, engine)
    taken = prune_module.lock_release

    def lock_and_publish(where, release, **kw):  # as the hotfix ends and lets the lock go: 1.4.0, newer, on 1.3.0
        lock = taken(where, release, **kw)
        if release == "1.3.0" and not (out / "1.4.0").exists():
            folder, _ = make_release(out, "1.4.0", layers=[layer_tar({"v": b"hotfix"})],
                                     image_labels=built_by_unibake("1.4.0"))
            _as_hotfix_of(folder, out / "1.3.0")
        return lock

    monkeypatch.setattr(prune_module, "lock_release", lock_and_publish)
    warned = []
    done = prune(engine, out, keep=1, on_warning=warned.append)
    assert not warned and find_releases(out)[-1].manifest.hotfix is not None  # (a release that reads, not one unread)
    assert engine.inspect_image("demo-llm:1.3.0") is not None, done
    assert [r.kept for r in done if r.ref == "demo-llm:1.3.0"] == [
        "a release published, or changed, while prune ran needs it"]
