"""The smoke gate on the fake engine, against a real HTTP server on loopback standing in for the
inference engine: each step's verdict, and the first failing step named."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from unibake.engine import RunOutcome
from unibake.metadata import ImageMetadata
from unibake.smoke import run_gates

from .. import fake_engine
from ..conftest import signal_inside_popen, terminated_as_the_cli
from ..fake_engine import FakeEngine


class Engine(BaseHTTPRequestHandler):
    reply = "UNIFIED_TP1_OK model=demo"
    replies: dict = {}
    health = 200

    health_wire: list = []  # what the first /health requests get, one each, sent as it is (status line and all)
    health_body = b'{"status": "ok"}'

    ready_at = 0.0  # time.monotonic() before which /health answers 503 (still loading)
    thinking = 0.0  # seconds before a chat completion is answered
    health_thinking = 0.0  # seconds before /health is answered (one that runs the model to say it is up)

    health_redirect: str | None = None  # where /health sends the client instead of answering (a Location)
    # answering with no container of a fake engine running: another server at the container's address
    answers_when_gone = False

    def do_GET(self):  # noqa: N802 - the handler's name is http.server's
        if fake_engine.REMOVED and not fake_engine.LIVE and not self.answers_when_gone:  # gone with its container
            self.close_connection = True
            return
        if self.health_redirect is not None and self.path == "/health":
            self.send_response(302)
            self.send_header("Location", self.health_redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if time.monotonic() < self.ready_at:
            self.send_error(503)
            return
        time.sleep(self.health_thinking)
        if self.health_wire:
            self.wfile.write(self.health_wire.pop(0))
            self.close_connection = True
            return
        body = self.health_body
        self.send_response(self.health)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    raw: bytes | None = None  # a body sent as it is
    chat_status = 200
    cut_at_max_tokens = False
    wire: bytes | None = None  # a whole response sent as it is, status line and all
    trickle: bool | str = False  # a body that never ends (True: for every prompt; a prompt: for that one)

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = request["messages"][0]["content"]
        reply = self.replies.get(prompt, self.reply) if self.replies else self.reply
        assert prompt.startswith("Say")
        if self.cut_at_max_tokens:  # as an engine stops at max_tokens: here a token per character
            reply = reply[:request["max_tokens"]]
        time.sleep(self.thinking)
        if self.wire is not None:
            self.wfile.write(self.wire)
            self.close_connection = True
            return
        body = self.raw if self.raw is not None else json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
        trickle = self.trickle is True or self.trickle == prompt
        self.send_response(self.chat_status)
        self.send_header("Content-Length", str(len(body) if not trickle else 1 << 20))
        self.end_headers()
        if not trickle:
            self.wfile.write(body)
            return
        for _ in range(600):  # until the client is stopped (a broken pipe), at most a minute
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.1)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    fake_engine.LIVE.clear()
    fake_engine.REMOVED.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    Engine.reply, Engine.health, Engine.replies, Engine.raw, Engine.trickle = "UNIFIED_TP1_OK model=demo", 200, {}, \
        None, False
    Engine.wire, Engine.health_wire, Engine.health_body = None, [], b'{"status": "ok"}'
    Engine.ready_at, Engine.thinking, Engine.chat_status, Engine.cut_at_max_tokens = 0.0, 0.0, 200, False
    Engine.health_redirect, Engine.health_thinking, Engine.answers_when_gone = None, 0.0, False
    fake_engine.LIVE.clear()
    fake_engine.REMOVED.clear()


def metadata(port: int, expect: str | None = "UNIFIED_TP1_OK", timeout: int = 5) -> ImageMetadata:
    return ImageMetadata.model_validate({
        "product": "demo", "version": "1", "tag": "demo:1", "default_profile": "tp1", "components": [],
        "launch": {"port": port, "model_name": "demo", "mounts": {}},
        "profiles": {"tp1": {"gpus": 1, "vendor": "nvidia", "kernels": [], "tune_caches": 0, "sidecars": [],
                             "args": [], "smoke": {"expect_reply": expect, "prompt": "Say it.", "timeout": timeout}}}},
        strict=False)


@pytest.fixture
def engine():
    e = FakeEngine()
    e.add({"config": {}}, [b"\0" * 1024], tag="demo:1")
    return e


def test_a_profile_that_starts_and_answers_passes(engine, server):
    results = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)
    assert [(s.name, s.passed) for s in results[0].steps] == [("self-check", True), ("start", True),
                                                              ("health", True), ("chat", True), ("stability", True)]
    assert results[0].steps[3].detail == "UNIFIED_TP1_OK model=demo"
    assert (results[0].restart_count, results[0].oom_killed) == (0, False)
    assert engine.containers == {}  # the engine's container is removed after its gate


def test_a_wrong_reply_fails_the_chat_step(engine, server):
    Engine.reply = "something else"
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat"
    assert "expected 'UNIFIED_TP1_OK' in the reply, got 'something else'" in result.failed.detail


def test_a_failing_self_check_stops_the_gate_there(engine, server):
    engine.runner = lambda image, args, env: RunOutcome(exit_code=1, output="error: self-check[tp1]: kernel missing\n")
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert [s.name for s in result.steps] == ["self-check"] and "kernel missing" in result.failed.detail


def test_a_failing_self_check_is_named_by_its_error_lines_not_the_checks_that_passed_after(engine, server):
    output = ("self-check[tp1]: ok: platform linux/amd64 (uname -m: x86_64)\n"
              "error: self-check[tp1]: files differ from meta/files.sha256: engine/serve.sh: FAILED\n"
              "self-check[tp1]: ok: 2 tune-cache JSON files in /opt/unibake/profiles/tp1/tune\n"
              "self-check[tp1]: ok: 3 kernels load\n")
    engine.runner = lambda image, args, env: RunOutcome(exit_code=1, output=output)
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.detail == \
        "exit 1: error: self-check[tp1]: files differ from meta/files.sha256: engine/serve.sh: FAILED"


def test_a_self_check_that_never_finishes_fails_the_gate_not_the_run(engine, server):
    # the engine kills a run past its bound (RunTimedOut, with what it printed): the image's check
    # failed (exit 3, the step named), not the engine (exit 1)
    from unibake.errors import RunTimedOut

    def hangs(image, args, env):
        raise RunTimedOut("demo:1 self-check did not finish within 120 s",
                          output="self-check[tp1]: ok: platform\nwaiting for the GPU\n")

    engine.runner = hangs
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert [(s.name, s.passed) for s in result.steps] == [("self-check", False)]
    assert result.failed.detail == "did not finish within 120 s: self-check[tp1]: ok: platform waiting for the GPU"


def test_an_engine_that_exits_at_once_fails_the_start_step(engine, server):
    def crash(container):
        container.running, container.logs = False, "Traceback: bad flag\n"

    engine.starter = crash
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "start" and "bad flag" in result.failed.detail


def test_an_image_that_writes_a_megabyte_without_a_newline_gives_an_error_line_of_its_end_only(engine, server):
    # the gate's detail is the run's one error: line (and the --json document): it quotes the end of each line
    flood = "x" * (1 << 20)
    engine.runner = lambda image, args, env: RunOutcome(exit_code=1, output=f"error: {flood}kernel missing\n")
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.detail.endswith("xxkernel missing") and len(result.failed.detail) < 400

    def crash(container):
        container.running, container.logs = False, f"{flood}bad flag\nsecond {flood}\n"

    engine.runner, engine.starter = (lambda image, args, env: RunOutcome(exit_code=0, output="ok")), crash
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "start" and "xxbad flag | …" in result.failed.detail
    assert len(result.failed.detail) < 1000

def test_an_engine_that_never_answers_fails_the_health_step(engine):
    result = run_gates(engine, "demo:1", metadata(1, timeout=1), netns_pid=None)[0]  # nothing listens on port 1
    assert result.failed.name == "health" and "did not answer" in result.failed.detail
    # where it was asked, so that an address the client cannot reach is seen as such
    assert result.failed.detail.startswith("http://127.0.0.1:1/health did not answer within 1 s (")
    # and what bounds that wait, for a model that loads for longer (before: the bound alone, no key)
    assert "; the profile's smoke.timeout bounds the wait); engine log: " in result.failed.detail


def planned(port: int, smoke: dict) -> ImageMetadata:
    """Metadata as a build writes it today: the profile's smoke spec through the plan's rules."""
    document = metadata(port).model_dump()
    document["profiles"]["tp1"]["smoke"] = {"timeout": 5, "prompts": smoke}
    return ImageMetadata.model_validate(document, strict=False)


def test_the_exact_reply_is_the_default_and_a_reply_that_only_contains_it_fails(engine, server):
    Engine.reply = "NOT UNIFIED_TP1_OK -- a wrong answer"
    result = run_gates(engine, "demo:1", planned(server.server_port, [{"prompt": "Say it.", "expect": "UNIFIED_TP1_OK"}]),
                       netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat"
    assert result.failed.detail == "expected exactly 'UNIFIED_TP1_OK', got 'NOT UNIFIED_TP1_OK -- a wrong answer'"
    Engine.reply = "  UNIFIED_TP1_OK\n"  # surrounding whitespace is not part of the answer
    assert run_gates(engine, "demo:1", planned(server.server_port, [{"prompt": "Say it.", "expect": "UNIFIED_TP1_OK"}]),
                     netns_pid=None)[0].passed


def test_several_prompts_each_with_its_own_match(engine, server):
    Engine.replies = {"Say one.": "ONE", "Say two.": "the answer is TWO today", "Say three.": "tp=3 kernels=[a b]"}
    smoke = [{"prompt": "Say one.", "expect": "ONE"},
             {"prompt": "Say two.", "expect": "TWO", "match": "contains"},
             {"prompt": "Say three.", "expect": r"tp=3 kernels=\[.*\]", "match": "regex"}]
    result = run_gates(engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.passed, result.steps
    assert [(c.prompt, c.match, c.passed) for c in result.chats] == [
        ("Say one.", "exact", True), ("Say two.", "contains", True), ("Say three.", "regex", True)]
    Engine.replies["Say three."] = "prefix tp=3 kernels=[a b]"  # a regex must match the whole reply
    result = run_gates(engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert [c.passed for c in result.chats] == [True, True, False]
    assert result.failed.detail.startswith("prompt 3 of 3: expected a reply matching ")


@pytest.mark.parametrize("restarts,oom,detail", [
    (1, False, "restarted 1 time"),
    (0, True, "OOM-killed"),
])
def test_a_restarted_or_oom_killed_engine_fails_the_gate_after_answering(engine, server, restarts, oom, detail):
    def unstable(container):
        container.restart_count, container.oom_killed = restarts, oom

    engine.starter = unstable
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert [s.name for s in result.steps][-2:] == ["chat", "stability"]
    assert result.failed.name == "stability" and result.failed.detail == detail
    assert (result.restart_count, result.oom_killed) == (restarts, oom)
    assert next(iter(engine.containers.values()), None) is None  # removed all the same


def test_the_gate_container_runs_with_a_restart_policy(engine, server):
    seen = []
    engine.starter = lambda container: seen.append(container.restarts)
    run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)
    assert seen and seen[0] > 0  # without one, the engine would never count a restart



def gates_within(seconds: float, *args, **kwargs):
    """run_gates, in a thread: a gate that hangs fails the test instead of hanging the suite."""
    done: list = []

    def gates():
        try:
            done.append(run_gates(*args, **kwargs))
        except BaseException as exc:  # raised here, in the test, not lost in the thread
            done.append(exc)

    thread = threading.Thread(target=gates, daemon=True)
    thread.start()
    thread.join(seconds)
    assert done, f"the gate did not finish within {seconds} s"
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def test_a_reply_bigger_than_a_pipe_holds_is_read_not_waited_on(engine, server):
    Engine.reply = "UNIFIED_TP1_OK " + "x" * 200_000
    smoke = [{"prompt": "Say it.", "expect": "UNIFIED_TP1_OK", "match": "contains"}]
    result = gates_within(60, engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.passed, result.steps


def test_a_reply_that_never_ends_fails_within_the_gates_bound(engine, server, monkeypatch):
    import unibake.smoke

    monkeypatch.setattr(unibake.smoke, "PROBE_MARGIN", 1.0)
    Engine.trickle = True
    start = time.monotonic()
    result = gates_within(60, engine, "demo:1", metadata(server.server_port, timeout=1), netns_pid=None)[0]
    assert not result.passed and "did not finish answering within 7 s" in result.failed.detail
    assert time.monotonic() - start < 30
    # /health answered: the step that never ended is the chat, and the notes' table says so
    assert [(s.name, s.passed) for s in result.steps] == [("self-check", True), ("start", True), ("health", True),
                                                          ("chat", False)]
    assert [(c.prompt, c.passed) for c in result.chats] == [("Say it.", False)]


def test_a_reply_that_never_ends_is_named_by_its_prompt_after_those_that_were_answered(engine, server, monkeypatch):
    import unibake.smoke

    monkeypatch.setattr(unibake.smoke, "PROBE_MARGIN", 1.0)
    Engine.replies, Engine.trickle = {"Say one.": "ONE", "Say two.": "TWO"}, "Say two."
    smoke = [{"prompt": "Say one.", "expect": "ONE"}, {"prompt": "Say two.", "expect": "TWO"}]
    document = planned(server.server_port, smoke).model_dump()
    document["profiles"]["tp1"]["smoke"]["timeout"] = 1
    result = gates_within(60, engine, "demo:1", ImageMetadata.model_validate(document, strict=False),
                          netns_pid=None)[0]
    assert [(s.name, s.passed) for s in result.steps][2:] == [("health", True), ("chat", True), ("chat", False)]
    assert result.failed.detail == "prompt 2 of 2: the engine did not finish answering within 12 s (a reply that never ends)"
    assert [(c.prompt, c.reply, c.passed) for c in result.chats] == [("Say one.", "ONE", True), ("Say two.", "", False)]


@pytest.mark.parametrize("body", [b'{"choices":[{"message":{"content":"UNIFIED_TP1_OK \\ud800"}}]}',
                                  b'{"choices":[{"message":{"content":"UNIFIED_TP1_OK"}}], "pad": "' +
                                  b"x" * (2 << 20) + b'"}'])
def test_a_reply_no_file_could_hold_or_too_big_to_be_an_answer_fails_the_chat_step(engine, server, body):
    Engine.raw = body
    smoke = [{"prompt": "Say it.", "expect": "UNIFIED_TP1_OK", "match": "contains"}]
    result = gates_within(60, engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat", result.steps
    assert "the chat completion failed" in result.failed.detail
    result.model_dump_json()  # what the notes and VALIDATION.json are written from


def test_an_images_own_smoke_regex_that_could_backtrack_for_ever_is_refused_as_a_profiles_is():
    # archive IMAGE reads the gate from the image's label; its engine supplies the reply matched against it
    from unibake.errors import VerificationError

    document = metadata(1).model_dump()
    document["profiles"]["tp1"]["smoke"] = {"timeout": 5, "prompts": [{"prompt": "Say it.", "expect": "(a+)+$",
                                                                        "match": "regex"}]}
    with pytest.raises(VerificationError, match="could backtrack without end"):
        ImageMetadata.parse(json.dumps(document), "the label io.unibake.metadata of x:1")


def test_an_epoch_label_that_is_no_time_is_ignored_not_a_traceback():
    from unibake.normalise import EPOCH_LABEL
    from unibake.supply import _epoch

    assert _epoch({EPOCH_LABEL: "1700000000"}) == 1700000000
    assert _epoch({EPOCH_LABEL: "9" * 23}) is None and _epoch({EPOCH_LABEL: "\u00b2"}) is None


NOT_HTTP = {  # what an engine that is not (yet) an HTTP server, or a broken one, may send
    "not_http": b"HELLO\r\n\r\n",
    "over_100_headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n",
    "bad_chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "json_200000_deep": b"HTTP/1.1 200 OK\r\nContent-Length: 400000\r\n\r\n" + b"[" * 200_000 + b"]" * 200_000,
}


@pytest.mark.parametrize("wire", NOT_HTTP.values(), ids=NOT_HTTP.keys())
def test_a_reply_that_is_not_http_or_json_fails_the_chat_step_not_the_release(engine, server, wire):
    Engine.wire = wire
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat", result.steps
    assert result.failed.detail.startswith("the chat completion failed: ")
    assert ("not a well-formed HTTP reply" in result.failed.detail) != wire.endswith(b"]")
    assert "Traceback" not in result.failed.detail and "http/client.py" not in result.failed.detail


def test_a_health_check_that_answers_garbage_while_loading_is_asked_again(engine, server):
    Engine.health_wire = list(NOT_HTTP.values())
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.passed, result.steps
    assert Engine.health_wire == []



def test_each_prompt_gets_its_own_bound_however_late_the_engine_became_ready(server, monkeypatch):
    from unibake import smoke_client

    monkeypatch.setattr(smoke_client, "MIN_WAIT", 0.5)  # the floor, scaled down with the rest of the test
    Engine.ready_at, Engine.thinking = time.monotonic() + 1.5, 1.0  # ready late in the 2 s wait; a 1 s answer
    answer = smoke_client.probe(f"http://127.0.0.1:{server.server_port}", prompts=["Say it."], model="demo", timeout=2)
    assert answer["health"] and answer["chats"] == [{"reply": "UNIFIED_TP1_OK model=demo",
                                                     "seconds": answer["chats"][0]["seconds"]}], answer


def test_a_prompt_without_an_expected_reply_still_needs_a_non_empty_one(engine, server):
    Engine.reply = " \n"  # an engine that answers nothing
    result = run_gates(engine, "demo:1", metadata(server.server_port, expect=None), netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat"
    assert result.failed.detail == "expected a non-empty reply, got ' \\n'"
    Engine.reply = "anything at all"
    assert run_gates(engine, "demo:1", metadata(server.server_port, expect=None), netns_pid=None)[0].passed


def test_a_smoke_regex_that_backtracks_for_long_on_a_long_reply_fails_the_gate_in_bounded_time(engine, server, monkeypatch):
    import unibake.smoke

    monkeypatch.setattr(unibake.smoke, "REGEX_SECONDS", 1.0, raising=False)
    pattern = "SMOKE_OK .* tp=[0-9]+ .* ep=on .*done"  # accepted: no nesting, but cubic on a wrong reply
    Engine.reply = "SMOKE_OK " + " tp=1 ep=on" * 1000  # 11 KB: seconds of backtracking (minutes at 48 KB)
    start = time.monotonic()
    result = run_gates(engine, "demo:1", planned(server.server_port, [{"prompt": "Say it.", "expect": pattern,
                                                                        "match": "regex"}]), netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat"
    assert result.failed.detail.startswith(f"the regular expression {pattern!r} took longer than 1 s on a reply "
                                           "of 11009 bytes (write it with fewer unbounded repeats like .*)")
    assert time.monotonic() - start < 30  # (a hang guard: 6 s flaked on a loaded machine; the detail says 1 s)


def _smoke_clients() -> list[int]:
    """This process's children running the smoke client."""
    import os
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"unibake.smoke_client" in cmdline:
            found.append(int(entry.name))
    return found

