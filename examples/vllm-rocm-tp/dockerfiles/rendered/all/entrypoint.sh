#!/bin/sh
# Rendered by unibake for vllm-rocm-tp:0.8.5-rocm6.3.1-r2: do not edit by hand.
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
    UNIBAKE_KERNELS=/opt/unibake/kernels/rocm_c/librocm_c.so:/opt/unibake/kernels/moe_c/libmoe_c.so:/opt/unibake/kernels/aiter/libaiter.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/rocm_c:/opt/unibake/kernels/moe_c:/opt/unibake/kernels/aiter
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp1/tune
    UNIBAKE_TUNE_EXPECT=2
    start_engine() { exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port "${PORT}" --model "${UNIBAKE_MOUNT_MODEL}" --served-model-name "${MODEL_NAME}" --tensor-parallel-size 1 --max-model-len 16384 "$@"; }
    ;;
  tp2)
    UNIBAKE_GPUS=2
    UNIBAKE_KERNELS=/opt/unibake/kernels/rocm_c/librocm_c.so:/opt/unibake/kernels/moe_c/libmoe_c.so:/opt/unibake/kernels/aiter/libaiter.so:/opt/unibake/profiles/tp2/kernels/custom_ar/libcustom_ar.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/rocm_c:/opt/unibake/kernels/moe_c:/opt/unibake/kernels/aiter:/opt/unibake/profiles/tp2/kernels/custom_ar
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp2/tune
    UNIBAKE_TUNE_EXPECT=3
    [ -n "${NCCL_MIN_NCHANNELS+set}" ] || export NCCL_MIN_NCHANNELS=112
    [ -n "${RCCL_MSCCL_ENABLE+set}" ] || export RCCL_MSCCL_ENABLE=0
    start_engine() { exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port "${PORT}" --model "${UNIBAKE_MOUNT_MODEL}" --served-model-name "${MODEL_NAME}" --tensor-parallel-size 2 --max-model-len 32768 "$@"; }
    ;;
  tp4)
    UNIBAKE_GPUS=4
    UNIBAKE_KERNELS=/opt/unibake/kernels/rocm_c/librocm_c.so:/opt/unibake/kernels/moe_c/libmoe_c.so:/opt/unibake/kernels/aiter/libaiter.so:/opt/unibake/profiles/tp4/kernels/custom_ar/libcustom_ar.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/rocm_c:/opt/unibake/kernels/moe_c:/opt/unibake/kernels/aiter:/opt/unibake/profiles/tp4/kernels/custom_ar
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp4/tune
    UNIBAKE_TUNE_EXPECT=3
    [ -n "${NCCL_MIN_NCHANNELS+set}" ] || export NCCL_MIN_NCHANNELS=112
    [ -n "${RCCL_MSCCL_ENABLE+set}" ] || export RCCL_MSCCL_ENABLE=1
    start_engine() { exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port "${PORT}" --model "${UNIBAKE_MOUNT_MODEL}" --served-model-name "${MODEL_NAME}" --tensor-parallel-size 4 --max-model-len 32768 --enable-chunked-prefill "$@"; }
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
