#!/bin/sh
# Rendered by unibake for sglang-tp:0.4.6.post1-r1: do not edit by hand.
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
    UNIBAKE_KERNELS=/opt/unibake/kernels/sgl_kernel/libsgl_kernel.so:/opt/unibake/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/deep_gemm/libdeep_gemm.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/sgl_kernel:/opt/unibake/kernels/flash_attn:/opt/unibake/kernels/deep_gemm
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp1/tune
    UNIBAKE_TUNE_EXPECT=3
    [ -n "${CUDA_MODULE_LOADING+set}" ] || export CUDA_MODULE_LOADING=LAZY
    start_engine() { exec python3 -m sglang.launch_server --host 0.0.0.0 --port "${PORT}" --model-path "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tp-size 1 "$@"; }
    ;;
  tp2)
    UNIBAKE_GPUS=2
    UNIBAKE_KERNELS=/opt/unibake/kernels/sgl_kernel/libsgl_kernel.so:/opt/unibake/profiles/tp2/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/deep_gemm/libdeep_gemm.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/sgl_kernel:/opt/unibake/profiles/tp2/kernels/flash_attn:/opt/unibake/kernels/deep_gemm
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp2/tune
    UNIBAKE_TUNE_EXPECT=4
    [ -n "${NCCL_ALGO+set}" ] || export NCCL_ALGO=Ring
    [ -n "${NCCL_P2P_LEVEL+set}" ] || export NCCL_P2P_LEVEL=NVL
    start_engine() { exec python3 -m sglang.launch_server --host 0.0.0.0 --port "${PORT}" --model-path "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tp-size 2 "$@"; }
    ;;
  tp4)
    UNIBAKE_GPUS=4
    UNIBAKE_KERNELS=/opt/unibake/kernels/sgl_kernel/libsgl_kernel.so:/opt/unibake/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/deep_gemm/libdeep_gemm.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/sgl_kernel:/opt/unibake/kernels/flash_attn:/opt/unibake/kernels/deep_gemm
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp4/tune
    UNIBAKE_TUNE_EXPECT=3
    [ -n "${NCCL_ALGO+set}" ] || export NCCL_ALGO=Ring
    [ -n "${NCCL_MIN_NCHANNELS+set}" ] || export NCCL_MIN_NCHANNELS=4
    [ -n "${NCCL_NVLS_ENABLE+set}" ] || export NCCL_NVLS_ENABLE=0
    [ -n "${NCCL_P2P_LEVEL+set}" ] || export NCCL_P2P_LEVEL=NVL
    start_engine() { exec python3 -m sglang.launch_server --host 0.0.0.0 --port "${PORT}" --model-path "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tp-size 4 --enable-torch-compile "$@"; }
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
