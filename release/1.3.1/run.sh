#!/bin/sh
# Start one profile of demo-llm:1.3.1 with only the GPUs it needs.
# Usage: ./run.sh [--dry-run] [--name NAME] [-e NAME[=VALUE]]... [--env-file FILE]... [PROFILE] [ENGINE ARGS...]
#                 [-- ENGINE ARGS...]
#        (default profile: tp4; --dry-run, --name and --help are taken anywhere before "--";
#        -e and --env-file only before the profile, so an engine's own -e after it is the engine's)
#   -e NAME=VALUE   one more variable for the container (over the profile's env); -e NAME passes NAME's
#                   value from this environment, unshown (a token); --env NAME=VALUE is the same
#   --env-file FILE more variables, as docker run --env-file reads them (-e wins over a file)
#   PROFILE, PORT, MODEL_NAME, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, HIP_VISIBLE_DEVICES and
#   UNIBAKE_* are set by run.sh or the image, not by -e or a file: use the variables below (nor PATH, the
#   image's, nor IFS, PPID, PWD, OPTIND, which the image's shell sets)
# Environment (each value is checked; a bad one stops here with exit 2):
#   GPUS=2,3        which GPUs: numbers, NVIDIA GPU-/MIG- UUIDs, or all (default: the first N the profile needs)
#   PORT, MODEL_NAME  passed to the engine (defaults 30000, demo-llm)
#   MODEL_DRAFT=/host/dir   mounted read-only at /models/draft
#   MODEL_TARGET=/host/dir   mounted read-only at /models/target
#   PROFILE         the profile, as the image takes it (the argument and PROFILE must agree when both are given)
#   IMAGE           the image to run (default demo-llm:1.3.1; set it to an older tag to roll back)
#   NAME            the container name (default demo-llm-PROFILE; --name wins)
set -eu
# the environment as run.sh was started, put back before docker starts: run.sh's own variables (name, port,
# gpus, ...) must not reach docker for the user's of one name ("-e name" or an env file's "name" line)
env_at_start=$(export -p)
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

# the variables run.sh or the image set: a -e or an env file setting one is refused (it would disagree
# with what run.sh checked, or with the image's own)
own_env() {
  case "$1" in PROFILE|PORT|MODEL_NAME|NNODES|NODE_RANK|MASTER_ADDR|MASTER_PORT|HIP_VISIBLE_DEVICES|UNIBAKE_*)
    die "$2 sets $1, which run.sh or the image sets; use the variable run.sh reads (see ./run.sh --help)" ;;
  PATH) die "$2 sets PATH, which would replace the image's, where the engine is found" ;;
  IFS|PPID|PWD|OPTIND)  # (as the plan refuses them in a profile's env)
    die "$2 sets $1, which the image's /bin/sh sets itself: the value would not reach the engine" ;;
  esac
}
in_env() {  # $1 a name: whether this environment has it (by printenv; a host without it, busybox's own
  # build, by env's lines, which another value holding a newline could fool)
  if command -v printenv >/dev/null 2>&1; then printenv "$1" >/dev/null; else env | cut -d= -f1 | grep -Fxq -e "$1"; fi
}
env_arg() {  # $1: NAME=VALUE or NAME, from -e
  ea_name=${1%%=*}
  case "$ea_name" in ""|[0-9]*|*[!A-Za-z0-9_]*) die "-e needs NAME=VALUE with NAME like HF_HOME; got '${1%%=*}'" ;; esac
  own_env "$ea_name" "-e"
  case " $env_names " in *" $ea_name "*) die "-e gives $ea_name twice; give it once" ;; esac
  env_names="$env_names $ea_name"
  case "$1" in
    *=*) env_args="$env_args -e $(quote "$1")" ;;
    *) in_env "$ea_name" || die "-e $ea_name: $ea_name is not set in this environment; give -e $ea_name=VALUE"
       env_args="$env_args -e $ea_name" ;;
  esac
}
env_file() {  # $1: FILE, from --env-file
  [ -n "$1" ] || die "--env-file needs a file"
  if [ -e "$1" ] && [ ! -f "$1" ] && [ ! -d "$1" ]; then
    die "--env-file $1: not a regular file: run.sh reads it to check its names, so a pipe (like <(...)) would reach docker empty; save it as a file"
  fi
  [ -f "$1" ] && [ -r "$1" ] || die "--env-file $1: no such readable file"
  # docker refuses a file with a line longer than 65535 bytes or not UTF-8 (exit 125, after run.sh said yes);
  # runc a variable holding a NUL byte
  [ "$(wc -c < "$1")" -eq "$(tr -d '\000' < "$1" | wc -c)" ] || die "--env-file $1: holds a NUL byte, which no variable can hold"
  ef_line=$(LC_ALL=C awk 'length($0) > 65535 { print NR; exit }' "$1")
  [ -z "$ef_line" ] || die "--env-file $1: line $ef_line is longer than docker reads (65535 bytes)"
  ef_c="[$(printf '\200-\277')]"
  ef_u8="[^$(printf '\200-\377')]|[$(printf '\302-\337')]$ef_c|$(printf '\340')[$(printf '\240-\277')]$ef_c"
  ef_u8="$ef_u8|[$(printf '\341-\354\356\357')]$ef_c$ef_c|$(printf '\355')[$(printf '\200-\237')]$ef_c"
  ef_u8="$ef_u8|$(printf '\360')[$(printf '\220-\277')]$ef_c$ef_c|[$(printf '\361-\363')]$ef_c$ef_c$ef_c"
  ef_u8="$ef_u8|$(printf '\364')[$(printf '\200-\217')]$ef_c$ef_c"
  ef_line=$(LC_ALL=C grep -n -a -v -E "^($ef_u8)*\$" "$1" | head -n 1 | cut -d: -f1)
  [ -z "$ef_line" ] || die "--env-file $1: line $ef_line is not UTF-8, which docker reads (save the file as UTF-8)"
  # each line's name as docker reads it: a '\r' before the line's end dropped, a UTF-8 byte-order mark
  # on the first line dropped, leading white space dropped (Unicode's too: NEL, no-break and the other
  # Unicode spaces, as Go's unicode.IsSpace), '#' lines and blank ones skipped, the name up to '=' (a
  # line without '=' takes the variable from the environment)
  ef_names=$(LC_ALL=C sed -n -e "s/$(printf '\r')\$//" -e "1s/^$(printf '\357\273\277')//" -e ':s' \
    -e "s/^[$(printf ' \t\v\f\r')]//" -e "s/^$(printf '\302')[$(printf '\205\240')]//" \
    -e "s/^$(printf '\341\232\200')//" -e "s/^$(printf '\342\200')[$(printf '\200-\212\250\251\257')]//" \
    -e "s/^$(printf '\342\201\237')//" -e "s/^$(printf '\343\200\200')//" -e 't s' \
    -e '/^#/d' -e '/^$/d' -e '/=/!s/^/+/p' -e '/=/!d' -e 's/=.*//' -e 's/^/=/p' "$1")
  # docker refuses a line whose name is empty or holds a space or a tab ("export A=1"), after run.sh's checks
  ef_bad=$(printf '%s\n' "$ef_names" | LC_ALL=C sed -n "/^=\$/p; /[$(printf ' \t')]/p" | head -n 1)
  [ "$ef_bad" != "=" ] || die "--env-file $1: a line has no name before its '='"
  [ -z "$ef_bad" ] || die "--env-file $1: '${ef_bad#?}' is no variable name (docker reads NAME=VALUE lines: no export, no space)"
  # a name run.sh sets; a line without '=' whose variable this environment lacks (docker would drop it
  # without a word, as run.sh refuses -e NAME of one)
  ef_own=$(printf '%s\n' "$ef_names" | while IFS= read -r ef_name; do
    case "${ef_name#?}" in PROFILE|PORT|MODEL_NAME|NNODES|NODE_RANK|MASTER_ADDR|MASTER_PORT|HIP_VISIBLE_DEVICES|UNIBAKE_*|\
                           PATH|IFS|PPID|PWD|OPTIND)
      printf '%s\n' "${ef_name#?}"; break ;;
    esac
    case "$ef_name" in +*) in_env "${ef_name#+}" || { printf '+%s\n' "${ef_name#+}"; break; } ;; esac
  done)
  case "$ef_own" in
    "") ;;
    +*) die "--env-file $1: ${ef_own#+} (a line without '=') is not set in this environment, so docker would drop it; set it or give ${ef_own#+}=VALUE" ;;
    *) own_env "$ef_own" "--env-file $1" ;;
  esac
  env_files="$env_files $(quote "--env-file=$1")"
}

