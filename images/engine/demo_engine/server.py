"""An OpenAI-compatible HTTP server: GET /health, GET /v1/models, POST /v1/chat/completions.

Configuration comes from the image's entrypoint: PROFILE, UNIBAKE_KERNELS, UNIBAKE_TUNE_DIR,
UNIBAKE_TUNE_EXPECT, UNIBAKE_GPUS, PORT, MODEL_NAME and UNIBAKE_MOUNT_* (weight mount points).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import __version__, sampling
from .kernels import LoadedKernel, StartupError, attention_score, load_kernels
from .tune import load_tune_caches


@dataclass(frozen=True)
class EngineState:
    profile: str
    model_name: str
    tp: int
    kernels: list[LoadedKernel]
    tune_caches: dict[str, dict]
    mounts: dict[str, bool]
    warmup_score: float


def start(env: dict[str, str], tp: int) -> EngineState:
    """Load kernels and tune caches; raise StartupError if anything the profile needs is missing."""
    gpus = int(env.get("UNIBAKE_GPUS") or tp)
    if tp != gpus:
        raise StartupError(f"--tp {tp} does not match the profile's {gpus} GPUs")
    kernels = load_kernels(env.get("UNIBAKE_KERNELS", ""))
    caches = load_tune_caches(env.get("UNIBAKE_TUNE_DIR", ""), env.get("UNIBAKE_TUNE_EXPECT", ""))
    mounts = {k.removeprefix("UNIBAKE_MOUNT_").lower(): os.path.isdir(v)
              for k, v in env.items() if k.startswith("UNIBAKE_MOUNT_")}
    score = attention_score(kernels, [1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5])
    return EngineState(profile=env.get("PROFILE", ""), model_name=env.get("MODEL_NAME", "demo"), tp=tp,
                       kernels=kernels, tune_caches=caches, mounts=mounts, warmup_score=score)


def make_handler(state: EngineState):
    class Handler(BaseHTTPRequestHandler):
        server_version = f"demo-engine/{__version__}"

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args) -> None:
            sys.stderr.write("demo-engine: %s %s\n" % (self.address_string(), fmt % args))

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok", "profile": state.profile, "tp": state.tp})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{
                    "id": state.model_name, "object": "model", "owned_by": "demo-engine",
                    "profile": state.profile, "kernels": [k.info for k in state.kernels],
                    "tune_caches": len(state.tune_caches), "weights_mounted": state.mounts}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                messages = request["messages"]
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, {"error": {"message": f"bad request: {exc}"}})
                return
            reply = sampling.generate(state, messages)
            self._send(200, {
                "id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion",
                "created": int(time.time()), "model": request.get("model", state.model_name),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": len(reply.split()), "total_tokens": 0},
            })

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-engine")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--host", default="0.0.0.0")
    args = parser.parse_args(argv)
    try:
        state = start(dict(os.environ), args.tp)
    except StartupError as exc:
        print(f"error: demo-engine refuses to start: {exc}", file=sys.stderr)
        return 1
    port = int(os.environ.get("PORT", "30000"))
    server = ThreadingHTTPServer((args.host, port), make_handler(state))
    print(f"demo-engine {__version__}: profile {state.profile}, tp {state.tp}, "
          f"kernels {', '.join(k.info for k in state.kernels)}, {len(state.tune_caches)} tune caches, "
          f"serving {state.model_name} on {args.host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
