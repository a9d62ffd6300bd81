"""Cleaning up after a killed run trusts no file: only this user's private folders are removed, and
only processes that are this user's dockerd/containerd naming those folders are stopped."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from unibake.scratch import (SEED_PREFIX, SEEDS_KEPT, _evict_seeds, _processes_of, _try_lock, clean_stale_scratch,
                             prune_seeds,
                             private_base, runtime_of)

from ..conftest import child_ended, kill_children, signal_inside_popen, terminated_as_the_cli


def test_a_planted_scratch_folder_cannot_make_a_run_kill_or_delete_what_is_not_its_own(tmp_path):
    base = tmp_path / "scratch"
    base.mkdir()
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "data").write_text("keep me")
    planted = base / "ub-scratch-evil"
    planted.mkdir(mode=0o700)
    # an unrelated process whose command line names the planted folder, recorded as its "owner"
    bystander = subprocess.Popen(["sh", "-c", "sleep 30", str(planted / "root")])
    try:
        (planted / "owner").write_text(f"{bystander.pid} 0\n")
        (planted / "runtime").write_text(f"{victim}\n")  # an old scratch engine's way to name its sockets
        not_private = base / "ub-scratch-open"
        not_private.mkdir()
        os.chmod(not_private, 0o755)

        removed = clean_stale_scratch(base)

        assert bystander.poll() is None, "an unrelated process was stopped"
        assert (victim / "data").read_text() == "keep me"
        assert removed == [planted] and not planted.exists()  # this user's stale folder, and nothing else
        assert not_private.exists()  # not private: not made by a scratch engine, left alone
    finally:
        bystander.kill()
        bystander.wait()


def test_a_live_runs_folder_is_left_alone(tmp_path):
    folder = tmp_path / "ub-scratch-live"
    folder.mkdir(mode=0o700)
    started = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[19]
    (folder / "owner").write_text(f"{os.getppid()} {started}\n")
    assert clean_stale_scratch(tmp_path) == [] and folder.exists()


def test_a_folder_a_run_made_a_moment_ago_and_has_not_yet_named_itself_in_is_left_alone(tmp_path):
    # a run makes its folder, then writes its owner: another run's clean-up in between removed it (and stopped the
    # daemon starting there); with no owner for a minute, it was a run killed in that moment, and it goes
    starting = tmp_path / "ub-scratch-starting"
    starting.mkdir(mode=0o700)
    assert clean_stale_scratch(tmp_path) == [] and starting.exists()
    old = time.time() - 120
    os.utime(starting, (old, old))
    assert clean_stale_scratch(tmp_path) == [starting] and not starting.exists()


def test_only_daemon_executables_naming_the_folder_count_as_its_processes(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30", str(tmp_path / "root")])
    try:
        time.sleep(0.1)
        assert _processes_of([tmp_path]) == []  # named, but not a dockerd or containerd
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of its own needs root (CI runs as root)")
def test_a_daemon_in_another_mount_namespace_naming_the_same_folder_is_not_ours(tmp_path):
    # (before: a run in a privileged container, the same --scratch-dir path in its own mount namespace, had its
    # seeded dockerd stopped by every run on the host: the host sees the container's processes)
    from unibake.scratch import _stop

    fake = tmp_path / "docker-proxy"  # a daemon's name, as the clean-up knows them
    shutil.copy("/bin/sh", fake)  # (a shell waiting on its sleep, the folder in its arguments)
    here = subprocess.Popen([str(fake), "-c", "sleep 30; :", str(tmp_path / "root")], start_new_session=True)
    there = subprocess.Popen(["unshare", "--mount", str(fake), "-c", "sleep 30; :", str(tmp_path / "root")],
                             start_new_session=True)
    try:
        time.sleep(0.3)
        found = _processes_of([tmp_path])
        assert [pid for pid, _ in found] == [here.pid]
        _stop(here.pid, str(int(found[0][1]) + 1), 1)  # the same PID, another start: another process by now
        assert here.poll() is None
        _stop(here.pid, found[0][1], 5)  # (it reaps its own child: the Popen learns no exit code)
        assert not os.path.exists(f"/proc/{here.pid}") and there.poll() is None
    finally:
        for process in (here, there):
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the shell and its sleep
            except ProcessLookupError:
                pass
            process.wait()


def test_where_no_mount_namespace_can_be_read_the_daemons_are_still_found(tmp_path, monkeypatch):
    # (a sandbox whose /proc has no ns/mnt: the check of the namespace left every daemon running, and its folder was
    # removed under it)
    from unibake import scratch

    monkeypatch.setattr(scratch, "_mount_namespace", lambda pid: "")
    fake = tmp_path / "docker-proxy"
    shutil.copy("/bin/sh", fake)
    here = subprocess.Popen([str(fake), "-c", "sleep 30; :", str(tmp_path / "root")], start_new_session=True)
    try:
        time.sleep(0.3)
        assert [pid for pid, _ in _processes_of([tmp_path])] == [here.pid]
    finally:
        os.killpg(here.pid, signal.SIGKILL)
        here.wait()


def test_the_default_scratch_place_is_private_and_the_sockets_live_there():
    base = private_base()
    info = os.lstat(base)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077
    runtime = runtime_of(base / "ub-scratch-abc123")
    assert runtime == base / "ubx-abc123" and len(str(runtime / "exec/containerd/containerd.sock")) < 100


def test_older_seeded_engines_are_evicted_unless_a_run_uses_them(tmp_path):
    base = tmp_path / "scratch"
    base.mkdir()
    seeds = []
    for i, name in enumerate(["a", "b", "c", "d"]):
        folder = base / f"{SEED_PREFIX}{name * 16}"
        folder.mkdir(mode=0o700)
        (folder / "root").mkdir()
        (folder / "dockerd.log").write_text("")
        os.utime(folder, (1000 + i, 1000 + i))
        seeds.append(folder)
    open_seed = base / f"{SEED_PREFIX}open"  # not private: not made by unibake
    open_seed.mkdir()
    os.chmod(open_seed, 0o755)
    in_use = _try_lock(seeds[0])  # the oldest, locked by a running run
    try:
        assert _try_lock(seeds[0]) is None  # a second lock on it is refused
        removed = _evict_seeds(base, keep=seeds[3])
    finally:
        os.close(in_use)
    # SEEDS_KEPT in all: the one in use now and the newest other; the rest go, except one in use
    assert SEEDS_KEPT == 2
    assert sorted(removed) == [seeds[1]]
    assert seeds[0].exists() and seeds[2].exists() and seeds[3].exists() and open_seed.exists()
    assert not seeds[1].exists() and (base / f"{SEED_PREFIX}{'b' * 16}.lock").exists()


def test_prune_removes_only_folders_unibake_seeded_and_a_dry_run_writes_nothing(tmp_path):
    base = tmp_path / "userdir"
    base.mkdir(mode=0o700)
    thesis = base / f"{SEED_PREFIX}thesis"  # the user's own, private, with the same prefix
    hexed = base / f"{SEED_PREFIX}{'0' * 16}"  # named like a seed, holding the user's files
    planted = base / f"{SEED_PREFIX}{'1' * 16}"  # a mark, but of another base image than its name
    for folder in (thesis, hexed, planted):
        folder.mkdir(mode=0o700)
    (thesis / "ch1.tex").write_text("chapter 1")
    (hexed / "root").mkdir()
    (hexed / "notes.txt").write_text("mine")
    (planted / "seeded").write_text("sha256:" + "2" * 64)
    seed = base / f"{SEED_PREFIX}{'a' * 16}"  # what SeededEngine leaves: its data root, the log, the mark
    (seed / "root").mkdir(parents=True)
    seed.chmod(0o700)
    (seed / "dockerd.log").write_text("")
    (seed / "seeded").write_text("sha256:" + "a" * 64 + "\n")
    before = sorted(os.listdir(base))

    assert [s.folder for s in prune_seeds(base, dry_run=True)] == [seed]
    assert sorted(os.listdir(base)) == before  # no lock file made
    assert [s.folder for s in prune_seeds(base)] == [seed]
    assert not seed.exists() and thesis.exists() and hexed.exists() and planted.exists()
    assert (thesis / "ch1.tex").read_text() == "chapter 1" and (hexed / "notes.txt").exists()


def test_prune_removes_the_seeded_engines_but_one_in_use_and_refuses_a_foreign_scratch_folder(tmp_path, cli):
    base = tmp_path / "scratch"
    base.mkdir(mode=0o700)
    seeds = {}
    for name, mark in (("a", "sha256:" + "a" * 64), ("b", "planted\nmark"), ("c", None)):
        folder = base / f"{SEED_PREFIX}{name * 16}"
        (folder / "root").mkdir(parents=True)
        folder.chmod(0o700)
        if mark is not None:
            (folder / "seeded").write_text(mark)
        if name != "a":
            (folder / "dockerd.log").write_text("")  # every start writes it: a seeding that did not finish
        seeds[name] = folder
    foreign = base / f"{SEED_PREFIX}open"
    foreign.mkdir(mode=0o755)
    foreign.chmod(0o755)

    listed = prune_seeds(base, dry_run=True)
    assert [(s.folder.name, s.base_id, s.busy) for s in listed] == [
        (f"{SEED_PREFIX}{'a' * 16}", "sha256:" + "a" * 64, False), (f"{SEED_PREFIX}{'b' * 16}", "", False),
        (f"{SEED_PREFIX}{'c' * 16}", "", False)]
    assert all(f.exists() for f in seeds.values())  # a dry run removes nothing

    in_use = _try_lock(seeds["a"])
    try:
        done = prune_seeds(base)
    finally:
        os.close(in_use)
    assert [(s.folder.name, s.busy) for s in done] == [(f"{SEED_PREFIX}{'a' * 16}", True),
                                                       (f"{SEED_PREFIX}{'b' * 16}", False),
                                                       (f"{SEED_PREFIX}{'c' * 16}", False)]
    assert seeds["a"].exists() and not seeds["b"].exists() and not seeds["c"].exists() and foreign.exists()
    assert prune_seeds(tmp_path / "none") == []  # no scratch folder yet: nothing to do

    open_base = tmp_path / "open"
    open_base.mkdir(mode=0o755)
    open_base.chmod(0o755)
    refused = cli("prune", "--scratch-dir", str(open_base), "--out", str(tmp_path), "--engine",
                  "unix:///nonexistent/unibake-test.sock")
    assert refused.code == 2 and refused.error_lines == [
        f"error: {open_base} is not a private folder of this user (a symlink, another owner, or open to "
        "others); remove it or choose --scratch-dir"]


# a stand-in for the scratch dockerd: told to stop (SIGTERM), it notes it and takes 1.5 s to end
_SLOW_TO_STOP = """
import pathlib, signal, sys, time
log = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    with log.open("a") as out:
        out.write("TERM\\n")
    time.sleep(1.5)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[2]).write_text("")
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("background", [True, False], ids=["stopping-in-background", "stopped-at-the-exit"])
def test_an_interrupt_while_the_scratch_engine_stops_waits_for_its_one_stop_and_leaves_nothing(tmp_path, background):
    # stopped at the exit (a failed run's clean-up), Ctrl-C while the daemon stopped cut the stop short: the
    # daemon ran on and its folder was left. Stopping in the background, the interrupted wait (Python 3.11's
    # join, cut short, takes the thread for ended) let the exit stop it a second time beside that thread,
    # racing it (two SIGTERMs; a value the thread had just set to None read by the other)
    import signal
    import sys
    import threading
    import time

    from unibake.scratch import ScratchEngine

    folder = tmp_path / "ub-scratch-1"
    folder.mkdir(mode=0o700)
    (folder / "root").mkdir()
    terms, ready = tmp_path / "terms", tmp_path / "ready"
    daemon = subprocess.Popen([sys.executable, "-c", _SLOW_TO_STOP, str(terms), str(ready)])

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        scratch = ScratchEngine(tmp_path)
        scratch.folder, scratch.process = folder, daemon
        if background:
            scratch.stop_in_background()
        with pytest.raises(KeyboardInterrupt):
            threading.Timer(0.3, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1)).start()
            scratch.__exit__(None, None, None)
        assert daemon.poll() is not None, "the daemon was left running"
        assert not folder.exists(), "its folder was left"
        assert terms.read_text() == "TERM\n", "stopped twice at once"
    finally:
        signal.signal(signal.SIGUSR1, previous)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_an_interrupt_as_the_scratch_engine_s_folder_is_made_leaves_no_folder(tmp_path, monkeypatch):
    # (before: the folder was made before the try whose clean-up removes it: a Ctrl-C or SIGTERM between mkdtemp and
    # the daemon's start left an empty ub-scratch-* folder, until the next run with that --scratch-dir removed it)
    import signal
    import tempfile

    from unibake import scratch as scratch_module
    from unibake.scratch import ScratchEngine

    if ScratchEngine.unavailable_reason():
        pytest.skip(ScratchEngine.unavailable_reason())
    real = tempfile.mkdtemp

    def made_then_interrupted(*args, **kwargs):
        folder = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the folder is there; the signal lands as mkdtemp returns it
        return folder

    monkeypatch.setattr(scratch_module.tempfile, "mkdtemp", made_then_interrupted)
    base = tmp_path / "scratch"
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            with ScratchEngine(base):
                pass
    assert os.listdir(base) == []


