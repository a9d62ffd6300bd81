#!/bin/sh
# Rendered by unibake for sglang-roce:0.4.9.post2-roce.3: do not edit by hand.
# PROFILE selects the layout (tp16, tp4; default tp16).
#   (no arguments) or serve [ARGS...]   start the engine with the profile's arguments
#   self-check [--skip-ledgers]         run the profile's fail-closed checks; exit 0 only if all pass
#                                       (--skip-ledgers: not the file ledgers, checked for another profile)
#   COMMAND [ARGS...]                   run COMMAND in the profile's environment
set -eu
UNIBAKE_ROOT=/opt/unibake
UNIBAKE_PYTHON_DIRS=""
PROFILE="${PROFILE-tp16}"  # (set but empty: refused below, not the default)
case "$PROFILE" in
  tp16)
    UNIBAKE_GPUS=4
    UNIBAKE_KERNELS=/opt/unibake/kernels/sgl_kernel/libsgl_kernel.so:/opt/unibake/kernels/deep_gemm/libdeep_gemm.so:/opt/unibake/kernels/nvshmem/lib/libnvshmem_host.so.3:/opt/unibake/profiles/tp16/kernels/deep_ep/libdeep_ep.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/sgl_kernel:/opt/unibake/kernels/deep_gemm:/opt/unibake/kernels/nvshmem/lib:/opt/unibake/profiles/tp16/kernels/deep_ep
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp16/tune
    UNIBAKE_TUNE_EXPECT=2
    # one of 4 nodes: run.sh passes NODE_RANK and MASTER_ADDR; alone it is rank 0
    [ -n "${NNODES+set}" ] || export NNODES=4
    [ -n "${NODE_RANK+set}" ] || export NODE_RANK=0
    [ -n "${MASTER_ADDR+set}" ] || export MASTER_ADDR=127.0.0.1
    [ -n "${MASTER_PORT+set}" ] || export MASTER_PORT=20000
    [ -n "${SGLANG_DEEPEP_MODE+set}" ] || export SGLANG_DEEPEP_MODE=normal
    start_engine() { exec python3 -m sglang.launch_server --host 0.0.0.0 --port "${PORT}" --model-path "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tp-size 16 --nnodes "${NNODES}" --node-rank "${NODE_RANK}" --dist-init-addr "${MASTER_ADDR}":"${MASTER_PORT}" --enable-ep-moe "$@"; }
    ;;
  tp4)
    UNIBAKE_GPUS=4
    UNIBAKE_KERNELS=/opt/unibake/kernels/sgl_kernel/libsgl_kernel.so:/opt/unibake/kernels/deep_gemm/libdeep_gemm.so:/opt/unibake/kernels/nvshmem/lib/libnvshmem_host.so.3
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/sgl_kernel:/opt/unibake/kernels/deep_gemm:/opt/unibake/kernels/nvshmem/lib
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp4/tune
    UNIBAKE_TUNE_EXPECT=2
    start_engine() { exec python3 -m sglang.launch_server --host 0.0.0.0 --port "${PORT}" --model-path "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tp-size 4 "$@"; }
    ;;
  *)
    printf "error: unknown PROFILE '%s'; known profiles: %s\n" "$PROFILE" 'tp16, tp4' >&2
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
