"""The small shared pieces: the sha256sum format, safe small-file reads, and the thread hand-off."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from unibake.errors import InputError, VerificationError
from unibake.files import read_small_text, write_atomic
from unibake.sums import parse_sums, render_sums
from unibake.threads import consume_in_thread, read_ahead

from ..conftest import REPO, terminated_as_the_cli

A, B = "a" * 64, "b" * 64


def test_every_form_sha256sum_reads_is_read_and_what_it_writes_it_checks(tmp_path):
    text = f"{A}  text.bin\n{B} *binary.bin\nSHA256 (bsd.bin) = {A.upper()}\n"
    assert [(e.name, e.sha256) for e in parse_sums(text, "SUMS", VerificationError)] == \
        [("text.bin", A), ("binary.bin", B), ("bsd.bin", A)]
    (tmp_path / "x").write_bytes(b"x")
    digest = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    (tmp_path / "SUMS").write_text(render_sums({"x": digest}))
    assert subprocess.run(["sha256sum", "--strict", "-c", "SUMS"], cwd=tmp_path, capture_output=True).returncode == 0


@pytest.mark.parametrize("text,message", [
    (f"{A}  x\n{B}  x\n", r"'x' is listed twice \(first on line 1\)"),
    (f"\\{A}  x\\ny\n", "escaped file name"),
    (f"{A} x\n", "not a 'sha256  name' line"),
    (f"{A[:-1]}  x\n", "not a 'sha256  name' line"),
    (f"{A}  x\r\n", "carriage return"),
])
def test_sums_lines_that_could_be_read_two_ways_are_refused(text, message):
    with pytest.raises(VerificationError, match=message):
        parse_sums(text, "SUMS", VerificationError)


def test_comments_are_only_allowed_where_asked():
    assert parse_sums(f"# a header\n\n{A}  x\n", "inputs.lock", InputError, comments=True)[0].name == "x"
    with pytest.raises(InputError):
        parse_sums(f"# a header\n{A}  x\n", "SUMS", InputError)


def test_small_files_are_read_only_when_regular_and_small(tmp_path):
    (tmp_path / "ok").write_text("fine")
    assert read_small_text(tmp_path / "ok", InputError, limit=10) == "fine"
    with pytest.raises(InputError, match="more than the 2 it may hold"):
        read_small_text(tmp_path / "ok", InputError, limit=2)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="not a regular file"):
        read_small_text(tmp_path / "fifo", InputError, limit=10)  # would hang if opened for a blocking read
    os.symlink(tmp_path / "ok", tmp_path / "link")
    with pytest.raises(InputError, match="a symlink"):
        read_small_text(tmp_path / "link", InputError, limit=10, follow=False)
    with pytest.raises(InputError, match="missing"):
        read_small_text(tmp_path / "absent", InputError, limit=10)
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="not UTF-8"):
        read_small_text(tmp_path / "bin", InputError, limit=10)


def test_an_atomic_write_leaves_nothing_on_failure(tmp_path):
    write_atomic(tmp_path, "f", "data")
    with pytest.raises(TypeError):
        write_atomic(tmp_path, "g", 42)  # not text: fails before anything is written
    assert sorted(os.listdir(tmp_path)) == ["f"]
    # a rename that fails (an immutable file or folder; here a folder in the file's place) names the file being
    # written, not the temporary one it removed (found by probing: ".inputs.lock.lvi1kt3f.tmp: Operation not permitted")
    (tmp_path / "inputs.lock").mkdir()
    (tmp_path / "inputs.lock" / "x").write_text("")
    with pytest.raises(OSError) as failed:
        write_atomic(tmp_path, "inputs.lock", "data")
    assert failed.value.filename == str(tmp_path / "inputs.lock")
    assert sorted(os.listdir(tmp_path)) == ["f", "inputs.lock"]


def test_read_ahead_passes_the_producers_error_and_stops_it_when_the_reader_leaves():
    def broken():
        yield b"one"
        raise ConnectionResetError("the engine went away")

    with pytest.raises(ConnectionResetError):
        list(read_ahead(broken()))
    produced = []

    def endless():
        while True:
            produced.append(1)
            yield b"x"

    chunks = read_ahead(endless(), depth=4)
    assert next(chunks) == b"x"
    chunks.close()  # the reader leaves: the producer thread ends instead of blocking forever
    assert len(produced) < 100 and threading.active_count() < 20


def test_a_consumer_in_a_thread_returns_its_result_or_raises_its_error_at_the_next_put():
    total = consume_in_thread(lambda items: sum(items))
    for n in range(10):
        total.put(n)
    assert total.close() == 45

    def refuse(items):
        next(items)
        raise ValueError("the engine refused the image")

    failing = consume_in_thread(refuse, depth=1)
    with pytest.raises(ValueError, match="refused"):
        for n in range(1000):
            failing.put(n)
    with pytest.raises(ValueError):
        failing.close()


def test_a_consumer_takes_what_is_handed_even_after_an_interrupt_left_a_stale_waiter_in_the_queue():
    # (before: a SIGTERM during an interrupted round trip, raised in the main thread inside the queue's notify
    # after it had woken the hashing thread, left that thread's old waiter in the queue's list; the end handed
    # later woke the stale waiter, the hashing thread slept on, and the clean-up waited for it for ever)
    import time

    seen: list = []
    consumer = consume_in_thread(lambda items: seen.extend(items), name="sha256")
    not_empty = consumer._handoff._queue.not_empty
    deadline = time.monotonic() + 10
    while not not_empty._waiters and time.monotonic() < deadline:  # the consumer waits for its first item
        time.sleep(0.01)
    stale = threading.Lock()  # the state such an interrupt leaves: a woken waiter still first in the list
    stale.acquire()
    with not_empty:
        not_empty._waiters.appendleft(stale)
    closing = threading.Thread(target=consumer.close, daemon=True)  # its end, the one item handed now
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "the consumer never woke for the end handed to it"
    assert seen == []


def test_a_thread_whose_join_an_interrupt_cut_short_is_still_alive_and_waited_for():
    # (before: Python 3.11's join, cut short by a KeyboardInterrupt, took the thread for ended while it ran on:
    # is_alive() said False and the next join returned at once)
    import signal
    import time

    from unibake.threads import Thread

    release = threading.Event()
    thread = Thread(target=release.wait, name="worker", daemon=True)
    thread.start()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1)).start()
            thread.join(10)
        assert thread.is_alive()
        threading.Timer(0.3, release.set).start()
        start = time.monotonic()
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - start >= 0.2
    finally:
        release.set()
        signal.signal(signal.SIGUSR1, previous)


def test_an_interrupt_while_a_consumer_is_closed_still_waits_for_it_before_the_clean_up_goes_on():
    # (before: an interrupt in close()'s wait, the load's stream handed whole and the engine storing it, let
    # abort() return at once: the load ran on beside the clean-up, and tagged its image after the clean-up had
    # put the release's tag back)
    import signal
    import time

    stored: list = []
    main = threading.main_thread().ident

    def load(items):
        list(items)  # the whole stream, as the engine takes it in
        signal.pthread_kill(main, signal.SIGUSR1)  # the interrupt, while the caller waits for the load
        time.sleep(0.5)  # the engine storing the image
        stored.append("tagged")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            with consume_in_thread(load, name="load") as loader:
                loader.put(b"layer")
                loader.close()
        assert stored == ["tagged"], "the clean-up went on while the load still ran"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_an_interrupt_inside_the_hand_over_of_the_end_still_ends_the_consumer():
    # an interrupt before close() had handed the end left the consumer waiting for items for ever, the
    # abort handing nothing (close() had marked the items ended)
    seen: list = []
    chunk = b"x"
    consumer = consume_in_thread(lambda items: seen.extend(items), name="load")
    real_put = consumer._handoff._queue.put

    def interrupted_put(item, *args, **kwargs):  # the interrupt, as the end is about to be queued
        if item is not chunk:
            consumer._handoff._queue.put = real_put
            raise KeyboardInterrupt
        return real_put(item, *args, **kwargs)

    consumer._handoff._queue.put = interrupted_put
    consumer.put(chunk)
    with pytest.raises(KeyboardInterrupt):
        consumer.close()
    aborting = threading.Thread(target=consumer.abort, daemon=True)
    aborting.start()
    aborting.join(10)
    assert not aborting.is_alive() and not consumer._thread.is_alive(), "the consumer was never ended"
    assert seen == [b"x"]


def test_a_write_that_fails_without_a_file_name_names_the_file_being_written(tmp_path):
    # a full disk fails the write or the fsync, and Python's error names no file: "error: a file: ..."
    script = ("import resource, signal, sys; from pathlib import Path; from unibake.files import write_atomic; "
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "try:\n    write_atomic(Path(sys.argv[1]), 'inputs.lock', b'x' * 100000)\n"
              "except OSError as exc:\n    print(exc.filename, exc.errno)\n")
    import errno
    import sys

    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split() == [str(tmp_path / "inputs.lock"), str(errno.EFBIG)], done.stderr
    assert list(tmp_path.iterdir()) == []  # the temporary file removed


def test_two_writers_of_one_file_each_write_their_own_temporary_file(tmp_path):
    # (before: both wrote .inputs.lock.tmp: a second `lock` run removed the first's half-written file and began
    # its own there, and the first then renamed the second's unfinished file into place, or failed)
    other = tmp_path / ".inputs.lock.tmp"
    other.write_text("another lock run's, half-written")
    write_atomic(tmp_path, "inputs.lock", "mine\n")
    assert other.read_text() == "another lock run's, half-written"  # neither removed nor renamed
    assert sorted(os.listdir(tmp_path)) == [".inputs.lock.tmp", "inputs.lock"]
    assert (tmp_path / "inputs.lock").read_text() == "mine\n"


def test_writers_racing_on_one_file_all_succeed_and_leave_one_whole_file(tmp_path):
    errors: list[BaseException] = []

    def write(n: int) -> None:
        for i in range(50):
            try:
                write_atomic(tmp_path, "inputs.lock", f"{n}\n" * 20000)
            except BaseException as exc:  # noqa: BLE001 - counted
                errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert os.listdir(tmp_path) == ["inputs.lock"]
    assert len(set((tmp_path / "inputs.lock").read_text().split())) == 1  # one writer's, whole


def test_an_atomic_write_of_a_long_name_or_onto_a_folder_leaves_nothing(tmp_path):
    name = "a" * 250  # its temporary name would pass 255 bytes
    write_atomic(tmp_path, name, "x")
    assert os.listdir(tmp_path) == [name]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_text("")
    with pytest.raises(OSError):
        write_atomic(tmp_path, "d", "x")  # the rename fails: the temporary file is removed
    assert sorted(os.listdir(tmp_path)) == sorted([name, "d"])


def test_an_output_path_is_tried_where_access_cannot_tell_and_nothing_is_left(tmp_path):
    # root may write /proc and /sys by access(), and they take nothing (before: "can be written", then the write
    # failed after the work); the probe of a writable folder leaves nothing behind
    from unibake.files import unwritable_reason

    (tmp_path / "there").mkdir()
    for path, folder in ((tmp_path / "a/b", True), (tmp_path / "there", True), (tmp_path / "x.json", False),
                         (tmp_path / "new/x.json", False)):
        assert unwritable_reason(path, folder=folder) is None
    assert sorted(os.listdir(tmp_path)) == ["there"] and os.listdir(tmp_path / "there") == []
    assert unwritable_reason(Path("/proc/unibake-kit"), folder=True).startswith("/proc ")
    assert unwritable_reason(Path("/proc/x.json")).startswith("/proc ")


def test_an_interrupt_as_an_atomic_write_s_temporary_file_is_made_leaves_no_file(tmp_path, monkeypatch):
    # (before: the temporary file was made before its name was known to the clean-up: a Ctrl-C or SIGTERM as mkstemp
    # returned left .NAME.XXXXXXXX.tmp beside the file, in the project too: dockerfiles/rendered/, the build memo)
    import os
    import signal
    import tempfile

    from unibake import files

    real = tempfile.mkstemp

    def made_then_interrupted(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the file is there; the signal lands as mkstemp returns it
        return made

    monkeypatch.setattr(files.tempfile, "mkstemp", made_then_interrupted)
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            write_atomic(tmp_path, "Dockerfile.tp1", "FROM scratch\n")
    assert os.listdir(tmp_path) == []


def test_a_work_folder_a_killed_run_left_is_removed_by_the_next_and_no_other_one(tmp_path):
    # found by review: a push or repro killed outright (SIGKILL, the OOM killer) left its folder of compressed
    # layers, the size of the image, in the temporary folder, and nothing removed it
    import sys

    from unibake.files import _host_token, work_folder

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = _host_token()
        left = tmp_path / f"unibake-push-{host}-{ended.pid}-abcd1234"
        live = tmp_path / f"unibake-push-{host}-{running.pid}-abcd1234"
        elsewhere = tmp_path / f"unibake-push-{'0' * 8 if host != '0' * 8 else '1' * 8}-{ended.pid}-abcd1234"
        other_kind = tmp_path / f"unibake-check-{host}-{ended.pid}-abcd1234"
        # a run of another PID namespace (a container sharing this machine's name and /tmp): its process ID reads
        # as gone here, but it holds its folder's lock
        namespace = tmp_path / f"unibake-push-{host}-{ended.pid}-ffff0000"
        for folder in (left, live, elsewhere, other_kind, namespace):
            (folder / "blobs").mkdir(parents=True)
            (folder / "blobs" / "layer").write_bytes(b"x" * 1024)
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                                   f"fd = os.open({str(namespace)!r}, os.O_RDONLY)\n"
                                   "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            made = work_folder("unibake-push-", tmp_path)
        finally:
            holder.kill()
            holder.wait()
        assert made.is_dir() and made.name.startswith(f"unibake-push-{host}-{os.getpid()}-")
        assert not left.exists()  # its process is gone and its lock free: the run was killed
        assert live.is_dir() and elsewhere.is_dir() and other_kind.is_dir()  # a run's going on; another machine's
        assert namespace.is_dir()
        # this process's own folder is locked as long as it is its: another process finds it held
        from unibake.files import _left_by_a_killed_run, work_folder_done
        probe = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[2])\n"
                                "from unibake.files import _left_by_a_killed_run\n"
                                "print(_left_by_a_killed_run(sys.argv[1]) is not None)", str(made), str(REPO)],
                               capture_output=True, text=True)
        assert probe.stdout.strip() == "False", probe.stderr
        work_folder_done(made)
        held = _left_by_a_killed_run(str(made))
        assert held is not None
        os.close(held)
    finally:
        running.kill()
        running.wait()


def test_a_thread_never_started_is_not_waited_for():
    # found by review: an interrupt between a thread's making and its start (the kit draft's) left join() waiting for
    # an event nobody would set: the run's clean-up hung until a third Ctrl-C
    from unibake.threads import Thread

    never = Thread(target=lambda: None)
    ended = threading.Event()
    waiter = threading.Thread(target=lambda: (never.join(), ended.set()), daemon=True)
    waiter.start()
    assert ended.wait(5) and not never.is_alive()
