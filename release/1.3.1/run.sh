#!/bin/sh
# Start one profile of demo-llm:1.3.1 with only the GPUs it needs.
# Usage: ./run.sh [--dry-run] [--name NAME] [PROFILE] [ENGINE ARGS...] [-- ENGINE ARGS...]
#        (default profile: tp4; --dry-run, --name and --help are taken anywhere before "--")
# Environment (each value is checked; a bad one stops here with exit 2):
#   GPUS=2,3        which GPUs: numbers, NVIDIA GPU-/MIG- UUIDs, or all (default: the first N the profile needs)
#   PORT, MODEL_NAME  passed to the engine (defaults 30000, demo-llm)
#   MODEL_DRAFT=/host/dir   mounted read-only at /models/draft
#   MODEL_TARGET=/host/dir   mounted read-only at /models/target
#   PROFILE         the profile, as the image takes it (the argument and PROFILE must agree when both are given)
#   IMAGE           the image to run (default demo-llm:1.3.1; set it to an older tag to roll back)
#   NAME            the container name (default demo-llm-PROFILE; --name wins)
set -eu
quote() { q=$(printf '%s.' "$1" | sed "s/'/'\\\\''/g"); printf "'%s'" "${q%.}"; }  # (the '.': $() drops final newlines)
die() { printf 'error: %s\n' "$*" >&2; exit 2; }
usage() {
  sed -n '2,/^set -eu$/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  echo "Profiles: tp1, tp2, tp4"
}
number() {  # $1 name, $2 value, $3 lowest, $4 highest: a whole number in range, or exit 2
  # no leading zeros: the engine would be handed 00080 as written, and read it as it pleases
  case "$2" in ""|*[!0-9]*|0?*) die "$1 must be a number from $3 to $4; got '$2'" ;; esac
  [ "${#2}" -le 5 ] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] || die "$1 must be a number from $3 to $4; got '$2'"
}

dry_run=0
name="${NAME:-}"
profile=""
engine_args=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    --name) [ "$#" -ge 2 ] || die "--name needs a value"; name=$2; shift ;;
    --name=*) name=${1#--name=} ;;
    --) shift; for arg in "$@"; do engine_args="$engine_args $(quote "$arg")"; done; break ;;
    *)
      if [ -z "$profile" ] && [ -z "$engine_args" ]; then
        case "$1" in -*) die "unknown option '$1' before the profile (see ./run.sh --help)" ;; esac
        profile=$1
      else
        engine_args="$engine_args $(quote "$1")"
      fi ;;
  esac
  shift
done
if [ -n "${PROFILE:-}" ] && [ -n "$profile" ] && [ "$PROFILE" != "$profile" ]; then
  die "PROFILE=$PROFILE and the profile argument '$profile' disagree; give one"
fi
profile="${profile:-${PROFILE:-tp4}}"
case "$profile" in
  tp1) need=1; vendor=nvidia; nodes=1; network=bridge; ipc=host; shm=''; rdma=0; master_port=29500
    extra_devices=''; extra_groups='' ;;
  tp2) need=2; vendor=nvidia; nodes=1; network=bridge; ipc=host; shm=''; rdma=0; master_port=29500
    extra_devices=''; extra_groups='' ;;
  tp4) need=4; vendor=nvidia; nodes=1; network=bridge; ipc=host; shm=''; rdma=0; master_port=29500
    extra_devices=''; extra_groups='' ;;
  *) die "unknown profile '$profile'; known: tp1, tp2, tp4" ;;
esac

if [ -z "$name" ]; then name="demo-llm-$profile"; fi
case "$name" in
  [A-Za-z0-9]*) case "$name" in *[!A-Za-z0-9_.-]*) die "the container name must be letters, digits, '_', '.' and '-'; got '$name'" ;; esac ;;
  *) die "the container name must start with a letter or digit; got '$name'" ;;
