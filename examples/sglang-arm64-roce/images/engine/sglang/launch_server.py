"""``python3 -m sglang.launch_server``: the fork's entry point, standing in for the real server."""

import argparse
import os
import sys

from sglang._standin import serve
from sglang.srt import distributed

# the validated RoCE configuration: the engine refuses to start when a key of it is missing
VALIDATED_PREFIXES = ("NCCL_", "NVSHMEM_", "UCX_", "GLOO_", "TP_", "SGL", "TORCH_", "CUDA_", "PYTORCH_", "OMP_")


def main() -> int:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tp-size", type=int, required=True)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default="")
    p.add_argument("--model-path", default="")
    p.add_argument("--served-model-name", default="")
    p.add_argument("--enable-ep-moe", action="store_true")
    args = p.parse_args()
    keys = sorted(k for k in os.environ if k.startswith(VALIDATED_PREFIXES))
    if len(keys) < 56:
        print(f"error: sglang: {len(keys)} keys of the validated RoCE configuration are set, not 56", file=sys.stderr)
        return 1
    from sglang.srt.adapters import moe_fp8
    extra = {"ep": "on" if args.enable_ep_moe else "off", "env": str(len(keys)),
             "gid": distributed.gid_index(), "transport": distributed.TRANSPORT,
             "adapter": str(moe_fp8.file_count())}
    return serve("SGLANG_ROCE_OK", args.tp_size, extra, args.port, args.host)


if __name__ == "__main__":
    sys.exit(main())
