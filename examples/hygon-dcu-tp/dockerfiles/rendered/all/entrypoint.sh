#!/bin/sh
# Rendered by unibake for hygon-dcu-tp:0.8.5-das.opt1.dtk2504: do not edit by hand.
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
    UNIBAKE_KERNELS=/opt/unibake/kernels/lightop/liblightop_gemm.so:/opt/unibake/kernels/lightop/liblightop_moe.so:/opt/unibake/kernels/lightop/liblightop_norm.so:/opt/unibake/kernels/fastpt/libfastpt.so:/opt/unibake/kernels/hipblaslt_ext/libhipblaslt_ext.so:/opt/unibake/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/rccl_net/librccl_net.so:/opt/unibake/kernels/lmslim/lmslim/liblmslim.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/lightop:/opt/unibake/kernels/fastpt:/opt/unibake/kernels/hipblaslt_ext:/opt/unibake/kernels/flash_attn:/opt/unibake/kernels/rccl_net:/opt/unibake/kernels/lmslim/lmslim
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp1/tune
    UNIBAKE_TUNE_EXPECT=2
    UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/lmslim
    [ -n "${NCCL_MIN_NCHANNELS+set}" ] || export NCCL_MIN_NCHANNELS=16
    start_engine() { exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port "${PORT}" --model "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tensor-parallel-size 1 "$@"; }
    ;;
  tp2)
    UNIBAKE_GPUS=2
    UNIBAKE_KERNELS=/opt/unibake/kernels/lightop/liblightop_gemm.so:/opt/unibake/kernels/lightop/liblightop_moe.so:/opt/unibake/kernels/lightop/liblightop_norm.so:/opt/unibake/kernels/fastpt/libfastpt.so:/opt/unibake/kernels/hipblaslt_ext/libhipblaslt_ext.so:/opt/unibake/profiles/tp2/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/rccl_net/librccl_net.so:/opt/unibake/kernels/lmslim/lmslim/liblmslim.so:/opt/unibake/profiles/tp2/kernels/tp2_row_LDSx/libtp2_row_LDSx.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/lightop:/opt/unibake/kernels/fastpt:/opt/unibake/kernels/hipblaslt_ext:/opt/unibake/profiles/tp2/kernels/flash_attn:/opt/unibake/kernels/rccl_net:/opt/unibake/kernels/lmslim/lmslim:/opt/unibake/profiles/tp2/kernels/tp2_row_LDSx
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp2/tune
    UNIBAKE_TUNE_EXPECT=3
    UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/lmslim
    [ -n "${NCCL_MIN_NCHANNELS+set}" ] || export NCCL_MIN_NCHANNELS=16
    [ -n "${VLLM_ATTENTION_BACKEND+set}" ] || export VLLM_ATTENTION_BACKEND=FLASH_ATTN_LEGACY
    start_engine() { exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port "${PORT}" --model "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tensor-parallel-size 2 --enforce-eager "$@"; }
    ;;
  tp4)
    UNIBAKE_GPUS=4
    UNIBAKE_KERNELS=/opt/unibake/kernels/lightop/liblightop_gemm.so:/opt/unibake/kernels/lightop/liblightop_moe.so:/opt/unibake/kernels/lightop/liblightop_norm.so:/opt/unibake/kernels/fastpt/libfastpt.so:/opt/unibake/kernels/hipblaslt_ext/libhipblaslt_ext.so:/opt/unibake/kernels/flash_attn/libflash_attn.so:/opt/unibake/kernels/rccl_net/librccl_net.so:/opt/unibake/kernels/lmslim/lmslim/liblmslim.so
    UNIBAKE_KERNEL_DIRS=/opt/unibake/kernels/lightop:/opt/unibake/kernels/fastpt:/opt/unibake/kernels/hipblaslt_ext:/opt/unibake/kernels/flash_attn:/opt/unibake/kernels/rccl_net:/opt/unibake/kernels/lmslim/lmslim
    UNIBAKE_TUNE_DIR=/opt/unibake/profiles/tp4/tune
    UNIBAKE_TUNE_EXPECT=3
    UNIBAKE_PYTHON_DIRS=/opt/unibake/kernels/lmslim
    [ -n "${HSA_ENABLE_SDMA+set}" ] || export HSA_ENABLE_SDMA=0
    [ -n "${NCCL_ALGO+set}" ] || export NCCL_ALGO=Ring
    [ -n "${NCCL_MIN_NCHANNELS+set}" ] || export NCCL_MIN_NCHANNELS=32
    start_engine() { exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port "${PORT}" --model "${UNIBAKE_MOUNT_TARGET}" --served-model-name "${MODEL_NAME}" --tensor-parallel-size 4 "$@"; }
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