dry_run=0
name="${NAME:-}"
profile=""
engine_args=""
env_args=""
env_names=""
env_files=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    --name) [ "$#" -ge 2 ] || die "--name needs a value"; name=$2; shift ;;
    --name=*) name=${1#--name=} ;;
    -e|--env|--env-file)
      if [ -n "$profile" ] || [ -n "$engine_args" ]; then
        engine_args="$engine_args $(quote "$1")"
      else
        [ "$#" -ge 2 ] || die "$1 needs a value"
        if [ "$1" = --env-file ]; then env_file "$2"; else env_arg "$2"; fi
        shift
      fi ;;
    --env=*|--env-file=*)
      if [ -n "$profile" ] || [ -n "$engine_args" ]; then
        engine_args="$engine_args $(quote "$1")"
      else
        case "$1" in --env=*) env_arg "${1#--env=}" ;; *) env_file "${1#--env-file=}" ;; esac
      fi ;;
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

# groups by their number on this host: the engine reads a name in the image's /etc/group, where it may be
# missing (docker: "Unable to find group render", exit 125) or another number than the group the host's
# device nodes belong to; each group once. A name this host lacks stays a name (the image's own group of
# that name, if it has one: no device node of this host belongs to it anyway)
group_ids=""
host_group() {  # $1 a group name or number
  case "$1" in
    *[!0-9]*) hg_gid=$( (getent group "$1" 2>/dev/null || grep "^$1:" /etc/group 2>/dev/null) | head -n 1 | cut -d: -f3)
              case "$hg_gid" in ""|*[!0-9]*) hg_gid=$1 ;; esac ;;
    *) hg_gid=$1 ;;
  esac
  case " $group_ids " in *" $hg_gid "*) ;; *) group_ids="${group_ids:+$group_ids }$hg_gid" ;; esac
}

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
  # the host's network: the engine (PORT) and the ranks' rendezvous (MASTER_PORT) cannot share a port
  [ "$mport" != "$port" ] || die "MASTER_PORT and PORT are both $port: on the host's network the engine and the rendezvous need a port each"
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
    set -- "$@" --device /dev/kfd --security-opt seccomp=unconfined
    host_group video
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
for g in $extra_groups; do host_group "$g"; done
for g in $group_ids; do set -- "$@" --group-add "$g"; done
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
# the files first, then each -e: the engine takes the last value of a name
if [ -n "$env_files$env_args" ]; then eval "set -- \"\$@\" $env_files $env_args"; fi
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
# (tried in a subshell first: bash as sh stops at an exported read-only variable, SHELLOPTS, it cannot set
# back; bash itself only says so)
if (eval "$env_at_start") 2>/dev/null; then eval "$env_at_start" 2>/dev/null || :; fi
exec "$@"
