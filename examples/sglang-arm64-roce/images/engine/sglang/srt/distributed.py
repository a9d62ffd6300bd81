"""How the ranks reach each other (the fork's file; patched by images/patches/0001-roce-gid-index.patch)."""

import os

# RoCE needs the GID index of the RoCE v2 address; upstream assumes InfiniBand.
DEFAULT_GID_INDEX = "0"
TRANSPORT = "ib"


def gid_index() -> str:
    return os.environ.get("NCCL_IB_GID_INDEX", DEFAULT_GID_INDEX)
