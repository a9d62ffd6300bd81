"""``python3 -m vllm.entrypoints.openai.api_server``: the fork's server, standing in for the real one."""

import argparse
import os
import sys

from vllm._standin import serve


def main() -> int:
    p = argparse.ArgumentParser(prog="vllm.entrypoints.openai.api_server")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tensor-parallel-size", type=int, required=True)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--model", default="")
    p.add_argument("--enforce-eager", action="store_true")
    args = p.parse_args()
    try:
        from vllm.platforms.das import platform
    except ImportError as exc:
        print(f"error: vllm: the DAS platform overlay is missing: {exc}", file=sys.stderr)
        return 1
    env = sorted(k for k in os.environ if k.startswith(("HIP_", "HSA_", "NCCL_", "RCCL_", "VLLM_", "MIOPEN_")))
    extra = {"platform": platform.NAME, "env": str(len(env)), "eager": "on" if args.enforce_eager else "off"}
    return serve("DCU_OK", args.tensor_parallel_size, extra, args.port, args.host)


if __name__ == "__main__":
    sys.exit(main())
