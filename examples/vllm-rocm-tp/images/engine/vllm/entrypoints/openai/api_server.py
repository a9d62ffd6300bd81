"""Placeholder for ``python3 -m vllm.entrypoints.openai.api_server``.

The unified image's entrypoint starts this module through product.yaml's sh -c wrapper, which adds
--port "$PORT", --model "$UNIBAKE_MOUNT_MODEL" and --served-model-name "$MODEL_NAME", followed by
the profile's arguments (--tensor-parallel-size N, ...). The real server speaks the OpenAI API;
this stand-in only checks that the layout is consistent and says what it would start.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm.entrypoints.openai.api_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    gpus = int(os.environ.get("UNIBAKE_GPUS") or args.tensor_parallel_size)
    if args.tensor_parallel_size != gpus:
        print(f"error: --tensor-parallel-size {args.tensor_parallel_size} does not match the "
              f"profile's {gpus} GPUs", file=sys.stderr)
        return 2
    print(f"placeholder vllm {os.environ.get('PROFILE', '?')}: would serve "
          f"{args.served_model_name or args.model} from {args.model} on {args.host}:{args.port} "
          f"with tp={args.tensor_parallel_size}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