def test_an_interrupt_inside_popen_as_the_scratch_dockerd_starts_still_stops_it(tmp_path, monkeypatch):
    # an interrupt inside subprocess.Popen's __init__, once the child is made: the Popen object is never returned,
    # so nothing knew the child (before: it ran on, in its own session; a real dockerd re-made its removed data
    # root); a stand-in dockerd that is no daemon executable, so that only the PID recorded can stop it
    from unibake import scratch as scratch_module
    from unibake.scratch import ScratchEngine

    if ScratchEngine.unavailable_reason():
        pytest.skip(ScratchEngine.unavailable_reason())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dockerd").write_text("#!/bin/sh\nexec sleep 600\n")
    (bin_dir / "dockerd").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    started = signal_inside_popen(monkeypatch, scratch_module, lambda args: args[0].endswith("unshare"))  # (the daemon's start alone: not a umount)
    base = tmp_path / "scratch"
    try:
        with terminated_as_the_cli():
            with pytest.raises(KeyboardInterrupt):
                with ScratchEngine(base):
                    pass
            assert len(started) == 1
            assert child_ended(started[0]), "the scratch dockerd was left running"
            assert os.listdir(base) == []
    finally:
        kill_children(started)


def test_an_interrupt_as_the_scratch_engine_s_start_returns_still_stops_it(tmp_path, monkeypatch):
    # entered with ExitStack.enter_context, the engine's exit was recorded only once its start had returned: an
    # interrupt in between (its start done, the exit not yet recorded) left the dockerd running and its folder
    import signal
    from contextlib import ExitStack

    from unibake import pipeline
    from unibake.pipeline import Request, Run
    from unibake.scratch import ScratchEngine, remove_scratch_dir

    from .test_supply_chain import Quiet

    if ScratchEngine.unavailable_reason():
        pytest.skip(ScratchEngine.unavailable_reason())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dockerd").write_text("#!/bin/sh\nexec sleep 600\n")
    (bin_dir / "dockerd").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    started: list[int] = []

    class InterruptedAsItReturns(ScratchEngine):
        def _wait_ready(self, sock):  # (a unit test reaches no engine: the stand-in daemon is taken as ready)
            pass

        def __enter__(self):
            engine = super().__enter__()
            started.append(self.pid)
            os.kill(os.getpid(), signal.SIGTERM)  # the engine answers; the signal lands as its start returns
            return engine

    monkeypatch.setattr(pipeline, "ScratchEngine", InterruptedAsItReturns)
    base = tmp_path / "scratch"
    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", scratch_dir=base)
    try:
        with terminated_as_the_cli():
            with pytest.raises(KeyboardInterrupt):
                with ExitStack() as stack:
                    pipeline._fresh_engine(Run(request, Quiet(), stack, lambda address: None))
            assert len(started) == 1
            assert child_ended(started[0]), "the scratch dockerd was left running"
            assert os.listdir(base) == []
    finally:
        kill_children(started)
        for folder in base.glob("ub-scratch-*"):  # (its runtime folder too, in the user's scratch place)
            remove_scratch_dir(folder)