def _assert_no_smoke_client_left(engine) -> None:
    """No smoke client runs on (any found is killed, then named), and no container is left."""
    import os
    import signal

    left = _smoke_clients()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert left == [], "the smoke client was left running"
    assert engine.containers == {}


def test_an_interrupt_during_the_gate_leaves_no_smoke_client_behind(engine):
    # SIGTERM reaches unibake alone (not its process group, as ^C does): the client must go with the gate
    calls = []

    def interrupted(container):
        calls.append(container)
        if len(calls) == 3:  # the client is running, waiting for a /health nothing answers
            raise KeyboardInterrupt
        return type(engine).container_status(engine, container)

    engine.container_status = interrupted
    with pytest.raises(KeyboardInterrupt):
        run_gates(engine, "demo:1", metadata(1, timeout=60), netns_pid=None)  # nothing listens on port 1
    _assert_no_smoke_client_left(engine)


def test_an_interrupt_just_as_the_smoke_client_starts_leaves_no_smoke_client_behind(engine, monkeypatch):
    # (before: an interrupt as its prompts' file was closed, right after the client started and before the wait
    # that ends it on any exit, left it running: SIGTERM reaches unibake alone, and the client polled the removed
    # container for up to smoke.timeout)
    import tempfile

    from unibake import smoke

    class Prompts:  # the prompts' file, the interrupt coming as it is closed
        def __init__(self):
            self.file = tempfile.TemporaryFile()

        def __enter__(self):
            return self.file

        def __exit__(self, *exc):
            self.file.close()
            raise KeyboardInterrupt

    class Tempfile:
        TemporaryFile = Prompts

    monkeypatch.setattr(smoke, "tempfile", Tempfile)
    with pytest.raises(KeyboardInterrupt):
        run_gates(engine, "demo:1", metadata(1, timeout=60), netns_pid=None)  # nothing listens on port 1
    _assert_no_smoke_client_left(engine)