esac
IMAGE="${IMAGE:-demo-llm:1.3.1}"
case "$IMAGE" in ""|-*|*[!A-Za-z0-9_.:/@-]*) die "IMAGE must be an image reference like demo-llm:1.3.1; got '$IMAGE'" ;; esac
# the engine's reference grammar, so a bad IMAGE is one line here, not the engine's exit 125; its
# variables are ir_*: sh has no local variables, and $name, $tag, $port ... are the script's own
image_ref() {
  ir_ref=$1
  case "$ir_ref" in
    *@*) ir_digest=${ir_ref#*@}; ir_ref=${ir_ref%%@*}
         case "$ir_digest" in sha256:*) ;; *) return 1 ;; esac
         ir_hex=${ir_digest#sha256:}
         case "$ir_hex" in *[!0-9a-f]*) return 1 ;; esac
         [ "${#ir_hex}" -eq 64 ] || return 1 ;;
  esac
  case "${ir_ref##*/}" in
    *:*) ir_tag=${ir_ref##*:}; ir_ref=${ir_ref%:*}
         case "$ir_tag" in [A-Za-z0-9_]*) ;; *) return 1 ;; esac  # not empty, a word character first
         case "$ir_tag" in *[!A-Za-z0-9_.-]*) return 1 ;; esac
         [ "${#ir_tag}" -le 128 ] || return 1 ;;
  esac
  ir_path=$ir_ref
  case "$ir_ref" in
    */*) ir_host=${ir_ref%%/*}
         # a first part with '.', ':' or upper case, or localhost, is a registry host (as the engine reads it)
         case "$ir_host" in *.*|*:*|*[A-Z]*|localhost)
           ir_path=${ir_ref#*/}
           ir_name=${ir_host%%:*}
           case "$ir_host" in *:*) ir_port=${ir_host#*:}; case "$ir_port" in ""|*[!0-9]*) return 1 ;; esac ;; esac
           case "$ir_name" in ""|.*|*.|*..*) return 1 ;; esac
           ir_rest=$ir_name
           while [ -n "$ir_rest" ]; do  # each dot-separated label: letters, digits and inner '-'
             ir_label=${ir_rest%%.*}
             case "$ir_label" in ""|-*|*-|*[!A-Za-z0-9-]*) return 1 ;; esac
             case "$ir_rest" in *.*) ir_rest=${ir_rest#*.} ;; *) ir_rest="" ;; esac
           done ;;
         esac ;;
  esac
  # the repository: lower-case components of letters and digits, one '.', '_', '__' or '-'s between
  case "$ir_path" in ""|*[!a-z0-9._/-]*|[._/-]*|*[._/-]|*//*|*/[._-]*|*[._-]/*|*..*|*___*|*._*|*_.*|*-.*|*.-*|*_-*|*-_*) return 1 ;; esac
  return 0
}
image_ref "$IMAGE" || die "IMAGE must be an image reference like demo-llm:1.3.1 (a lower-case repository, a tag, a sha256 digest); got '$IMAGE'"

# GPUs: numbers (every vendor), GPU-/MIG- UUIDs (NVIDIA), or all
gpus="${GPUS:-}"
if [ -z "$gpus" ]; then
  i=0
  while [ "$i" -lt "$need" ]; do gpus="${gpus:+$gpus,}$i"; i=$((i + 1)); done
fi
if [ "$gpus" != all ]; then
  # commas between items, nothing else: a space, a newline or a glob would split or expand below into
  # items the count never saw
  case "$gpus" in ,*|*,|*,,*|*[!A-Za-z0-9,/-]*) die "GPUS must be GPU numbers like 0,1, UUIDs, or all; got '$gpus'" ;; esac
  for g in $(printf '%s' "$gpus" | tr ',' ' '); do
    case "$g" in
      *[!0-9]*)
        case "$g" in
          GPU-*|MIG-*) [ "$vendor" = nvidia ] || die "GPUS: $vendor GPUs are chosen by number, not UUID; got '$g'"
                       case "${g#*-}" in ""|*[!A-Za-z0-9/-]*) die "GPUS: '$g' is not a GPU or MIG UUID" ;; esac ;;
          *) die "GPUS must be GPU numbers like 0,1, UUIDs, or all; got '$gpus'" ;;
        esac ;;
      0?*) die "GPUS: '$g' is not a GPU number (no leading zeros)" ;;
      *) [ "${#g}" -le 4 ] || die "GPUS: '$g' is not a GPU number" ;;
    esac
  done
  twice=$(printf '%s\n' "$gpus" | tr ',' '\n' | sort | uniq -d | head -n 1)
  [ -z "$twice" ] || die "GPUS names GPU '$twice' twice; each GPU once"
  count=$(printf '%s\n' "$gpus" | tr ',' '\n' | grep -c .)
  [ "$count" -eq "$need" ] || die "profile $profile needs $need GPUs; GPUS=$gpus names $count"
fi

