"""The scratch engine of the round trip, let go early: stopped in a thread while the release's last
stages run, and gone, daemon and data, by the time the run's exit returns; and the seeded verify
engine, kept between runs holding only the base image."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from unibake.errors import RoundTripUnavailable
from unibake.scratch import SEED_PREFIX, ScratchEngine, SeedBusy, SeededEngine, runtime_of

from ..conftest import REPO
from .test_faults import running_from


def test_a_scratch_engine_let_go_early_is_gone_by_the_exit(tmp_path):
    with ScratchEngine(tmp_path / "scratch") as scratch:
        folder = scratch.folder
        assert scratch.engine.version()
        assert (folder / "root").is_dir() and running_from(folder)
        scratch.stop_in_background()
        scratch.stop_in_background()  # a second call is the same one
    assert running_from(folder) == []
    assert not folder.exists() and not runtime_of(folder).exists()
    assert os.listdir(tmp_path / "scratch") == []


def test_an_interrupt_while_it_stops_still_leaves_nothing_behind(tmp_path, monkeypatch):
    # Ctrl-C right after "publish done" landed in the join of the stopping thread: the run exited
    # 130 at once and left the scratch dockerd running and its folders behind
    import signal
    import threading
    import time

    from unibake import scratch as module

    stop = module._stop_dockerd

    def slow_stop(pid, timeout):  # its stop takes 50 ms: held up, so that the Ctrl-C lands while it runs
        time.sleep(0.5)
        stop(pid, timeout)

    monkeypatch.setattr(module, "_stop_dockerd", slow_stop)

    scratch_dir = tmp_path / "scratch"
    with pytest.raises(KeyboardInterrupt):
        with ScratchEngine(scratch_dir) as scratch:
            folder = scratch.folder
            scratch.stop_in_background()
            threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
    assert running_from(folder) == []
    assert not folder.exists() and not runtime_of(folder).exists()
    assert os.listdir(scratch_dir) == []


def test_a_relative_scratch_dir_is_made_absolute_and_the_round_trip_runs(tmp_path):
    # dockerd given a relative --data-root accepts on its socket and never answers: the run hung
    (tmp_path / "scratch").mkdir(mode=0o700)
    out = tmp_path / "release"
    result = subprocess.run([sys.executable, str(REPO / "build.py"), "archive", BASE, "--tag", "rel", "--product",
                             "relscratch", "--out", "release", "--scratch-dir", "scratch"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=240, env={**os.environ, "CI": "1"})
    assert result.returncode == 0, result.stderr
    assert f"loading into scratch dockerd {tmp_path / 'scratch'}/ub-scratch-" in result.stderr
    assert (out / "rel" / "SHA256SUMS").is_file() and os.listdir(tmp_path / "scratch") == []


BASE = "localhost/unibake-busybox:1"


def _images(seeded) -> set[str]:
    return {i["Id"] for i in seeded.engine.api.images(all=True)}


def test_a_seeded_verify_engine_holds_only_its_base_image_and_is_seeded_once(engine, tmp_path):
    base_id = engine.inspect_image(BASE).id
    scratch = tmp_path / "scratch"
    seen = []

    @contextmanager
    def progress(description, total):  # what the reporter's bar gets: the base image's size, then its bytes
        seen.append([description, total, 0])
        yield lambda n: seen[-1].__setitem__(2, seen[-1][2] + n)

    with SeededEngine(scratch, source=engine, base_id=base_id, progress=progress) as seeded:
        folder = seeded.folder
        assert seeded.seeded_now and _images(seeded) == {base_id}
        ((description, total, moved),) = seen
        assert description == "seeding the verify engine" and total == engine.inspect_image(BASE).size
        assert moved >= total  # the saved tar: every layer, the config and the headers
        # What a run loads there (here: an image built on the base) is gone when it stops.
        seeded.engine.load(engine.save("localhost/unibake-busybox:1-arm64"))
        assert len(_images(seeded)) == 2
        seeded.stop_in_background()
    assert running_from(folder) == [] and not runtime_of(folder).exists()
    assert (folder / "root").is_dir()  # the data stays for the next run
    # its daemon shut down by itself before it was killed in its last sleep (below: it starts again on that data)
    assert "Daemon shutdown complete" in (folder / "dockerd.log").read_text()

    with SeededEngine(scratch, source=engine, base_id=base_id, progress=progress) as again:
        assert not again.seeded_now and _images(again) == {base_id} and len(seen) == 1  # no seeding, no bar
        # A run killed before it cleaned up leaves an image behind: the next run seeds again.
        again.engine.load(engine.save("localhost/unibake-busybox:1-arm64"))
        again._stop_daemon()
    with SeededEngine(scratch, source=engine, base_id=base_id) as third:
        assert third.seeded_now and _images(third) == {base_id}
        # A second run with the same base image while this one runs gets none: it is busy.
        with pytest.raises(SeedBusy):
            SeededEngine(scratch, source=engine, base_id=base_id).__enter__()
    assert running_from(folder) == []


def test_a_verify_engine_to_seed_starts_empty_and_keeps_the_base_image_its_round_trip_loaded(engine, images,
                                                                                              tmp_path):
    """``defer`` (a release's round trip): the first release on a base loads its whole image into an empty engine,
    as ``--no-seed`` does, and the base image is made there from the layers it loaded, by its config alone, as the
    run stops; the base image is never loaded first on its own (16-23 s on the benchmark's 0.86 GB base)."""
    from unibake.scratch import KEPT_MARK, SEEDED_MARK

    from .conftest import build_dockerfile

    base_id = engine.inspect_image(BASE).id
    release = build_dockerfile(engine, "unibake-test-seed-from-release:1",
                               b"FROM localhost/unibake-busybox:1\nRUN echo release > /release\n")
    images(release)
    release_id = engine.inspect_image(release).id
    scratch = tmp_path / "scratch"
    lines, seen = [], []

    @contextmanager
    def progress(description, total):
        seen.append(description)
        yield lambda n: None

    with SeededEngine(scratch, source=engine, base_id=base_id, defer=True, on_line=lines.append,
                      progress=progress) as first:
        folder = first.folder
        assert first.deferred and _images(first) == set()  # the round trip goes into an engine that holds nothing
        assert not (folder / SEEDED_MARK).exists() and seen == []  # (no bar: nothing was loaded)
        assert any("starts empty: it keeps the base image" in line for line in lines)
        first.engine.load(engine.save(release))  # the round trip: the whole image, the base image's layers first
        first.keep_after(release_id)
    assert first.seeded_now and (folder / SEEDED_MARK).read_text().strip() == base_id
    assert (folder / KEPT_MARK).read_text().strip() == release_id
    with SeededEngine(scratch, source=engine, base_id=base_id, defer=True, keep=release_id) as second:
        assert second.deferred is None and not second.seeded_now  # seeded: the next round trip loads only its own
        assert second.kept == release_id and _images(second) == {base_id, release_id}
    with SeededEngine(scratch, source=engine, base_id=base_id, defer=True) as third:  # the base image alone
        assert third.deferred is None and _images(third) == {base_id}

    # A run that ends before its round trip loaded anything, or that loaded an image on another base, leaves the
    # engine unseeded (the config's layers are not there to make the base image from): the next run starts empty.
    other = tmp_path / "other"
    with SeededEngine(other, source=engine, base_id=base_id, defer=True) as cut:
        empty = cut.folder
    with SeededEngine(other, source=engine, base_id=base_id, defer=True) as elsewhere:
        assert elsewhere.deferred and _images(elsewhere) == set()
        elsewhere.engine.load(engine.save("localhost/unibake-busybox:1-arm64"))
    assert not elsewhere.seeded_now and not (empty / SEEDED_MARK).exists()
    with SeededEngine(other, source=engine, base_id=base_id, defer=True) as again:
        assert again.deferred and _images(again) == set()
    assert running_from(folder) == [] and running_from(empty) == []


def test_a_verify_engine_to_seed_is_seeded_first_where_the_base_images_config_cannot_be_read(engine, tmp_path,
                                                                                             monkeypatch):
    """The base image made from the round trip's layers needs its config, read from the engine's storage; an
    engine whose storage this user cannot read (not root, another driver, an engine elsewhere) gets the base
    image loaded first, as before."""
    from unibake import scratch as module

    monkeypatch.setattr(module, "stored_image", lambda engine, image_id: "this user cannot read the engine's storage")
    base_id = engine.inspect_image(BASE).id
    with SeededEngine(tmp_path / "scratch", source=engine, base_id=base_id, defer=True) as seeded:
        assert seeded.deferred is None and seeded.seeded_now and _images(seeded) == {base_id}


def test_a_seeded_verify_engine_keeps_one_release_for_a_hotfix_on_it_and_no_other(engine, tmp_path):
    """keep_after: the release a run made (or a hotfix's base) stays for the next run that wants it (a
    hotfix on it then loads only itself); a run that wants another, or none, has it removed at start."""
    from unibake.scratch import KEPT_MARK

    base_id = engine.inspect_image(BASE).id
    release = engine.inspect_image("localhost/unibake-busybox:1-arm64").id  # (an image standing for a release)
    scratch = tmp_path / "scratch"
    with SeededEngine(scratch, source=engine, base_id=base_id) as seeded:
        folder = seeded.folder
        seeded.engine.load(engine.save("localhost/unibake-busybox:1-arm64"))
        seeded.keep_after(release)
    assert (folder / KEPT_MARK).read_text().strip() == release
    with SeededEngine(scratch, source=engine, base_id=base_id, keep=release) as hotfix:
        assert hotfix.kept == release and not hotfix.seeded_now and _images(hotfix) == {base_id, release}
        hotfix.keep_after(release)  # (its own image, loaded meanwhile, goes)
    with SeededEngine(scratch, source=engine, base_id=base_id) as cold:  # a release: the base image alone
        assert cold.kept is None and not cold.seeded_now and _images(cold) == {base_id}
        cold.keep_after("sha256:" + "0" * 64)  # not in the engine: nothing kept
    assert not (folder / KEPT_MARK).exists()
    with SeededEngine(scratch, source=engine, base_id=base_id, keep=release) as other:
        assert other.kept is None and _images(other) == {base_id}  # not kept: the run loads its base release itself


def test_layers_no_image_names_in_a_seeded_verify_engine_have_it_seeded_again(engine, tmp_path):
    """A load the daemon was stopped or killed in (a run's failure while its base release still loaded, a crash)
    leaves layers that no image names: the engine lists only its base image, and a later load would take such a
    layer as it is, without unpacking the archive's bytes of it. The layer store is checked too: seeded again."""
    import shutil

    from unibake.layerstore import chain_ids
    from unibake.scratch import KEPT_MARK

    base_id = engine.inspect_image(BASE).id
    scratch = tmp_path / "scratch"
    with SeededEngine(scratch, source=engine, base_id=base_id) as seeded:
        folder = seeded.folder
        driver = seeded.engine.api.info()["Driver"]
        made = _made(seeded, "left-behind")
        seeded.keep_after(made)
    # as the killed load leaves it: the layer registered, no image record naming it
    imagedb = folder / "root" / "image" / driver / "imagedb"
    (imagedb / "content" / "sha256" / made.removeprefix("sha256:")).unlink()
    shutil.rmtree(imagedb / "metadata" / "sha256" / made.removeprefix("sha256:"), ignore_errors=True)
    (folder / KEPT_MARK).unlink()
    lines: list[str] = []
    with SeededEngine(scratch, source=engine, base_id=base_id, on_line=lines.append) as again:
        assert again.seeded_now and _images(again) == {base_id}
        assert any("held more than its base image: seeded again" in line for line in lines)
        assert again._layers() == set(chain_ids(engine.inspect_image(BASE).diff_ids))
    with SeededEngine(scratch, source=engine, base_id=base_id) as third:  # (the next finds it as it should be)
        assert not third.seeded_now


def _made(seeded, name: str) -> str:
    """A one-file image made in the seeded engine (standing for a release a run loaded there): its ID."""
    before = _images(seeded)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(name)
        tar.addfile(info, io.BytesIO(name.encode()))
    seeded.engine.api.import_image_from_data(buf.getvalue())
    (made,) = _images(seeded) - before
    return made


def test_a_second_release_made_on_the_same_release_finds_it_kept_and_a_hotfix_on_the_last_one_too(engine, tmp_path):
    """A release keeps itself and the release it was made on: a second release --from that one loads only
    itself (before: the first kept only its own image, and every later release from the same one loaded it
    whole again, 5 s more on the benchmark's product), and a hotfix on the last one finds it; the other kept
    release is removed as the engine starts, so the run's engine holds its base release and nothing else."""
    from unibake.scratch import KEPT_MARK

    base_id = engine.inspect_image(BASE).id
    cold = engine.inspect_image("localhost/unibake-busybox:1-arm64").id  # (an image standing for a release)
    scratch = tmp_path / "scratch"
    with SeededEngine(scratch, source=engine, base_id=base_id) as seeded:
        folder = seeded.folder
        seeded.engine.load(engine.save("localhost/unibake-busybox:1-arm64"))
        seeded.keep_after(cold)
    with SeededEngine(scratch, source=engine, base_id=base_id, keep=cold) as first:  # build --from cold
        assert first.kept == cold and _images(first) == {base_id, cold}
        one = _made(first, "one")
        first.keep_after(one, cold)
    assert sorted((folder / KEPT_MARK).read_text().split()) == sorted([one, cold])
    with SeededEngine(scratch, source=engine, base_id=base_id, keep=cold) as second:  # build --from cold again
        assert second.kept == cold and not second.seeded_now and _images(second) == {base_id, cold}  # `one` went
        two = _made(second, "two")
        second.keep_after(two, cold)
    with SeededEngine(scratch, source=engine, base_id=base_id, keep=two) as hotfix:  # hotfix --from the last one
        assert hotfix.kept == two and not hotfix.seeded_now and _images(hotfix) == {base_id, two}  # `cold` went
        with pytest.raises(ValueError, match="at most 2 releases"):
            hotfix.keep_after(two, cold, base_id)
        hotfix.keep_after(two)
    # a kept mark naming more releases than are ever kept (or anything but image IDs) settles nothing: the engine
    # holds more than its base image, and is seeded again
    (folder / KEPT_MARK).write_text(f"{two}\n{cold}\n{base_id}\n", encoding="ascii")
    with SeededEngine(scratch, source=engine, base_id=base_id, keep=two) as other:
        assert other.kept is None and other.seeded_now and _images(other) == {base_id}
    assert running_from(folder) == []


def test_a_seed_folder_that_is_not_the_users_own_is_refused(engine, tmp_path):
    base_id = engine.inspect_image(BASE).id
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # a --scratch-dir like /tmp: build refuses it as prune does, before seeding in it
    with pytest.raises(RoundTripUnavailable, match=f"{shared} is not a private folder"):
        with SeededEngine(shared, source=engine, base_id=base_id):
            pass
    assert os.listdir(shared) == []
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (scratch / f"{SEED_PREFIX}{base_id.removeprefix('sha256:')[:16]}").symlink_to(elsewhere)
    with pytest.raises(RoundTripUnavailable, match="not a private folder"):
        with SeededEngine(scratch, source=engine, base_id=base_id):
            pass
    assert os.listdir(elsewhere) == []
    (scratch / f"{SEED_PREFIX}{base_id.removeprefix('sha256:')[:16]}").unlink()
    (scratch / f"{SEED_PREFIX}{base_id.removeprefix('sha256:')[:16]}").symlink_to(tmp_path / "missing")
    with pytest.raises(RoundTripUnavailable, match="cannot make"):
        with SeededEngine(scratch, source=engine, base_id=base_id):
            pass


def test_a_seeded_engine_left_running_by_a_killed_run_is_stopped_by_the_next(engine, tmp_path):
    base_id = engine.inspect_image(BASE).id
    scratch = tmp_path / "scratch"
    code = ("import sys, time\nfrom unibake.docker_engine import DockerEngine\nfrom unibake.scratch import SeededEngine\n"
            f"s = SeededEngine({str(scratch)!r}, source=DockerEngine(), base_id={base_id!r}).__enter__()\n"
            "print(s.folder, flush=True)\ntime.sleep(600)\n")
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        folder = Path(run.stdout.readline().strip())
        left = running_from(folder)
        assert left, "the seeded engine's daemon should run"
    finally:
        run.kill()  # SIGKILL: nothing cleans up
        run.wait()
    assert running_from(folder), "the daemon outlives a killed run"
    with SeededEngine(scratch, source=engine, base_id=base_id) as next_run:
        assert not next_run.seeded_now  # the data was whole: not seeded again
        assert not set(left) & set(running_from(folder))  # the old daemon is gone, a new one runs
    assert running_from(folder) == []