def test_an_interrupt_inside_popen_as_the_smoke_client_starts_leaves_no_smoke_client_behind(engine, monkeypatch):
    # (before: an interrupt inside subprocess.Popen's __init__, once the client was made, never returned the Popen
    # object: nothing ended the client, which polled the removed container for up to smoke.timeout)
    from unibake import smoke

    started = signal_inside_popen(monkeypatch, smoke, lambda args: "unibake.smoke_client" in " ".join(args))
    with terminated_as_the_cli():
        with pytest.raises(KeyboardInterrupt):
            run_gates(engine, "demo:1", metadata(1, timeout=60), netns_pid=None)  # nothing listens on port 1
    assert len(started) == 1
    _assert_no_smoke_client_left(engine)


@pytest.mark.parametrize("body,detail", [
    (b"OK", "OK"),  # what many engines answer
    (b"", "{}"),  # vLLM, SGLang: an empty 200
    (b"\xffup\n", "\ufffdup\n"),
    (json.dumps({"status": "ok", "pad": "x" * 900_000}).encode(), ("{\"pad\": \"" + "x" * 300)[:300]),
    # (before: a 200 over 1 MiB was asked again until smoke.timeout: "the body is over 1048576 bytes")
    (b"up " * 500_000, ("up " * 100)[:300]),
])
def test_a_health_check_that_answers_200_with_any_body_is_up(engine, server, body, detail):
    Engine.health_body = body
    result = gates_within(60, engine, "demo:1", metadata(server.server_port, timeout=3), netns_pid=None)[0]
    assert result.passed, result.steps
    assert result.steps[2].name == "health" and result.steps[2].detail == detail  # at most 300 characters kept