# a stand-in for Engine 20.10's dockerd: it starts its "containerd" (a child); told to stop, it shuts down
# (noted in its log), asks its child to stop, and then, as dockerd does, sleeps before it ends (here 20 s)
_DOCKERD = """
import pathlib, signal, subprocess, sys, time
log = pathlib.Path(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", sys.argv[3]])
def stop(signum, frame):
    with log.open("a") as out:
        out.write("shutdown complete\\n")
    child.terminate()
    child.wait()
    with log.open("a") as out:
        out.write("containerd gone\\n")
    time.sleep(20)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[2]).write_text(str(child.pid))
while True:
    time.sleep(1)
"""
# its containerd: ends a while after it is asked to
_CONTAINERD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda signum, frame: (time.sleep(0.5), sys.exit(0)))
while True:
    time.sleep(1)
"""


def test_a_scratch_dockerd_is_stopped_once_its_containerd_is_gone_not_after_its_sleep(tmp_path):
    # Engine 20.10 looks once a second whether the containerd it stopped is gone: every run waited a
    # whole second at its end for a scratch engine whose data was closed in milliseconds
    import sys

    from unibake.scratch import _alive, _stop_dockerd

    log, ready = tmp_path / "log", tmp_path / "ready"
    daemon = subprocess.Popen([sys.executable, "-c", _DOCKERD, str(log), str(ready), _CONTAINERD])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # (the child's handler in place)
        child = int(ready.read_text())
        start = time.monotonic()
        _stop_dockerd(daemon.pid, 60)
        took = time.monotonic() - start
        assert not _alive(daemon.pid) and not _alive(child)
        lines = log.read_text().splitlines()
        assert lines[0] == "shutdown complete" and lines[1] == "containerd gone"  # its own stop ran first
        assert 0.5 <= took < 10, took  # the child's half second waited for, not the daemon's 20 s
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


@pytest.mark.parametrize("base_state", ["open to others", "missing"])
def test_removing_a_scratch_dir_s_folder_neither_makes_nor_fails_on_the_default_scratch_place(tmp_path, monkeypatch,
                                                                                              base_state):
    # found by probing: prune --scratch-dir removed the engine's images, then failed (exit 1) on /var/tmp/unibake-UID
    # being open to others, the --scratch-dir's seed left; with that place missing, it made it
    from unibake import scratch

    base = tmp_path / "var-tmp-unibake"
    if base_state == "open to others":
        base.mkdir(mode=0o755)
        base.chmod(0o755)
    monkeypatch.setattr(scratch, "_default_base", lambda: base)  # the place, not what is done there
    folder = tmp_path / "mine" / "ub-seed-abc"
    (folder / "root").mkdir(parents=True)
    folder.chmod(0o700)
    scratch.remove_scratch_dir(folder)
    assert not folder.exists()
    assert base.exists() == (base_state == "open to others")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (CI runs as root)")
def test_a_mount_under_a_scratch_dir_named_in_utf_8_and_with_a_space_is_unmounted(tmp_path):
    # mountinfo escapes a space as \040 and gives a UTF-8 name as its bytes: decoded as unicode_escape, "é" was
    # "Ã©", no mount matched, and a killed daemon's mounts stayed (its folder, then, could not be removed)
    from unibake.scratch import _unmount_under

    folder = tmp_path / "scratché dir"
    point = folder / "root" / "overlay"
    point.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)
    try:
        assert os.path.ismount(point)
        _unmount_under(folder)
        assert not os.path.ismount(point)
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_each_scratch_engine_has_containerd_namespaces_of_its_own():
    # (Engine 20.10 uses the system's containerd where /run/containerd/containerd.sock is, Docker CE's layout: with
    # no namespace given, the scratch engine's containers sat in the host engine's, "moby", and each daemon got the
    # other's events)
    import re

    from unibake.scratch import daemon_command

    def namespaces(folder: str) -> tuple[str, str]:
        cmd = daemon_command(Path(folder), Path("/run/x"))
        return cmd[cmd.index("--containerd-namespace") + 1], cmd[cmd.index("--containerd-plugins-namespace") + 1]

    one, two = namespaces("/var/tmp/unibake-0/ub-seed-0123456789abcdef"), namespaces("/srv/s/ub-scratch-_a_b")
    assert one == namespaces("/var/tmp/unibake-0/ub-seed-0123456789abcdef")  # a kept seed keeps its namespace
    assert len({*one, *two, "moby", "plugins.moby"}) == 6
    for name in (*one, *two):  # containerd's form of a namespace's name
        assert re.fullmatch(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*", name) and len(name) <= 76, name
    cmd = daemon_command(Path("/d"), Path("/r"))
    assert cmd[:3] == ["unshare", "--net", "--"] and "--bridge=none" not in cmd  # never on the host's network


def test_a_scratch_folder_nested_deeper_than_python_recurses_is_removed(tmp_path, monkeypatch):
    # found by review: a release image whose files nest about 1100 folders deep, unpacked in a scratch engine's data
    # root: shutil.rmtree's RecursionError (not covered by ignore_errors) was a traceback, and the folder was left
    from unibake import scratch

    monkeypatch.setattr(scratch, "_default_base", lambda: tmp_path / "var-tmp-unibake")
    folder = tmp_path / "mine" / "ub-seed-abc"
    deepest = folder / "root"
    deepest.mkdir(parents=True)
    folder.chmod(0o700)
    for _ in range(1100):  # (one mkdir a level: os.makedirs recurses too)
        deepest = deepest / "d"
        deepest.mkdir()
    (deepest / "file").write_bytes(b"x")
    try:
        scratch.remove_scratch_dir(folder)
        assert not folder.exists()
    finally:
        subprocess.run(["rm", "-rf", str(tmp_path / "mine")], check=False)  # (pytest's own clean-up recurses)


def test_a_scratch_engine_s_stop_error_does_not_replace_the_run_s_own(capsys):
    # found by review: the stop's error (raised by the exit) took the place of the run's own failure (an exit 3
    # verification failure became exit 1, naming the stop)
    from unibake.errors import EngineError, VerificationError
    from unibake.scratch import ScratchEngine

    scratch = ScratchEngine()
    scratch._stop_all = lambda: None  # (nothing started: the stop's outcome is set as its thread would set it)
    scratch._stop_error = EngineError("cannot remove the scratch folder")
    failure = VerificationError("the gate failed")  # (the exit as a with block calls it: no engine started here)
    assert scratch.__exit__(VerificationError, failure, None) is None  # the run's own failure goes on
    assert capsys.readouterr().err == "warning: stopping the scratch engine: cannot remove the scratch folder\n"
    scratch._stop_error = EngineError("cannot remove the scratch folder")
    with pytest.raises(EngineError, match="cannot remove the scratch folder"):  # alone, it is the run's error
        scratch.__exit__(None, None, None)
