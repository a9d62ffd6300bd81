"""The smoke gate on the fake engine, against a real HTTP server on loopback standing in for the
inference engine: each step's verdict, and the first failing step named."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from unibake.engine import RunOutcome
from unibake.metadata import ImageMetadata
from unibake.smoke import run_gates

from ..fake_engine import FakeEngine


class Engine(BaseHTTPRequestHandler):
    reply = "UNIFIED_TP1_OK model=demo"
    health = 200

    def do_GET(self):  # noqa: N802 - the handler's name is http.server's
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(self.health)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert request["messages"][0]["content"] == "Say it."
        body = json.dumps({"choices": [{"message": {"content": self.reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    Engine.reply, Engine.health = "UNIFIED_TP1_OK model=demo", 200


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
                                                              ("health", True), ("chat", True)]
    assert results[0].steps[-1].detail == "UNIFIED_TP1_OK model=demo"
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


def test_an_engine_that_exits_at_once_fails_the_start_step(engine, server):
    def crash(container):
        container.running, container.logs = False, "Traceback: bad flag\n"

    engine.starter = crash
    result = run_gates(engine, "demo:1", metadata(server.server_port), netns_pid=None)[0]
    assert result.failed.name == "start" and "bad flag" in result.failed.detail


def test_an_engine_that_never_answers_fails_the_health_step(engine):
    result = run_gates(engine, "demo:1", metadata(1, timeout=1), netns_pid=None)[0]  # nothing listens on port 1
    assert result.failed.name == "health" and "did not answer" in result.failed.detail
