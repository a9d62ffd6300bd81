"""Placeholder for ``python3 -m sglang.launch_server``.

The unified image's entrypoint starts this module with the profile's arguments (--tp-size N) and
passes --port, --model-path and --served-model-name from the environment; it sets PROFILE, UNIBAKE_GPUS, UNIBAKE_KERNELS, UNIBAKE_TUNE_DIR and UNIBAKE_MOUNT_*.
The real launcher serves an OpenAI-compatible API; this stand-in only checks that the layout is
consistent and says what it would start.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", default="")
    parser.add_argument("--served-model-name", default="")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--enable-torch-compile", action="store_true")
    args, _ = parser.parse_known_args(argv)
    gpus = int(os.environ.get("UNIBAKE_GPUS") or args.tp_size)
    if args.tp_size != gpus:
        print(f"error: --tp-size {args.tp_size} does not match the profile's {gpus} GPUs", file=sys.stderr)
        return 2
    print(f"placeholder sglang {os.environ.get('PROFILE', '?')}: would serve {args.served_model_name} "
          f"from {args.model_path} on {args.host}:{args.port} with tp={args.tp_size}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
