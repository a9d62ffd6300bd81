"""A stand-in for the real engine's server: enough to be released, gated and run like the real one.

It loads every library the profile lists (UNIBAKE_KERNELS) and refuses to start when one does not
load, checks the tensor-parallel size against the profile's GPUs and nodes, and answers /health and
/v1/chat/completions with one deterministic line naming what it found, so that a smoke gate
expecting the exact reply proves which layout, kernels, environment and overlay answered.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _loaded(paths: str) -> list[str]:
    names = []
    for path in filter(None, paths.split(":")):
        lib = ctypes.CDLL(path)  # raises OSError: the engine does not start without its kernels
        try:
            lib.unibake_kernel_info.restype = ctypes.c_char_p
            names.append(lib.unibake_kernel_info().decode())
        except AttributeError:  # a vendor library without the stand-in's symbol
            names.append(os.path.basename(path))
    return names


def serve(marker: str, tp: int, extra: dict[str, str], port: int, host: str = "0.0.0.0") -> int:
    env = os.environ
    gpus, nodes = int(env.get("UNIBAKE_GPUS", "1")), int(env.get("NNODES", "1"))
    if tp != gpus * nodes:
        print(f"error: {marker}: tensor-parallel size {tp} is not {gpus} GPUs x {nodes} nodes", file=sys.stderr)
        return 1
    try:
        kernels = _loaded(env.get("UNIBAKE_KERNELS", ""))
    except OSError as exc:
        print(f"error: {marker}: a kernel does not load: {exc}", file=sys.stderr)
        return 1
    fields = {"profile": env.get("PROFILE", ""), "tp": str(tp), "nodes": str(nodes),
              "rank": env.get("NODE_RANK", "0"), "kernels": str(len(kernels)), **extra}
    reply = " ".join([marker] + [f"{k}={v}" for k, v in fields.items()])

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):
            sys.stderr.write("%s: %s\n" % (marker, fmt % args))

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._send(200, {"status": "ok", "profile": fields["profile"], "kernels": kernels})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            self._send(200, {"object": "chat.completion", "model": env.get("MODEL_NAME", ""),
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})

    print(f"{marker}: {reply}", file=sys.stderr, flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()
    return 0
