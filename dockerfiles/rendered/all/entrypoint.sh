#!/bin/sh
# Rendered by unibake for demo-llm:1.3.1: do not edit by hand.
# PROFILE selects the layout (tp1, tp2, tp4; default tp4).
#   (no arguments) or serve [ARGS...]   start the engine with the profile's arguments
#   self-check [--skip-ledgers]         run the profile's fail-closed checks; exit 0 only if all pass
#                                       (--skip-ledgers: not the file ledgers, checked for another profile)
#   COMMAND [ARGS...]                   run COMMAND in the profile's environment
set -eu
UNIBAKE_ROOT=/opt/unibake
UNIBAKE_PYTHON_DIRS=""
PROFILE="${PROFILE-tp4}"  # (set but empty: refused below, not the default)
case "$PROFILE" in
  tp1)
    UNIBAKE_GPUS=1
    UNIBAKE_KERNELS=/opt/unibake/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/rmsnorm/librmsnorm.so:/opt/unibake/kernels/rope/librope.so:/opt/unibake/kernels/demo_quant/demo_quant/libdemo_quant.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/flash_attn:/opt/unibake/kernels/rmsnorm:/opt/unibake/kernels/rope:/opt/unibake/kernels/demo_quant/demo_quant
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp1/tune
    UNIBAKE_TUNE_EXPECT=3
    UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/demo_quant
    [ -n "${NCCL_ALGO+set}" ] || export NCCL_ALGO=Tree
    start_engine() { exec python3 -m demo_engine --tp 1 "$@"; }
    ;;
  tp2)
    UNIBAKE_GPUS=2
    UNIBAKE_KERNELS=/opt/unibake/profiles/tp2/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/rmsnorm/librmsnorm.so:/opt/unibake/kernels/rope/librope.so:/opt/unibake/kernels/demo_quant/demo_quant/libdemo_quant.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/profiles/tp2/kernels/flash_attn:/opt/unibake/kernels/rmsnorm:/opt/unibake/kernels/rope:/opt/unibake/kernels/demo_quant/demo_quant
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp2/tune
    UNIBAKE_TUNE_EXPECT=7
    UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/demo_quant
    [ -n "${NCCL_ALGO+set}" ] || export NCCL_ALGO=Ring
    start_engine() { exec python3 -m demo_engine --tp 2 "$@"; }
    ;;
  tp4)
    UNIBAKE_GPUS=4
    UNIBAKE_KERNELS=/opt/unibake/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/rmsnorm/librmsnorm.so:/opt/unibake/kernels/rope/librope.so:/opt/unibake/kernels/demo_quant/demo_quant/libdemo_quant.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/flash_attn:/opt/unibake/kernels/rmsnorm:/opt/unibake/kernels/rope:/opt/unibake/kernels/demo_quant/demo_quant
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp4/tune
    UNIBAKE_TUNE_EXPECT=5
    UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/demo_quant
    [ -n "${NCCL_ALGO+set}" ] || export NCCL_ALGO=Ring
    [ -n "${NCCL_P2P_LEVEL+set}" ] || export NCCL_P2P_LEVEL=NVL
    start_engine() { exec python3 -m demo_engine --tp 4 "$@"; }
    ;;
  *)
    printf "error: unknown PROFILE '%s'; known profiles: %s\n" "$PROFILE" 'tp1, tp2, tp4' >&2
    exit 2
    ;;
esac
export PROFILE UNIBAKE_ROOT UNIBAKE_GPUS UNIBAKE_KERNELS UNIBAKE_TUNE_DIR UNIBAKE_TUNE_EXPECT
if [ -n "$UNIBAKE_KERNEL_DIRS" ]; then
  export LD_LIBRARY_PATH="$UNIBAKE_KERNEL_DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PYTHONPATH="$UNIBAKE_ROOT/engine${UNIBAKE_PYTHON_DIRS:+:$UNIBAKE_PYTHON_DIRS}${PYTHONPATH:+:$PYTHONPATH}"

case "${1:-serve}" in
  serve) [ "$#" -eq 0 ] || shift; start_engine "$@" ;;
  -*) start_engine "$@" ;;  # (docker run IMAGE --port 9000, as inference images take it: options for the engine)
  self-check) shift; exec /bin/sh "$UNIBAKE_ROOT/meta/self-check.sh" "$PROFILE" "$@" ;;
  *) exec "$@" ;;
esac
