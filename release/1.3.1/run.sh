#!/bin/sh
# Start one profile of demo-llm:1.3.1 with only the GPUs it needs.
# Usage: ./run.sh [--dry-run] [PROFILE] [ENGINE ARGS...]       (default profile: tp4)
# Environment:
#   GPUS=2,3        which GPUs (default: the first N the profile needs)
#   PORT, MODEL_NAME  passed to the engine (defaults 30000, demo-llm)
#   MODEL_DRAFT=/host/dir   mounted read-only at /models/draft
#   MODEL_TARGET=/host/dir   mounted read-only at /models/target
#   IMAGE           the image to run (default demo-llm:1.3.1; set it to an older tag to roll back)
#   NAME            the container name (default demo-llm-PROFILE)
set -eu
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
IMAGE="${IMAGE:-demo-llm:1.3.1}"
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
profile="${1:-tp4}"
[ "$#" -eq 0 ] || shift
engine_args=""
for arg in "$@"; do engine_args="$engine_args $(quote "$arg")"; done
case "$profile" in
  tp1) need=1; vendor=nvidia ;;
  tp2) need=2; vendor=nvidia ;;
  tp4) need=4; vendor=nvidia ;;
  *) echo "error: unknown profile '$profile'; known: tp1, tp2, tp4" >&2; exit 2 ;;
esac

gpus="${GPUS:-}"
if [ -z "$gpus" ]; then
  i=0
  while [ "$i" -lt "$need" ]; do gpus="${gpus:+$gpus,}$i"; i=$((i + 1)); done
fi
count=$(printf '%s\n' "$gpus" | tr ',' '\n' | grep -c .)
if [ "$count" -ne "$need" ]; then
  echo "error: profile $profile needs $need GPUs; GPUS=$gpus names $count" >&2
  exit 2
fi
for g in $(printf '%s' "$gpus" | tr ',' ' '); do
  case "$g" in *[!0-9]*|"") echo "error: GPUS must be GPU numbers like 0,1; got '$gpus'" >&2; exit 2 ;; esac
done

port="${PORT:-30000}"
set -- docker run --rm --name "${NAME:-demo-llm-$profile}" -e PROFILE="$profile" -e PORT="$port" \
  -p "$port:$port" --ipc=host --shm-size=16g
if [ "$vendor" = amd ]; then
  set -- "$@" --device /dev/kfd --group-add video --security-opt seccomp=unconfined
  for g in $(printf '%s' "$gpus" | tr ',' ' '); do set -- "$@" --device "/dev/dri/renderD$((128 + g))"; done
else
  set -- "$@" --gpus "\"device=$gpus\""
fi
if [ -n "${MODEL_NAME:-}" ]; then set -- "$@" -e MODEL_NAME="$MODEL_NAME"; fi
if [ -n "${MODEL_DRAFT:-}" ]; then set -- "$@" -v "${MODEL_DRAFT}:/models/draft:ro"; fi
if [ -n "${MODEL_TARGET:-}" ]; then set -- "$@" -v "${MODEL_TARGET}:/models/target:ro"; fi
set -- "$@" "$IMAGE"
if [ -n "$engine_args" ]; then eval "set -- \"\$@\" serve $engine_args"; fi

if [ "$dry_run" -eq 1 ]; then
  out=""
  for word in "$@"; do
    case "$word" in
      *[!A-Za-z0-9_./:=,+-]*|"") word=$(quote "$word") ;;
    esac
    out="${out:+$out }$word"
  done
  printf '%s\n' "$out"
  exit 0
fi
exec "$@"