port="${PORT:-30000}"
number PORT "$port" 1 65535
set -- docker run --rm --name "$name" -e PROFILE="$profile" -e PORT="$port"
if [ "$nodes" -gt 1 ]; then
  [ -n "${NODE_RANK:-}" ] || die "profile $profile runs on $nodes nodes: set NODE_RANK (0 to $((nodes - 1))) and MASTER_ADDR"
  number NODE_RANK "$NODE_RANK" 0 $((nodes - 1))
  [ -n "${MASTER_ADDR:-}" ] || die "profile $profile runs on $nodes nodes: set MASTER_ADDR, the address of the node with NODE_RANK=0"
  case "$MASTER_ADDR" in
    -*|.*|*[!A-Za-z0-9.:-]*) die "MASTER_ADDR must be a host name or an IP address; got '$MASTER_ADDR'" ;;
    *[A-Za-z0-9]*) ;;
    *) die "MASTER_ADDR must be a host name or an IP address; got '$MASTER_ADDR'" ;;
  esac
  [ "${#MASTER_ADDR}" -le 253 ] || die "MASTER_ADDR is longer than a host name can be"
  mport="${MASTER_PORT:-$master_port}"
  number MASTER_PORT "$mport" 1 65535
  set -- "$@" -e NNODES="$nodes" -e NODE_RANK="$NODE_RANK" -e MASTER_ADDR="$MASTER_ADDR" -e MASTER_PORT="$mport"
fi
if [ "$network" = host ]; then
  set -- "$@" --network host
else
  set -- "$@" -p "$port:$port"
fi
set -- "$@" --ipc="$ipc"
if [ -n "$shm" ]; then set -- "$@" --shm-size="$shm"; fi
if [ "$rdma" -eq 1 ]; then set -- "$@" --device /dev/infiniband --ulimit memlock=-1:-1; fi
case "$vendor" in
  amd|hygon)
    set -- "$@" --device /dev/kfd --group-add video --security-opt seccomp=unconfined
    if [ "$gpus" = all ]; then
      set -- "$@" --device /dev/dri
    else
      for g in $(printf '%s' "$gpus" | tr ',' ' '); do set -- "$@" --device "/dev/dri/renderD$((128 + g))"; done
      if [ "$vendor" = hygon ]; then
        visible=""
        i=0
        while [ "$i" -lt "$need" ]; do visible="${visible:+$visible,}$i"; i=$((i + 1)); done
        set -- "$@" -e HIP_VISIBLE_DEVICES="$visible"
      fi
    fi ;;
  *)
    if [ "$gpus" = all ]; then set -- "$@" --gpus all; else set -- "$@" --gpus "\"device=$gpus\""; fi ;;
esac
for d in $extra_devices; do set -- "$@" --device "$d"; done
for g in $extra_groups; do set -- "$@" --group-add "$g"; done
if [ -n "${MODEL_NAME:-}" ]; then set -- "$@" -e MODEL_NAME="$MODEL_NAME"; fi
if [ -n "${MODEL_DRAFT:-}" ]; then
  case "${MODEL_DRAFT}" in /*) ;; *) die "MODEL_DRAFT must be an absolute path on this host; got '${MODEL_DRAFT}'" ;; esac
  case "${MODEL_DRAFT}" in *:*|*,*|*\"*|*[[:cntrl:]]*) die "MODEL_DRAFT must not hold ':', ',', '\"' or a control character; got '${MODEL_DRAFT}'" ;; esac
  # --mount, not -v: a source that does not exist is an error (-v would make an empty folder of it and
  # start the engine without its weights)
  set -- "$@" --mount "type=bind,source=${MODEL_DRAFT},target=/models/draft,readonly"
fi
if [ -n "${MODEL_TARGET:-}" ]; then
  case "${MODEL_TARGET}" in /*) ;; *) die "MODEL_TARGET must be an absolute path on this host; got '${MODEL_TARGET}'" ;; esac
  case "${MODEL_TARGET}" in *:*|*,*|*\"*|*[[:cntrl:]]*) die "MODEL_TARGET must not hold ':', ',', '\"' or a control character; got '${MODEL_TARGET}'" ;; esac
  # --mount, not -v: a source that does not exist is an error (-v would make an empty folder of it and
  # start the engine without its weights)
  set -- "$@" --mount "type=bind,source=${MODEL_TARGET},target=/models/target,readonly"
fi
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