@pytest.mark.parametrize("status,body,said", [
    (404, b'{"object": "error",\n "message": "The model `demo` does not exist."}',
     'HTTP 404 Not Found: {"object": "error", "message": "The model `demo` does not exist."}'),
    (200, b'{"error": {"message": "max_tokens is too large"}}',
     'the reply is not a chat completion (no choices[0].message.content): '
     '{"error": {"message": "max_tokens is too large"}}'),
    (500, b"", "HTTP 500 Internal Server Error"),
])
def test_a_chat_completion_refused_says_the_status_and_what_the_engine_said(engine, server, status, body, said):
    Engine.chat_status, Engine.raw = status, body
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "chat" and result.failed.detail == f"the chat completion failed: {said}"


def test_a_long_expected_reply_is_given_the_tokens_it_needs(engine, server):
    # max_tokens was 64 for every prompt: an engine that honours it could never give a longer expected reply
    long = "UNIFIED_TP1_OK " + " ".join(f"kernel{i}=loaded" for i in range(12))  # 207 characters
    Engine.replies, Engine.cut_at_max_tokens = {"Say it all.": long, "Say it.": "UNIFIED_TP1_OK"}, True
    smoke = [{"prompt": "Say it all.", "expect": long}, {"prompt": "Say it.", "expect": "OK", "match": "contains"}]
    result = gates_within(60, engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.passed, result.steps


def test_a_reply_in_another_unicode_normal_form_fails_saying_how_it_differs(engine, server):
    Engine.reply = "UNIFIED_TP1_OK caf\u0065\u0301"  # decomposed: prints as the expected text does
    smoke = [{"prompt": "Say it.", "expect": "UNIFIED_TP1_OK caf\u00e9"}]
    result = run_gates(engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.failed.name == "chat"
    assert result.failed.detail.startswith("expected exactly 'UNIFIED_TP1_OK caf\u00e9' (the reply is the same text "
                                           "in another Unicode normal form, 'UNIFIED_TP1_OK cafe\\u0301')")


def test_a_reply_holding_the_expected_text_in_another_unicode_normal_form_says_so(engine, server):
    # match: contains said only "expected 'café' in the reply" of a reply that printed it
    Engine.reply = "UNIFIED_TP1_OK: le caf\u0065\u0301 est pr\u00eat"
    smoke = [{"prompt": "Say it.", "expect": "caf\u00e9", "match": "contains"}]
    result = run_gates(engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.failed.name == "chat"
    assert result.failed.detail.startswith("expected 'caf\u00e9' in the reply (it holds the same text in another "
                                           "Unicode normal form: 'UNIFIED_TP1_OK: le cafe\\u0301 est pr\\xeat')"), \
        result.failed.detail


@pytest.mark.parametrize("body,said", [
    (b'{"choices":[{"message":{"content":"UNIFIED_TP1_OK \xe9t\xe9"}}]}',  # Latin-1
     "the body is not UTF-8 text (invalid continuation byte at byte 50)"),
    (b'{"choices":[{"message":{"content":"UNIFIED_TP1_OK \\ud800"}}]}',
     "the body holds '\\ud800', a lone surrogate: not text a file can hold"),
])
def test_a_reply_that_is_not_text_says_why_in_words(engine, server, body, said):
    Engine.raw = body  # before: "invalid continuation byte" / "surrogates not allowed", and nothing more
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "chat" and result.failed.detail == f"the chat completion failed: {said}"


def test_an_engine_that_crashes_on_every_start_is_named_once_with_its_exit_code(engine):
    # the restart policy starts a crashing engine again: its logs hold one error per start, and the
    # gate's line said it three times ("...: No such file | ...: No such file | ...: No such file")
    # without the exit code
    said = "acme-engine: cannot open /models/target/config.json: No such file or directory\n"

    def crashes_later(container):
        def crash():
            time.sleep(0.3)
            container.logs, container.restart_count, container.exit_code = said * 3, 2, 17
            container.running = False

        threading.Thread(target=crash, daemon=True).start()

    engine.starter = crashes_later
    result = run_gates(engine, "demo:1", metadata(1, timeout=10), netns_pid=None)[0]  # nothing listens on port 1
    assert result.failed.name == "health"
    assert result.failed.detail.endswith("the engine exited with code 17 before answering, started 3 times: "
                                         + said.strip()), result.failed.detail


def multi_node(port: int, nodes: int = 4, timeout: int = 3) -> ImageMetadata:
    document = metadata(port, timeout=timeout).model_dump()
    document["profiles"]["tp1"]["topology"] = {"nodes": nodes, "network": "host", "master_port": 20000}
    return ImageMetadata.model_validate(document, strict=False)


def waits_for_its_peers(engine: FakeEngine, nodes: int):
    """A distributed engine: rank 0's /health answers once every peer has come to MASTER_ADDR."""
    Engine.ready_at = float("inf")

    def starter(container):
        ranks = {c.env.get("NODE_RANK"): c for c in list(engine.containers.values()) + [container]}
        master = ranks.get("0")
        if master is None or len(ranks) < nodes:
            return
        peers = [ranks[str(r)] for r in range(1, nodes)]
        if all(p.network == master.network and p.env["MASTER_ADDR"] == master.name and master.name in p.hosts
               and p.env["NNODES"] == str(nodes) and p.env["MASTER_PORT"] == "20000" for p in peers):
            Engine.ready_at = 0.0

    return starter


def test_a_multi_node_profile_starts_every_rank_on_a_private_network_and_gates_rank_0(engine, server):
    # (before: rank 0 alone, MASTER_ADDR=127.0.0.1: an engine that waits for its peers never answered)
    engine.starter = waits_for_its_peers(engine, 4)
    seen: list = []
    real_start = engine.start

    def start(image, args, **kw):
        cid = real_start(image, args, **kw)
        seen.append(engine.containers[cid])
        return cid

    engine.start = start
    result = run_gates(engine, "demo:1", multi_node(server.server_port), netns_pid=None)[0]
    assert result.passed, result.steps
    assert [c.env["NODE_RANK"] for c in seen] == ["0", "1", "2", "3"]
    assert all(c.env["PROFILE"] == "tp1" and c.restarts for c in seen)
    assert len({c.network for c in seen}) == 1 and seen[0].network.startswith("unibake-smoke-")
    assert result.steps[-1].detail == "4 ranks running, 0 restarts, not OOM-killed"
    assert engine.containers == {} and engine.networks == {}  # every rank and the network removed


@pytest.mark.parametrize("topology, ipc, shm", [
    ({}, "host", None),  # run.sh's default: the host's IPC, its /dev/shm
    ({"ipc": "private", "shm_size": "16g"}, "private", 16 << 30),
    ({"ipc": "shareable", "shm_size": "512m"}, "shareable", 512 << 20),
    ({"ipc": "private"}, "private", None),  # docker's 64 MiB, as run.sh gives it
])
def test_the_gate_container_gets_the_profiles_ipc_mode_and_shm_size_as_run_sh_gives_them(engine, server, topology,
                                                                                         ipc, shm):
    # (before: the engine's default, private IPC with a /dev/shm of 64 MiB, whatever the profile asked: a server
    # that needs a big /dev/shm was not tested as it runs)
    seen: list = []
    engine.starter = seen.append
    document = metadata(server.server_port).model_dump()
    document["profiles"]["tp1"]["topology"] = topology
    result = run_gates(engine, "demo:1", ImageMetadata.model_validate(document, strict=False), netns_pid=None)[0]
    assert result.passed, result.steps
    assert [(c.ipc, c.shm_size) for c in seen] == [(ipc, shm)]
    # every rank of a multi-node gate too
    seen.clear()
    engine.starter = lambda container: (seen.append(container), starter(container))
    starter = waits_for_its_peers(engine, 2)
    document["profiles"]["tp1"]["topology"] = {**topology, "nodes": 2, "network": "host", "master_port": 20000}
    result = run_gates(engine, "demo:1", ImageMetadata.model_validate(document, strict=False), netns_pid=None)[0]
    assert result.passed, result.steps
    assert [(c.ipc, c.shm_size) for c in seen] == [(ipc, shm)] * 2


def test_a_multi_node_rank_that_restarted_fails_the_stability_step_naming_it(engine, server):
    wait = waits_for_its_peers(engine, 3)

    def starter(container):
        wait(container)
        if container.env["NODE_RANK"] == "2":
            container.restart_count, container.oom_killed = 1, True

    engine.starter = starter
    result = run_gates(engine, "demo:1", multi_node(server.server_port, nodes=3), netns_pid=None)[0]
    assert result.failed.name == "stability" and result.failed.detail == "rank 2: restarted 1 time; OOM-killed"
    assert (result.restart_count, result.oom_killed) == (1, True)
    assert engine.containers == {} and engine.networks == {}


@pytest.mark.parametrize("fault", ["engine", "interrupt"])
def test_a_multi_node_gate_that_fails_to_start_a_rank_leaves_no_container_or_network(engine, server, fault):
    from unibake.errors import EngineError

    def starter(container):
        if container.env["NODE_RANK"] == "2":
            raise EngineError("starting demo:1 failed: no room") if fault == "engine" else KeyboardInterrupt()

    engine.starter = starter
    with pytest.raises(EngineError if fault == "engine" else KeyboardInterrupt):
        run_gates(engine, "demo:1", multi_node(server.server_port), netns_pid=None)
    assert engine.containers == {} and engine.networks == {}


def test_a_multi_node_rank_0_that_exits_at_once_fails_the_start_step_and_starts_no_peer(engine, server):
    def starter(container):
        container.running, container.logs = False, "error: --nnodes 4 needs a GPU\n"

    engine.starter = starter
    result = run_gates(engine, "demo:1", multi_node(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "start" and "needs a GPU" in result.failed.detail
    assert engine.containers == {} and engine.networks == {}


@pytest.mark.parametrize("variable", ["http_proxy", "HTTP_PROXY", "all_proxy"])
def test_a_proxy_in_the_environment_is_not_asked_for_the_engines_bridge_address(engine, server, monkeypatch,
                                                                                 variable):
    # (before: urllib sent /health to the proxy, which cannot reach the verify engine's bridge: the gate
    # failed after smoke.timeout with the proxy's error, for an engine that answered)
    monkeypatch.setenv(variable, "http://127.0.0.1:1")
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.passed, result.steps


def test_a_model_that_answers_slower_than_its_bound_fails_naming_the_bound_and_the_key(engine, server):
    # (before: "the chat completion failed: timed out", no bound, no way to know what to raise)
    Engine.thinking = 7.0
    result = run_gates(engine, "demo:1", metadata(server.server_port, timeout=5), netns_pid=None)[0]
    assert result.failed.name == "chat"
    assert result.failed.detail == ("the chat completion failed: no reply within 5 s (each prompt waits up to the "
                                    "profile's smoke.timeout: raise it for a model that answers slowly)")


def test_a_multi_node_peer_that_exits_before_rank_0_answers_stops_the_wait_naming_it(engine, server):
    # rank 0 waits for its peers: without a look at them the gate waited smoke.timeout, then blamed rank 0
    Engine.ready_at = float("inf")

    def starter(container):
        if container.env["NODE_RANK"] == "2":
            container.running, container.exit_code, container.logs = False, 1, "NCCL error: no route to rank 0\n"

    engine.starter = starter
    begun = time.monotonic()
    result = run_gates(engine, "demo:1", multi_node(server.server_port, timeout=60), netns_pid=None)[0]
    assert time.monotonic() - begun < 45  # (short of the 60 s smoke.timeout: 20 s flaked on a loaded machine)
    assert result.failed.name == "health"
    assert result.failed.detail == "rank 2 exited (exit code 1) before rank 0 answered: NCCL error: no route to rank 0"
    assert engine.containers == {} and engine.networks == {}


def test_a_multi_node_gate_interrupted_as_its_network_is_made_leaves_no_network(engine, server):
    real = engine.create_network

    def create_network(name):
        real(name)  # the engine made it; the interrupt came before its answer
        raise KeyboardInterrupt

    engine.create_network = create_network
    with pytest.raises(KeyboardInterrupt):
        run_gates(engine, "demo:1", multi_node(server.server_port), netns_pid=None)
    assert engine.networks == {} and engine.containers == {}


@pytest.mark.parametrize("taken", ["network", "rank0", "rank2"])
def test_a_multi_node_gate_whose_name_is_taken_removes_nothing_it_did_not_make(engine, server, monkeypatch, taken):
    # (before: the gate removed by name whatever held the name the engine refused it: another's network
    # or container on a shared engine)
    from unibake.errors import EngineError

    monkeypatch.setattr("unibake.smoke.secrets.token_hex", lambda n: "0" * (2 * n))
    name = "unibake-smoke-000000000000"
    if taken == "network":
        engine.create_network(name)
    else:
        engine.start("demo:1", [], name=f"{name}-{taken}")  # another's container, on the default bridge
    before = (dict(engine.networks), set(engine.containers))
    with pytest.raises(EngineError, match="in use|exists"):
        run_gates(engine, "demo:1", multi_node(server.server_port), netns_pid=None)
    assert (engine.networks, set(engine.containers)) == before


def test_an_engine_that_exits_at_once_on_every_start_names_its_exit_code_and_starts(engine):
    # (before: "the engine exited at once: ..." with neither, where one that exits a moment later said both)
    said = "acme-engine: unknown option --tensor-parallel\n"

    def crashes(container):
        container.running, container.logs, container.restart_count, container.exit_code = False, said * 3, 2, 2

    engine.starter = crashes
    result = run_gates(engine, "demo:1", metadata(1, timeout=10), netns_pid=None)[0]
    assert result.failed.name == "start"
    assert result.failed.detail == "the engine exited at once with code 2, started 3 times: " + said.strip()


def test_a_multi_node_peer_that_crashed_on_every_start_says_how_often_it_started(engine, server):
    # (before: its exit code alone, where rank 0 crashing so says how often the restart policy started it)
    Engine.ready_at = float("inf")

    def starter(container):
        if container.env["NODE_RANK"] == "1":
            container.running, container.exit_code, container.restart_count = False, 1, 2
            container.logs = "NCCL error: no route to rank 0\n" * 3

    engine.starter = starter
    result = run_gates(engine, "demo:1", multi_node(server.server_port, timeout=60), netns_pid=None)[0]
    assert result.failed.detail == ("rank 1 exited (exit code 1, started 3 times) before rank 0 answered: "
                                    "NCCL error: no route to rank 0")
    assert engine.containers == {} and engine.networks == {}


def test_an_engine_killed_for_its_memory_before_answering_says_oom_killed(engine):
    # (before: "exited with code 137" alone, which reads as any SIGKILL: the stability step that says
    # OOM-killed is never reached when /health never answered)
    def killed_later(container):
        def kill():
            time.sleep(0.3)
            container.logs, container.exit_code, container.oom_killed = "loading 70B weights\n", 137, True
            container.running = False

        threading.Thread(target=kill, daemon=True).start()

    engine.starter = killed_later
    result = run_gates(engine, "demo:1", metadata(1, timeout=10), netns_pid=None)[0]
    assert result.failed.name == "health" and result.oom_killed
    assert result.failed.detail == ("the engine exited with code 137 before answering, OOM-killed (out of memory): "
                                    "loading 70B weights"), result.failed.detail


CHAT_OK = json.dumps({"choices": [{"message": {"content": "UNIFIED_TP1_OK"}}]}).encode()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_chat_reply_that_redirects_elsewhere_is_not_followed_and_fails_naming_status_and_location(engine, server,
                                                                                                     status):
    # (before: urllib followed a 301/302/303 to wherever it pointed, as a GET, and what answered there, here a
    # right chat completion, passed the gate for the engine)
    Engine.wire = (b"HTTP/1.1 %d Moved\r\nLocation: /v1/elsewhere\r\nContent-Length: 0\r\n\r\n" % status)
    Engine.health_body = CHAT_OK  # what a GET anywhere answers, /v1/elsewhere included
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert not result.passed and result.failed.name == "chat", result.steps
    assert result.failed.detail == (f"the chat completion failed: HTTP {status} Moved, a redirect to '/v1/elsewhere' "
                                    "(not followed: the gate judges the engine's own reply)")


@pytest.mark.parametrize("location", [None, "http://[::1", "ftp://elsewhere/x\x1b[2J"])
def test_a_chat_reply_that_redirects_with_no_or_a_broken_location_fails_in_words(engine, server, location):
    header = b"" if location is None else b"Location: " + location.encode() + b"\r\n"
    Engine.wire = b"HTTP/1.1 302 Found\r\n" + header + b"Content-Length: 0\r\n\r\n"
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "chat", result.steps
    said = ", a redirect with no Location (not an answer)" if location is None else \
        f", a redirect to {location!r} (not followed: the gate judges the engine's own reply)"
    assert result.failed.detail == f"the chat completion failed: HTTP 302 Found{said}"


def test_a_health_check_that_redirects_elsewhere_is_not_up(engine, server):
    # (before: /health redirected to a page that answers 200 passed the health step)
    Engine.health_redirect = f"http://127.0.0.1:{server.server_port}/elsewhere"
    result = gates_within(60, engine, "demo:1", metadata(server.server_port, timeout=1), netns_pid=None)[0]
    assert result.failed.name == "health", result.steps
    assert (f"/health answered HTTP 302 Found, a redirect to "
            f"'http://127.0.0.1:{server.server_port}/elsewhere' (not followed") in result.failed.detail


def test_a_health_check_that_redirects_fails_at_once_not_at_the_profiles_timeout(engine, server):
    # (before: a redirect was asked again every 0.25 s until smoke.timeout, here 120 s, as if still loading)
    Engine.health_redirect = "/login"
    start = time.monotonic()
    result = gates_within(30, engine, "demo:1", metadata(server.server_port, timeout=120), netns_pid=None)[0]
    assert time.monotonic() - start < 20
    assert result.failed.name == "health", result.steps
    assert result.failed.detail.startswith(
        f"http://127.0.0.1:{server.server_port}/health answered HTTP 302 Found, a redirect to '/login' (not followed: "
        "the gate judges the engine's own reply); engine log: "), result.failed.detail


@pytest.mark.parametrize("nodes", [1, 4])
@pytest.mark.parametrize("first", ["interrupt", "engine error"])
def test_a_clean_up_error_after_an_interrupted_or_failed_gate_is_a_warning_and_the_first_failure_is_raised(
        engine, server, nodes, first):
    # (before: the clean-up's EngineError replaced the interrupt, and the run ended with exit 1, not 130)
    from unibake.errors import EngineError

    Engine.ready_at = time.monotonic() + 60  # /health still loading: the gate is waiting when the interrupt comes
    calls = []

    def interrupted(container):
        calls.append(container)
        if len(calls) == 3:
            raise KeyboardInterrupt if first == "interrupt" else EngineError("cannot inspect the container: gone")
        return type(engine).container_status(engine, container)

    def remove_container(container):
        raise EngineError(f"cannot remove container {container}: the engine is shutting down")

    engine.container_status = interrupted
    engine.remove_container = remove_container
    warnings = []
    spec = metadata(server.server_port, timeout=60) if nodes == 1 else multi_node(server.server_port, timeout=60)
    with pytest.raises(KeyboardInterrupt if first == "interrupt" else EngineError) as raised:
        run_gates(engine, "demo:1", spec, netns_pid=None, warn=warnings.append)
    assert "shutting down" not in str(raised.value)
    assert len(warnings) == 1 and warnings[0].startswith("after the smoke gate of profile tp1 stopped: cannot remove "
                                                         "container ")
    assert warnings[0].endswith(": the engine is shutting down")


def test_a_clean_up_error_after_an_interrupted_gate_is_printed_as_a_warning_line_by_default(engine, capsys):
    from unibake.errors import EngineError

    def interrupted(container):
        raise KeyboardInterrupt

    def remove_container(container):
        raise EngineError("cannot remove container abc:\nthe engine is gone")

    engine.container_status = interrupted
    engine.remove_container = remove_container
    with pytest.raises(KeyboardInterrupt):
        run_gates(engine, "demo:1", metadata(1), netns_pid=None)
    assert capsys.readouterr().err.splitlines() == [
        "warning: after the smoke gate of profile tp1 stopped: cannot remove container abc:\\nthe engine is gone"]


def test_an_images_prompts_past_what_a_command_line_argument_holds_are_sent_all_the_same(engine, server):
    # an image's own metadata (archive IMAGE) is not held to the 64 KiB a Dockerfile's label line is: its
    # prompts as JSON were one argument of the client, and past 128 KiB the start failed ("Argument list too
    # long", exit 1); on stdin they are sent, and the gate judges them
    document = metadata(server.server_port).model_dump()
    document["profiles"]["tp1"]["smoke"] = {"timeout": 5, "prompts": [
        {"prompt": f"Say it, {n}: " + "é" * 4000, "expect": "UNIFIED_TP1_OK", "match": "contains"} for n in range(40)]}
    hostile = ImageMetadata.model_validate(document, strict=False)
    assert len(json.dumps([[c.prompt, 0] for c in hostile.profiles["tp1"].smoke.checks])) > 128 * 1024
    result = gates_within(120, engine, "demo:1", hostile, netns_pid=None)[0]
    assert result.passed, result.steps
    assert len(result.chats) == 40 and result.chats[-1].prompt.startswith("Say it, 39: éé")


@pytest.mark.parametrize("fault", ["interrupt", "engine error"])
def test_a_gate_container_created_as_an_interrupt_came_is_not_left_in_the_engine(engine, server, fault):
    # the engine created (and started) the container; its answer, the ID, never came (before: nothing
    # named it, so it was left running with its restart policy in a --verify-engine)
    from unibake.errors import EngineError

    real = engine.start

    def start(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt if fault == "interrupt" else EngineError("starting demo:1 failed: read timed out")

    engine.start = start
    with pytest.raises(KeyboardInterrupt if fault == "interrupt" else EngineError):
        run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)
    assert engine.containers == {}


def test_a_single_node_gate_whose_name_is_taken_removes_nothing_it_did_not_make(engine, server, monkeypatch):
    from unibake.errors import NameInUse

    monkeypatch.setattr("unibake.smoke.secrets.token_hex", lambda n: "0" * (2 * n))
    engine.start("demo:1", [], name="unibake-smoke-000000000000")  # another's container
    before = set(engine.containers)
    with pytest.raises(NameInUse):
        run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)
    assert set(engine.containers) == before


@pytest.mark.parametrize("expect", ["TWO ", "  TWO", "the answer is TWO  "])
def test_a_contained_expected_text_is_trimmed_as_an_exact_one_is(engine, server, expect):
    # (before: `exact` trimmed the expected text and `contains` kept its spaces, so a reply ending in the
    # words, or holding them after no space, failed "expected 'TWO ' in the reply")
    Engine.replies = {"Say two.": "the answer is TWO"}
    smoke = [{"prompt": "Say two.", "expect": expect, "match": "contains"}]
    result = run_gates(engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.passed, result.steps
    Engine.replies = {"Say two.": "the answer is THREE"}
    result = run_gates(engine, "demo:1", planned(server.server_port, smoke), netns_pid=None)[0]
    assert result.failed.detail == f"expected {expect!r} in the reply, got 'the answer is THREE'"


@pytest.mark.parametrize("content,said", [
    (None, "the reply's content is null: the engine answered with no text"),
    (42, "the reply's content is a number (42), not text"),
    (True, "the reply's content is true or false (true), not text"),
    ([{"type": "text", "text": "UNIFIED_TP1_OK"}],
     "the reply's content is a list ([{\"type\": \"text\", \"text\": \"UNIFIED_TP1_OK\"}]), not text"),
])
def test_a_reply_whose_content_is_no_text_says_so_in_jsons_words(engine, server, content, said):
    # (before: "the reply's content is NoneType, not text", Python's name of null)
    Engine.raw = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "chat" and result.failed.detail == f"the chat completion failed: {said}"


class _IPv6Server(ThreadingHTTPServer):
    address_family = __import__("socket").AF_INET6


def test_a_gate_on_an_ipv6_only_network_asks_the_containers_ipv6_address_bracketed(engine):
    # (before: the engine's inspect was read for IPAddress alone, so an IPv6-only verify network failed with
    # "the container got no network address within 5 s"; and an IPv6 address in the URL needs its brackets)
    from unibake.docker_engine import DockerEngine

    class API:
        def inspect_container(self, container):
            return {"State": {"Running": True}, "NetworkSettings": {
                "IPAddress": "", "GlobalIPv6Address": "", "Networks": {
                    "v6only": {"IPAddress": "", "GlobalIPv6Address": "fd00:dead::2", "LinkLocalIPv6Address": ""}}}}

        def logs(self, container, **kwargs):
            return b"up\n"

    docker_engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the inspect above
    docker_engine.address, docker_engine.api = "fake://", API()
    assert docker_engine.container_state("c") == (True, "fd00:dead::2", "up\n")

    httpd = _IPv6Server(("::1", 0), Engine)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        engine.starter = lambda container: setattr(container, "address", "::1")
        result = gates_within(60, engine, "demo:1", metadata(httpd.server_port), netns_pid=None)[0]
    finally:
        httpd.shutdown()
    assert result.passed, result.steps


def test_a_self_check_container_the_engine_cannot_remove_is_named_in_a_warning(capsys):
    # (before: DockerEngine.run dropped the engine's refusal to remove it, and the container was left with no word)
    import docker.errors

    from unibake.docker_engine import DockerEngine

    cid = "c0ffee" * 10 + "beef"

    class Logs(list):
        def close(self):
            pass

    class API:
        def create_host_config(self, **kwargs):
            return kwargs

        def create_container(self, image, **kwargs):
            return {"Id": cid}

        def start(self, container):
            pass

        def wait(self, container, timeout):
            return {"StatusCode": 0}

        def logs(self, container, **kwargs):
            return Logs([b"ok: kernels present\n"])

        def remove_container(self, container, force, v=False):
            raise docker.errors.APIError("driver \"overlay2\" failed to remove root filesystem: device or resource busy")

    docker_engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the one above
    docker_engine.address, docker_engine.api = "fake://", API()
    outcome = docker_engine.run("demo:1", ["self-check"], env={"PROFILE": "tp1"})
    assert (outcome.exit_code, outcome.output) == (0, "ok: kernels present\n")
    err = capsys.readouterr().err
    assert err.startswith(f"warning: cannot remove container {cid[:12]}: "), err
    assert "device or resource busy" in err and err.rstrip().endswith(
        f"it is left in the engine: remove it with docker rm -f {cid[:12]}") and err.count("\n") == 1, err


def test_a_self_check_container_created_as_an_interrupt_came_is_removed_by_its_name():
    # (before: DockerEngine.run created it with no name, and an interrupt before the engine's answer left it,
    # "Created", in docker ps -a: its ID was never known)
    import docker.errors

    from unibake.docker_engine import DockerEngine

    class API:
        made: list = []

        def create_host_config(self, **kwargs):
            return kwargs

        def create_container(self, image, name=None, **kwargs):
            self.made.append(name)  # the engine made it; its answer never came
            raise KeyboardInterrupt

        def remove_container(self, container, force, v=False):
            if container["Id"] not in self.made:
                raise docker.errors.NotFound("no such container")
            self.made.remove(container["Id"])

    api = API()
    docker_engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the one above
    docker_engine.address, docker_engine.api = "fake://", api
    with pytest.raises(KeyboardInterrupt):
        docker_engine.run("demo:1", ["self-check"], env={"PROFILE": "tp1"})
    assert api.made == []


def test_a_chat_reply_with_a_utf8_byte_order_mark_is_read_as_its_json(engine, server):
    # (before: "the chat completion failed: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1")
    Engine.raw = b"\xef\xbb\xbf" + json.dumps({"choices": [{"message": {"content": "UNIFIED_TP1_OK"}}]}).encode()
    result = gates_within(60, engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.passed, result.steps
    assert result.chats[0].reply == "UNIFIED_TP1_OK"


def test_a_health_check_slower_than_a_few_seconds_is_waited_for_within_the_profiles_timeout(engine, server):
    # (before: each /health ask gave up after 3 s and asked again, so one that takes 4 s to answer, as one
    # that runs the model does, never counted: the gate failed after smoke.timeout with "timed out")
    Engine.health_thinking = 4.0
    result = gates_within(60, engine, "demo:1", metadata(server.server_port, timeout=12), netns_pid=None)[0]
    assert result.passed, result.steps
    assert 4.0 <= result.steps[2].seconds < 12, result.steps


@pytest.mark.parametrize("match", ["exact", "contains"])
@pytest.mark.parametrize("expect", ["", "   "])
def test_an_images_own_blank_expected_reply_still_needs_a_non_empty_reply(engine, server, match, expect):
    # (the plan refuses a blank one; an image's own metadata was taken as it is: "contains" found it in every
    # reply, and exact matched an engine that answered nothing; a regex that matches nothing is refused there)
    Engine.reply = "  \n"
    result = run_gates(engine, "demo:1", planned(server.server_port, [{"prompt": "Say it.", "expect": expect,
                                                                       "match": match}]), netns_pid=None)[0]
    assert result.failed.name == "chat" and result.failed.detail.startswith("expected a non-empty reply"), result.steps
    Engine.reply = "anything"
    assert run_gates(engine, "demo:1", planned(server.server_port, [{"prompt": "Say it.", "expect": expect,
                                                                     "match": match}]), netns_pid=None)[0].passed


def test_a_self_check_that_ends_just_as_its_wait_gives_up_is_its_own_outcome_not_an_engine_error():
    # (before: the kill of a container that had just ended was refused, 409 "is not running", and the run
    # ended with "running demo:1 failed: ...", an engine error, not the check's exit code)
    import docker.errors
    import requests

    from unibake.docker_engine import DockerEngine

    class Logs(list):
        def close(self):
            pass

    class API:
        waits = 0

        def create_host_config(self, **kwargs):
            return kwargs

        def create_container(self, image, **kwargs):
            return {"Id": "c" * 64}

        def start(self, container):
            pass

        def wait(self, container, timeout):
            self.waits += 1
            if self.waits == 1:
                raise requests.exceptions.ReadTimeout("read timed out")
            return {"StatusCode": 1}

        def kill(self, container):
            response = requests.Response()
            response.status_code = 409
            raise docker.errors.APIError("Cannot kill container: c: Container c is not running", response=response)

        def logs(self, container, **kwargs):
            return Logs([b"error: self-check[tp1]: tune caches: expected 3 JSON files, found 2\n"])

        def remove_container(self, container, force, v=False):
            pass

    docker_engine = DockerEngine.__new__(DockerEngine)  # no engine is reached: its API is the one above
    docker_engine.address, docker_engine.api = "fake://", API()
    outcome = docker_engine.run("demo:1", ["self-check"], env={"PROFILE": "tp1"}, timeout=1)
    assert outcome.exit_code == 1 and "found 2" in outcome.output


@pytest.mark.parametrize("nodes", [1, 4])
def test_a_gate_that_ended_keeps_its_result_when_its_clean_up_fails_which_is_a_warning(engine, server, nodes):
    # (before: the engine's refusal to remove the gate's container, after the gate passed, ended the whole
    # run with an engine error, exit 1, the gate's result lost)
    from unibake.errors import EngineError

    def remove_container(container):
        raise EngineError(f"cannot remove container {container}: device or resource busy")

    engine.remove_container = remove_container
    warnings = []
    spec = metadata(server.server_port) if nodes == 1 else multi_node(server.server_port)
    if nodes > 1:
        engine.starter = waits_for_its_peers(engine, nodes)
    result = gates_within(60, engine, "demo:1", spec, netns_pid=None, warn=warnings.append)[0]
    assert result.passed, result.steps
    assert len(warnings) == 1 and warnings[0].startswith("after the smoke gate of profile tp1 ended: cannot remove "
                                                         "container "), warnings
    assert warnings[0].endswith(": device or resource busy")


def test_a_verify_engine_s_container_asked_from_here_must_not_answer_once_removed(engine, server):
    # found by review: with --verify-engine the client asked the container's bridge address from this host, where
    # another engine's container can hold the same address (every default bridge is 172.17.0.0/16) and answer for
    # the image: a gate passed on another server's replies. A container whose own network namespace this host
    # cannot enter (the fake's: no process here) is asked from here, and then nothing may answer there any more
    from unibake.smoke import OWN_NAMESPACE

    Engine.answers_when_gone = True  # another server, at the address the container had
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=OWN_NAMESPACE)[0]
    assert not result.passed and result.failed.name == "address"
    assert result.failed.detail.startswith(f"http://127.0.0.1:{server.server_port}/health still answered once the "
                                           "gate's container was removed: the client on this host asked another "
                                           "server"), result.failed.detail
    assert engine.containers == {}

    # the server is the container's: gone with it, the gate passes, and says how its address was asked
    Engine.answers_when_gone = False
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=OWN_NAMESPACE)[0]
    assert result.passed, result.steps
    assert [s.name for s in result.steps][-2:] == ["stability", "address"]
    assert result.steps[-1].detail == (f"asked from this host; nothing answers at http://127.0.0.1:{server.server_port} "
                                       "once the gate's container is removed")


def test_a_gate_that_failed_is_not_asked_again_at_its_address(engine, server):
    from unibake.smoke import OWN_NAMESPACE

    Engine.reply = "WRONG"
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=OWN_NAMESPACE)[0]
    assert result.failed.name == "chat" and "address" not in [s.name for s in result.steps]


def test_the_client_takes_nothing_from_the_working_folder(engine, server, tmp_path, monkeypatch):
    # found by review: `python -m unibake.smoke_client` put the working folder first on its path: a json.py there ran
    # in place of the standard library's, and could print the steps of a gate that passed
    (tmp_path / "json.py").write_text("raise SystemExit('a json.py of the working folder ran')\n")
    monkeypatch.chdir(tmp_path)
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.passed, result.steps


@pytest.mark.parametrize("reply", ["UNIFIED_TP1_OK\x1e", "\xa0UNIFIED_TP1_OK", "UNIFIED_TP1_OK\u3000", "\x85UNIFIED_TP1_OK"])
def test_an_exact_reply_is_trimmed_of_spaces_tabs_and_line_ends_alone(reply):
    # found by review: str.strip() also took control separators, U+0085, no-break and ideographic spaces: such a
    # reply passed as exactly the expected text
    from unibake.metadata import SmokePrompt
    from unibake.smoke import mismatch

    check = SmokePrompt(prompt="Say it.", expect="UNIFIED_TP1_OK", match="exact")
    assert mismatch(reply, check) == "expected exactly 'UNIFIED_TP1_OK'"
    assert mismatch(" \t\r\nUNIFIED_TP1_OK\r\n", check) is None


def test_a_namespace_is_entered_only_where_nsenter_can_enter_it(tmp_path):
    # found by review: opening a container's namespace was taken for leave to enter it (a docker-group user opens
    # one of a container that runs as that user, and cannot setns into it): nsenter failed, and the gate with it
    import os

    from unibake.smoke import _enters

    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        assert _enters(fd) == (os.geteuid() == 0)  # (setns needs CAP_SYS_ADMIN: CI runs as root)
        real_path = os.environ["PATH"]
        os.environ["PATH"] = str(tmp_path)  # no nsenter here: asked from this host instead
        try:
            assert _enters(fd) is False
        finally:
            os.environ["PATH"] = real_path
    finally:
        os.close(fd)


def test_a_verify_engine_s_container_that_could_not_be_removed_confirms_nothing(engine, server):
    # its server may still answer at its address: that nothing else answers there cannot be shown
    from unibake.errors import EngineError
    from unibake.smoke import OWN_NAMESPACE

    def cannot_remove(container):
        raise EngineError(f"cannot remove container {container[:12]}: the engine timed out")

    engine.remove_container = cannot_remove
    warnings = []
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=OWN_NAMESPACE,
                       warn=warnings.append)[0]
    assert not result.passed and result.failed.name == "address", result.steps
    assert "the gate's container could not be removed (said above)" in result.failed.detail
    assert len(warnings) == 1 and "the engine timed out" in warnings[0]
