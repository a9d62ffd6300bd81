"""The engine adapter against the real engine when an operation cannot be done: each failure is one
EngineError naming what was attempted, what it was attempted on and which engine, never docker-py's
exception (which the command line would print as a traceback)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
import uuid

import pytest

from unibake.docker_engine import DockerEngine
from unibake.errors import EngineError

BUSYBOX = "localhost/unibake-busybox:1"


@pytest.fixture
def missing() -> str:
    """An image reference no engine holds."""
    return f"unibake-test-missing/{uuid.uuid4().hex[:12]}:none"


def test_operations_on_an_image_the_engine_lacks_name_it(engine, missing):
    cases = (("starting", lambda: engine.start(missing, ["true"])),
             ("cannot read the history of", lambda: engine.history(missing)),
             ("cannot tag", lambda: engine.tag(missing, f"{missing}-copy")))
    for what, call in cases:
        with pytest.raises(EngineError) as caught:
            call()
        message = str(caught.value)
        assert what in message and missing in message and f"(engine at {engine.address})" in message
    assert engine.inspect_image(missing) is None  # absence is an answer, not an error
    engine.remove_image(missing)  # removing what is not there is no error either
    assert engine.remove_if_unused("sha256:" + "0" * 64)


def test_operations_on_a_container_that_does_not_exist_name_it(engine):
    unknown = uuid.uuid4().hex * 2
    for call in (engine.container_status, engine.container_state):
        with pytest.raises(EngineError, match=rf"cannot inspect container {unknown[:12]}: .*No such container"):
            call(unknown)
    engine.remove_container(unknown)  # already gone: no error


def test_a_run_past_its_bound_is_killed_removed_and_said_with_its_output(engine):
    from unibake.errors import RunTimedOut

    before = {c["Id"] for c in engine.api.containers(all=True)}
    start = time.monotonic()
    with pytest.raises(RunTimedOut, match=r"did not finish within 2 s") as caught:
        engine.run(BUSYBOX, ["echo waiting for the GPU; sleep 60"], timeout=2, entrypoint=["sh", "-c"])
    assert time.monotonic() - start < 20
    assert caught.value.output == "waiting for the GPU\n"
    assert {c["Id"] for c in engine.api.containers(all=True)} <= before  # killed and removed


def test_a_run_that_prints_megabytes_keeps_its_start_and_its_end_and_says_it_was_cut(engine):
    # (before: the whole output was read into memory: a self-check printing without end until its
    # bound, gigabytes in the engine's log, was read whole, and its text carried into the gate)
    from unibake.docker_engine import RUN_OUTPUT_HEAD, RUN_OUTPUT_TAIL
    from unibake.errors import RunTimedOut

    before = {c["Id"] for c in engine.api.containers(all=True)}
    lines = "; ".join(f"echo ok: check {n}" for n in range(3000))  # ~60 KiB of lines first, then 20 MB
    done = engine.run(BUSYBOX, [f"{lines}; head -c 20000000 /dev/zero | tr '\\0' x; echo; echo error: the last"],
                      timeout=60, entrypoint=["sh", "-c"])
    assert done.exit_code == 0 and len(done.output) <= RUN_OUTPUT_HEAD + RUN_OUTPUT_TAIL + 200
    assert done.output.startswith("ok: check 0\nok: check 1\n")
    assert "\n[... unibake: output cut here: only its first 64 KiB and its last 64 KiB are kept ...]\nxxx" \
        in done.output
    assert done.output.endswith("x\nerror: the last\n")
    assert done.output.count("ok: check ") == 3000 and "ok: check 2999\nxxx" in done.output  # each once, in order
    with pytest.raises(RunTimedOut) as caught:  # one that never ends: killed at its bound, its output cut too
        engine.run(BUSYBOX, ["echo error: first; while :; do head -c 1000000 /dev/zero | tr '\\0' y; echo; done"],
                   timeout=3, entrypoint=["sh", "-c"])
    output = caught.value.output
    assert output.startswith("error: first\n") and "output cut here" in output
    assert len(output) <= RUN_OUTPUT_HEAD + RUN_OUTPUT_TAIL + 200
    mid = engine.run(BUSYBOX, ["echo error: a; head -c 1000000 /dev/zero | tr '\\0' z; echo; echo error: b"],
                     entrypoint=["sh", "-c"])  # read through to its end: its last 64 KiB, none twice
    assert mid.output.startswith("error: a\nzzz") and mid.output.endswith("zzz\nerror: b\n")
    assert "output cut here" in mid.output and len(mid.output) <= RUN_OUTPUT_HEAD + RUN_OUTPUT_TAIL + 200
    small = engine.run(BUSYBOX, ["echo one; echo two >&2; printf three"], entrypoint=["sh", "-c"])
    assert sorted(small.output.split("\n")) == ["one", "three", "two"]  # what fits is kept whole (two streams)
    assert {c["Id"] for c in engine.api.containers(all=True)} <= before


def test_a_container_whose_command_cannot_start_is_not_left_created(engine):
    before = {c["Id"] for c in engine.api.containers(all=True)}
    with pytest.raises(EngineError, match=r"starting .* failed: .*/nonexistent"):
        engine.start(BUSYBOX, ["/nonexistent"], restarts=2)
    assert {c["Id"] for c in engine.api.containers(all=True)} <= before


def test_a_folder_s_header_is_read_from_a_container_that_is_then_removed(engine, missing):
    # (what an assembled hotfix's small base copies: the mode and owner of the folders it holds)
    before = {c["Id"] for c in engine.api.containers(all=True)}
    mode, uid, gid = engine.folder_header(BUSYBOX, "/bin")
    assert (mode & 0o777, uid, gid) == (0o755, 0, 0)
    assert engine.folder_header(BUSYBOX, "/no/such/folder") is None
    assert "not a folder" in engine.folder_header(BUSYBOX, "/bin/sh")
    with pytest.raises(EngineError, match=f"cannot read /bin in {missing}"):
        engine.folder_header(missing, "/bin")
    assert {c["Id"] for c in engine.api.containers(all=True)} <= before


@pytest.mark.parametrize("command,changed", [
    ("true", ()),
    ("cat /bin/sh > /dev/null; ls -R / > /dev/null", ()),  # reads change nothing
    ("mkdir /tmp/made; rmdir /tmp/made", ("C /tmp",)),  # undone, but the folder changed: a layer in a build
    ("touch /made", ("A /made",)),
    ("rm /bin/true", ("C /bin", "D /bin/true")),
    ("chmod 700 /tmp", ("C /tmp",)),
])
def test_a_run_says_what_it_changed_in_the_image_and_nothing_when_it_only_read(engine, command, changed):
    # (the assembled hotfix's in-image checks must change nothing: the whole build records any change as a layer)
    outcome = engine.run(BUSYBOX, ["sh", "-c", command], changes=True)
    assert (outcome.exit_code, tuple(sorted(outcome.changes))) == (0, changed)


def test_a_started_container_reports_its_exit_and_restarts(engine):
    container = engine.start(BUSYBOX, ["sh", "-c", "exit 3"], restarts=2)
    try:
        for _ in range(200):  # the engine restarts it twice, then leaves it exited
            status = engine.container_status(container)
            if not status.running and not status.restarting and status.restart_count == 2:
                break
            time.sleep(0.1)
        assert (status.running, status.restart_count, status.exit_code, status.oom_killed) == (False, 2, 3, False)
    finally:
        engine.remove_container(container)


def test_a_load_the_engine_refuses_is_one_error_with_its_reason(engine):
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:  # a tar, but no image in it
        data = b"not an image"
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(EngineError, match=r"(the engine refused the image|loading the image failed): .+ \(engine at "):
        engine.load([stream.getvalue()])


def test_an_engine_that_does_not_listen_is_named(tmp_path):
    address = f"unix://{tmp_path}/nobody.sock"
    with pytest.raises(EngineError) as caught:
        DockerEngine(address).version()
    assert str(caught.value).startswith(f"cannot reach the Docker engine at {address}: no engine listens there") or \
        str(caught.value).startswith("the Docker engine does not answer: no engine listens there")


def test_an_engine_whose_answer_never_ends_is_one_error_after_a_bounded_read(tmp_path):
    # found by probing: an address of a deploy's hosts file answering an image's inspect with endless bytes grew the
    # client to 9.8 GB in 16 s, --engine-timeout no help (bytes kept coming); no real engine is needed, so none is
    # reached: a server on a socket here answers as Engine 20.10 would, but without end for the image
    import http.server
    import socketserver
    import threading

    from unibake.docker_engine import MAX_ANSWER

    sent = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if not self.path.startswith("/v1.41/images/"):
                body = b'{"ApiVersion": "1.41", "Version": "20.10.24", "Os": "linux", "Arch": "amd64"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Api-Version", "1.41")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
            piece, total = b"a" * (1 << 20), 0
            try:
                self.wfile.write(b'{"Id": "')
                while total < 4 * MAX_ANSWER:
                    self.wfile.write(piece)
                    total += len(piece)
            except OSError:
                pass  # the client went
            sent.append(total)

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self):
            request, _ = super().get_request()
            return request, ("local", 0)

    sock = tmp_path / "endless.sock"
    server = Server(str(sock), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        engine = DockerEngine(f"unix://{sock}", timeout=30)
        with pytest.raises(EngineError, match=rf"its answer to /v1\.41/images/x:1/json is longer than 128 MiB, "
                                              rf"more than any engine gives there: not read further \(engine at "
                                              rf"unix://{sock}\)"):
            engine.inspect_image("x:1")
        deadline = time.monotonic() + 30  # (a hang guard: the server sees the client go at its next write)
        while not sent and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sent and sent[0] < 2 * MAX_ANSWER  # the client stopped reading, not the server sending
    finally:
        server.shutdown()
        server.server_close()


def test_a_pull_from_a_registry_nobody_serves_says_so(engine):
    digest = "sha256:" + "1" * 64
    with pytest.raises(EngineError, match=r"the engine could not pull 127\.0\.0\.1:9/nothing@sha256:1{64}|"
                                          r"pulling 127\.0\.0\.1:9/nothing@sha256:1{64} failed"):
        engine.pull("127.0.0.1:9/nothing", digest, None)


def test_prune_never_forces_out_an_image_a_container_uses(engine, version, images):
    """``untag`` and ``remove_if_unused`` (what prune calls) leave an image a stopped container was
    created from, tag and all; once the container is gone they remove it."""
    from .conftest import build_dockerfile

    tag = build_dockerfile(engine, f"unibake-test-used:{version}", f"FROM {BUSYBOX}\nLABEL t={version}\n".encode())
    images(tag)
    image_id = engine.inspect_image(tag).id
    container = engine.api.create_container(image_id, ["true"])["Id"]  # docker create --name c <id> true
    try:
        assert engine.untag(tag) is False
        assert engine.inspect_image(tag).id == image_id  # nothing changed
        engine.tag(image_id, f"{tag}-second")
        assert engine.untag(f"{tag}-second") is True and engine.inspect_image(f"{tag}-second") is None  # another tag
    finally:
        engine.remove_container(container)
    assert engine.untag(tag) is True and engine.inspect_image(image_id) is None


def test_an_engine_elsewhere_that_cannot_be_reached_gets_a_hint_for_elsewhere():
    """Nothing listens on port 1 here: the hint is not to run this project's setup script, which
    starts only the local engine."""
    with pytest.raises(EngineError) as caught:
        DockerEngine("tcp://127.0.0.1:1")
    assert str(caught.value) == ("cannot reach the Docker engine at tcp://127.0.0.1:1: no engine listens there; "
                                 "check that the engine runs there and that this machine reaches it")


@pytest.mark.parametrize("path, reason", [
    (os.defpath, "ssh did not connect, or no engine answered through it (ssh's own message, if any, is above)"),
    ("/nonexistent", "no ssh client is installed here (docker-py runs ssh)")])
def test_an_ssh_engine_that_cannot_be_reached_says_what_ssh_did(monkeypatch, path, reason):
    """Not docker-py's "('Connection aborted.', BrokenPipeError(32, 'Broken pipe'))", and never 'no
    engine listens there' when it is the ssh client that is missing."""
    if path == os.defpath and shutil.which("ssh", path=path) is None:
        pytest.fail("this machine kind has an ssh client (openssh-client): the case needs it")
    monkeypatch.setenv("PATH", path)
    with pytest.raises(EngineError) as caught:
        DockerEngine("ssh://nobody@127.0.0.1:1")
    assert str(caught.value) == (f"cannot reach the Docker engine at ssh://nobody@127.0.0.1:1: {reason}; check that "
                                 "the engine runs there and that this machine reaches it")


def test_a_name_already_taken_is_name_in_use_and_the_taken_one_is_left(engine):
    # the multi-node gate removes by name what it made: a name the engine refused is another's
    from unibake.errors import NameInUse

    name = f"unibake-test-taken-{uuid.uuid4().hex[:10]}"
    engine.create_network(name)
    container = None
    try:
        with pytest.raises(NameInUse, match=f"cannot create network {name}.*engine at"):
            engine.create_network(name)
        container = engine.start(BUSYBOX, ["sleep", "60"], name=name)
        with pytest.raises(NameInUse, match=f"starting {BUSYBOX} failed.*engine at"):
            engine.start(BUSYBOX, ["sleep", "60"], name=name)
        assert engine.container_status(container).running
    finally:
        if container is not None:
            engine.remove_container(container)
        engine.remove_network(name)
