#!/bin/sh
# Start one profile of demo-llm:1.3.1 with only the GPUs it needs.
# Usage: ./run.sh [--dry-run] [--name NAME] [-e NAME[=VALUE]]... [--env-file FILE]... [PROFILE] [ENGINE ARGS...]
#                 [-- ENGINE ARGS...]
#        (default profile: tp4; --dry-run, --name and --help are taken anywhere before "--";
#        -e and --env-file only before the profile, so an engine's own -e after it is the engine's)
#   -e NAME=VALUE   one more variable for the container (over the profile's env); -e NAME passes NAME's
#                   value from this environment, unshown (a token); --env NAME=VALUE is the same; --dry-run
#                   shows a VALUE whose NAME says secret (HF_TOKEN, API_KEY, PASSWORD ...) as <hidden>, and so
#                   the value of an engine argument named so (--api-key VALUE, --hf-token=VALUE, HF_TOKEN=VALUE)
#   --env-file FILE more variables, as docker run --env-file reads them (-e wins over a file); each value, weight
#                   path, MODEL_NAME and engine argument must be UTF-8 (docker would change the others)
#   PROFILE, PORT, MODEL_NAME, UNIBAKE_*, on a hygon profile HIP_VISIBLE_DEVICES and, on a profile of several
#   nodes, NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT are set by run.sh or the image, not by -e or a file: use the
#   variables below (nor PATH, LD_LIBRARY_PATH, PYTHONPATH, PYTHONDONTWRITEBYTECODE, the image's, nor IFS,
#   PPID, PWD, OPTIND, SHLVL, _, LINENO, PS1, PS2, PS4, OLDPWD, nor bash's own (SHELLOPTS, RANDOM, BASH_VERSION
#   ...), which the image's shell sets, nor HOME,
#   HOSTNAME, which docker sets, nor NVIDIA_VISIBLE_DEVICES: use GPUS; CUDA_VISIBLE_DEVICES,
#   ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL number the container's GPUs from 0, as the
#   engine sees them, and name as many as the profile needs)
# Environment (each value is checked; a bad one stops here with exit 2):
#   GPUS=2,3        which GPUs: numbers, NVIDIA GPU-/MIG- UUIDs, or all (default: the first N the profile needs)
#   PORT, MODEL_NAME  passed to the engine (defaults 30000, demo-llm)
#   MODEL_DRAFT=/host/dir   mounted read-only at /models/draft
#   MODEL_TARGET=/host/dir   mounted read-only at /models/target
#   PROFILE         the profile, as the image takes it (the argument and PROFILE must agree when both are given)
#   IMAGE           the image to run (default demo-llm:1.3.1; set it to an older tag to roll back, when that release
#                   runs alike: the release notes say when it does not, and its own run.sh is then the one)
#   (the container is named demo-llm-PROFILE, or by --name; no variable names it: WSL and some logins set NAME
#   to the computer's name, CONTAINER_NAME is set in some containers, and either would give every profile one name)
set -eu
# only absolute PATH entries (as apply.sh keeps): an empty one (PATH=$EXTRA:$PATH with EXTRA unset), '.' or another
# relative one would run the current folder's own files (a 'sed', a 'docker'); docker gets this PATH too
# (a name of run.sh's own, unset after: a user's exported "path" reaches docker as it was)
if [ -n "${PATH+set}" ]; then
  unibake_path_=$PATH:
  PATH=
  while [ -n "$unibake_path_" ]; do
    case "${unibake_path_%%:*}" in /*) PATH=${PATH:+$PATH:}${unibake_path_%%:*} ;; esac
    unibake_path_=${unibake_path_#*:}
  done
  unset unibake_path_
fi
# the environment as run.sh was started, put back before docker starts: run.sh's own variables (name, port,
# gpus, ...) must not reach docker for the user's of one name ("-e name" or an env file's "name" line)
env_at_start=$(export -p)
# an older grep (before 3.6: Ubuntu 20.04's) takes options from GREP_OPTIONS, with a warning on every call (an old
# .bashrc's --color=auto): each grep here runs as run.sh calls it (docker still gets the variable, put back below)
unset GREP_OPTIONS
quote() { q=$(printf '%s.' "$1" | sed "s/'/'\\\\''/g"); printf "'%s'" "${q%.}"; }  # (the '.': $() drops final newlines)
# one line, whatever a value holds: control characters (C1 ones too) and bytes that are no UTF-8 written as
# visible escapes (\n, \x1b, \xe9), as unibake prints them, so a value cannot drive the terminal or forge a line
visible() {
  printf '%s.' "$1" | LC_ALL=C awk '
    BEGIN { for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i; esc[9] = "\\t"; esc[10] = "\\n"; esc[13] = "\\r" }
    { text = text (NR > 1 ? "\n" : "") $0 }
    END {
      text = substr(text, 1, length(text) - 1); n = length(text); out = ""
      for (i = 1; i <= n; i++) {
        c = substr(text, i, 1); b = ord[c]
        if (b >= 194 && b <= 244) {  # a UTF-8 lead byte and its continuation bytes: one character, kept
          k = b >= 240 ? 3 : b >= 224 ? 2 : 1
          for (j = 1; j <= k && i + j <= n && ord[substr(text, i + j, 1)] >= 128 && ord[substr(text, i + j, 1)] < 192; j++) ;
          if (j > k && !(b == 194 && ord[substr(text, i + 1, 1)] < 160)) { out = out substr(text, i, k + 1); i += k; continue }
          if (j > k) { out = out sprintf("\\x%02x", ord[substr(text, i + 1, 1)]); i++; continue }  # C1
        }
        if (b < 32 || b >= 127) out = out (b in esc ? esc[b] : sprintf("\\x%02x", b)); else out = out c
      }
      printf "%s", out
    }'
}
# one word of --dry-run's line, as every POSIX sh (dash too, which has no $'...') reads it back: as it is when it needs
# no quotes, else in '...' (UTF-8 kept), with each run of control characters (C1 ones too) and bytes that are no UTF-8
# as "$(printf '\033[2J\r\n')", escapes only (the character after a newline joins the escapes, as \ooo: $(...) drops
# final newlines), so a value cannot drive the terminal or forge a line of its own; newlines that end the word are
# written as they are, in '...' (no sh has another way), so the line breaks there, before a "'"
shell_word() {
  case "$1" in ""|*[!A-Za-z0-9_./:=,+-]*) ;; *) printf '%s' "$1"; return 0 ;; esac
  printf '%s.' "$1" | LC_ALL=C awk '
    BEGIN { for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i; esc[9] = "\\t"; esc[10] = "\\n"; esc[13] = "\\r" }
    function octal(t,   o, m) { o = ""; for (m = 1; m <= length(t); m++) o = o sprintf("\\%03o", ord[substr(t, m, 1)]); return o }
    function lit_out() { if (lit != "") out = out "\047" lit "\047"; lit = "" }
    function esc_out() { if (escs != "") out = out "\"$(printf \047" escs "\047)\""; escs = "" }
    { text = text (NR > 1 ? "\n" : "") $0 }
    END {
      text = substr(text, 1, length(text) - 1); n = length(text); out = ""; lit = ""; escs = ""; nl = 0
      for (i = 1; i <= n; i++) {
        c = substr(text, i, 1); b = ord[c]; k = 0
        if (b >= 194 && b <= 244) {  # a UTF-8 lead byte and its continuation bytes: one character
          k = b >= 240 ? 3 : b >= 224 ? 2 : 1
          for (j = 1; j <= k && i + j <= n && ord[substr(text, i + j, 1)] >= 128 && ord[substr(text, i + j, 1)] < 192; j++) ;
          if (j <= k) k = 0
          else if (b == 194 && ord[substr(text, i + 1, 1)] < 160) { lit_out(); escs = escs octal(substr(text, i, 2)); i++; nl = 0; continue }  # C1
        }
        if (k == 0 && (b < 32 || b >= 127)) { lit_out(); escs = escs (b in esc ? esc[b] : octal(c)); nl = (b == 10); continue }
        unit = substr(text, i, k + 1); i += k
        if (nl) { escs = escs octal(unit); nl = 0; esc_out(); continue }
        esc_out(); lit = lit (unit == "\047" ? "\047\\\047\047" : unit)
      }
      for (tail = ""; substr(escs, length(escs) - 1) == "\\n"; escs = substr(escs, 1, length(escs) - 2)) tail = tail "\n"
      esc_out(); lit = lit tail; lit_out()  # (lit is empty where escs was not)
      if (out == "") out = "\047\047"
      printf "%s", out
    }'
}
unprintable() {  # stdin to stdout with each control character, C1 ones (UTF-8 \302\200-\302\237) too, as '?'
  tr '\001-\037\177' '?' | LC_ALL=C sed "s/$(printf '\302')[$(printf '\200-\237')]/?/g"
}
die() {  # (a host without awk: each control character as '?')
  de_text=$(visible "$*" 2>/dev/null) || de_text=$(printf '%s' "$*" | unprintable)
  printf 'error: %s\n' "$de_text" >&2; exit 2
}
# UTF-8, byte by byte (for grep -E in the C locale): docker sends a container's variables, command and mounts as
# JSON, where each byte that is no UTF-8 becomes U+FFFD: a value not UTF-8 would reach the container changed
u8_c="[$(printf '\200-\277')]"
utf8_re="[^$(printf '\200-\377')]|[$(printf '\302-\337')]$u8_c|$(printf '\340')[$(printf '\240-\277')]$u8_c"
utf8_re="$utf8_re|[$(printf '\341-\354\356\357')]$u8_c$u8_c|$(printf '\355')[$(printf '\200-\237')]$u8_c"
utf8_re="$utf8_re|$(printf '\360')[$(printf '\220-\277')]$u8_c$u8_c|[$(printf '\361-\363')]$u8_c$u8_c$u8_c"
utf8_re="$utf8_re|$(printf '\364')[$(printf '\200-\217')]$u8_c$u8_c"
is_utf8() {  # $1 a value: whether each of its lines is UTF-8
  ! printf '%s\n' "$1" | LC_ALL=C grep -a -q -v -E "^($utf8_re)*\$"
}
has_c1() {  # $1 a value: whether it holds a C1 control character (U+0080 to U+009F), whatever the shell and locale
  printf '%s\n' "$1" | LC_ALL=C grep -a -q "$(printf '\302')[$(printf '\200-\237')]"
}
not_utf8="is not UTF-8: docker would pass it changed (each byte that is no UTF-8 as U+FFFD)"
usage() {
  sed -n '2,/^set -eu$/p' < "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  echo "Profiles: tp1, tp2, tp4"
}
number() {  # $1 name, $2 value, $3 lowest, $4 highest: a whole number in range, or exit 2
  # no leading zeros: the engine would be handed 00080 as written, and read it as it pleases
  case "$2" in ""|*[!0-9]*|0?*) die "$1 must be a number from $3 to $4; got '$2'" ;; esac
  [ "${#2}" -le 5 ] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] || die "$1 must be a number from $3 to $4; got '$2'"
}

# the variables run.sh or the image set: a -e or an env file setting one is refused (it would disagree
# with what run.sh checked, or with the image's own)
topo_env=""
hip_env=""
own_env() {
  case "$1" in PROFILE|PORT|MODEL_NAME|UNIBAKE_*)
    die "$2 sets $1, which run.sh or the image sets; use the variable run.sh reads (see ./run.sh --help)" ;;
  NNODES|NODE_RANK|MASTER_ADDR|MASTER_PORT)  # set by run.sh and the image on a profile of several nodes only (as
    # the plan refuses them in such a profile's env): refused once the profile is known
    topo_env="${topo_env:-$2 sets $1}" ;;
  HIP_VISIBLE_DEVICES)  # set by run.sh on a hygon profile only (as the plan refuses it in such a profile's env; an
    # amd or nvidia profile takes it there): refused once the profile is known
    hip_env="${hip_env:-$2 sets $1}" ;;
  PATH) die "$2 sets PATH, which would replace the image's, where the engine is found" ;;
  LD_LIBRARY_PATH|PYTHONPATH|PYTHONDONTWRITEBYTECODE)  # (as the plan refuses them in a profile's env)
    die "$2 sets $1, which the image sets: the value would replace the image's, where the engine finds its libraries and modules" ;;
  IFS|PPID|PWD|OPTIND)  # (as the plan refuses them in a profile's env)
    die "$2 sets $1, which the image's /bin/sh sets itself: the value would not reach the engine" ;;
  PS1|PS2|PS4|LINENO|SHLVL|_|OLDPWD|\
  SHELLOPTS|BASHOPTS|RANDOM|SRANDOM|OPTERR|BASHPID|BASH_VERSION|BASH_ARGV0|HISTCMD|EPOCHSECONDS|EPOCHREALTIME|BASH_COMMAND|BASH_SUBSHELL|BASH|BASH_VERSINFO|COMP_WORDBREAKS)  # (an env file written by `env` holds SHLVL and _; bash sets or drops its own)
    die "$2 sets $1, which bash or busybox as the image's /bin/sh sets or drops: the value may not reach the engine" ;;
  HOME) die "$2 sets HOME, the home of the image's user, which docker sets (as the plan refuses it in a profile's env); set the tool's own variable, like HF_HOME" ;;
  HOSTNAME) die "$2 sets HOSTNAME, which docker sets to the container's host name: the two would disagree" ;;
  NVIDIA_VISIBLE_DEVICES) die "$2 sets NVIDIA_VISIBLE_DEVICES, which chooses the container's GPUs as GPUS does (run.sh gives docker --gpus from it): use GPUS" ;;
  esac
}
# What numbers the GPUs the engine sees: the container has only those of GPUS, numbered from 0, so a host's
# numbering copied from a docker run that gave every GPU (CUDA_VISIBLE_DEVICES=4,5,6,7 for 4 GPUs) hides every
# GPU from the engine, and an empty value or a negative number hides them too (as the plan checks a profile's
# env). The highest number is kept in vis_max (plus one; with what set it, vis_what) until the profile's
# count is known, and so is the fewest GPUs a value names (vis_few, with vis_few_what): CUDA_VISIBLE_DEVICES=0 on a
# profile of 2 started its engine on one GPU
vis_max=0
vis_what=""
vis_few=""
vis_few_what=""
vd_where_CUDA=""; vd_where_ROCR=""; vd_where_HIP=""; vd_where_GPU=""; vd_e_CUDA=""; vd_e_ROCR=""; vd_e_HIP=""; vd_e_GPU=""
# Only the value that reaches the container is checked: docker reads the files in order, then each -e, and the
# last value of a name wins (so a -e overrides a file's line, wherever it stands among run.sh's arguments)
visible_devices() {  # $1 where (-e, --env-file FILE), $2 the name, $3 its value: kept in vd_where_*, vd_value_*
  case "$2" in CUDA_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|HIP_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL) ;; *) return 0 ;; esac
  vd_key=${2%%_*}
  case "$1" in -e*) eval "vd_e_$vd_key=1" ;; *) eval "[ -z \"\$vd_e_$vd_key\" ]" || return 0 ;; esac
  eval "vd_where_$vd_key=\$1; vd_value_$vd_key=\$3"
}
check_visible() {  # $1 where, $2 the name, $3 its value: the value that wins
  case "$3" in *[![:space:]]*) ;; *) die "$1 sets $2='$3', which hides every GPU from the engine; remove it" ;; esac
  vd_rest="$3,"
  vd_seen=","
  vd_count=0
  while [ -n "$vd_rest" ]; do
    vd_item=${vd_rest%%,*}; vd_rest=${vd_rest#*,}
    vd_item=$(printf '%s' "$vd_item" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')
    vd_id=$vd_item
    case "$vd_item" in
      -|-*[!0-9]*) ;;
      -*) die "$1 sets $2='$3': '$vd_item' hides the GPUs after it from the engine; remove it" ;;
      "") [ -z "$vd_rest" ] || die "$1 sets $2='$3': its empty item hides the GPUs after it from the engine; remove it" ;;
      *[!0-9]*) ;;  # a UUID
      *) vd_n=$(printf '%s' "$vd_item" | sed -e 's/^0*//' -e 's/^$/0/')
         [ "${#vd_n}" -le 5 ] || vd_n=99999
         vd_id=$vd_n
         if [ "$vd_n" -ge "$vis_max" ]; then vis_max=$((vd_n + 1)); vis_what="$1 sets $2='$3', which names GPU $vd_n"; fi ;;
    esac
    # each GPU counted once (0,00 names GPU 0)
    case "$vd_seen" in
      *",$vd_id,"*) ;;
      *) [ -z "$vd_id" ] || { vd_seen="$vd_seen$vd_id,"; vd_count=$((vd_count + 1)); } ;;
    esac
  done
  if [ -z "$vis_few" ] || [ "$vd_count" -lt "$vis_few" ]; then
    vis_few=$vd_count; vis_few_what="$1 sets $2='$3', which names $vd_count GPU$([ "$vd_count" -eq 1 ] || echo s)"
  fi
}
# (a name starting with '-', which printenv would take as its option, by env's lines too: busybox's printenv takes
# no "--", it would look that up as a name)
in_env() {  # $1 a name: whether this environment has it (by printenv; a host without it, busybox's own
  # build, by env's lines, which another value holding a newline could fool)
  case "$1" in -*) ;; *) if command -v printenv >/dev/null 2>&1; then printenv "$1" >/dev/null; return; fi ;; esac
  env | cut -d= -f1 | grep -Fxq -e "$1"
}
env_value() {  # $1 a name in this environment that sh cannot read (A.B, which bash passes on): its value, as in_env
  # finds it (without printenv, env's line: its first line only)
  if case "$1" in -*) false ;; esac && command -v printenv >/dev/null 2>&1; then printenv "$1"; else
    env | while IFS= read -r ev_line; do case "$ev_line" in "$1="*) printf '%s\n' "${ev_line#"$1="}"; break ;; esac; done
  fi
}
env_arg() {  # $1: NAME=VALUE or NAME, from -e
  ea_name=${1%%=*}
  case "$ea_name" in ""|[0-9]*|*[!A-Za-z0-9_]*) die "-e needs NAME=VALUE with NAME like HF_HOME; got '${1%%=*}'" ;; esac
  own_env "$ea_name" "-e"
  case " $env_names " in *" $ea_name "*) die "-e gives $ea_name twice; give it once" ;; esac
  env_names="$env_names $ea_name"
  case "$1" in
    *=*) is_utf8 "${1#*=}" || die "-e $ea_name: the value $not_utf8; give it in UTF-8"
         visible_devices -e "$ea_name" "${1#*=}"
         env_args="$env_args -e $(quote "$1")" ;;
    *) in_env "$ea_name" || die "-e $ea_name: $ea_name is not set in this environment; give -e $ea_name=VALUE"
       eval "ea_value=\${$ea_name}"
       is_utf8 "$ea_value" || die "-e $ea_name: its value in this environment $not_utf8; give it in UTF-8"
       visible_devices "-e $ea_name, from this environment," "$ea_name" "$ea_value"
       env_args="$env_args -e $ea_name" ;;
  esac
}
env_file() {  # $1: FILE, from --env-file
  [ -n "$1" ] || die "--env-file needs a file"
  [ ! -d "$1" ] || die "--env-file $1: a folder, not a file of NAME=VALUE lines"
  if [ -p "$1" ]; then
    die "--env-file $1: not a regular file: run.sh reads it to check its names, so a pipe (like <(...)) would reach docker empty; save it as a file"
  fi
  if [ -e "$1" ] && [ ! -f "$1" ]; then
    die "--env-file $1: not a regular file (a device or a socket): save the variables as a file"
  fi
  [ -f "$1" ] || die "--env-file $1: no such file"
  [ -r "$1" ] || die "--env-file $1: not readable by this user"
  # docker refuses a file with a line longer than 65535 bytes or not UTF-8 (exit 125, after run.sh said yes)
  # (a NUL byte read as any other, here: docker takes it in a '#' line)
  # (by cut, not awk, which a host may lack: a line's bytes past the 65535th)
  ef_line=$(tr '\000' x < "$1" | LC_ALL=C cut -b 65536- | LC_ALL=C grep -a -n . | head -n 1 | cut -d: -f1)
  [ -z "$ef_line" ] || die "--env-file $1: line $ef_line is longer than docker reads (65535 bytes)"
  ef_line=$(tr '\000' x < "$1" | LC_ALL=C grep -n -a -v -E "^($utf8_re)*\$" | head -n 1 | cut -d: -f1)
  [ -z "$ef_line" ] || die "--env-file $1: line $ef_line is not UTF-8, which docker reads (save the file as UTF-8)"
  # each line as docker reads it: a '\r' before the line's end dropped, a UTF-8 byte-order mark on the first
  # line dropped, leading white space dropped (Unicode's too: NEL, no-break and the other Unicode spaces, as
  # Go's unicode.IsSpace), '#' lines and blank ones skipped. A NUL byte is read as \377, which UTF-8 never holds
  ef_strip="s/$(printf '\r')\$//
1s/^$(printf '\357\273\277')//
:s
s/^[$(printf ' \t\v\f\r')]//
s/^$(printf '\302')[$(printf '\205\240')]//
s/^$(printf '\341\232\200')//
s/^$(printf '\342\200')[$(printf '\200-\212\250\251\257')]//
s/^$(printf '\342\201\237')//
s/^$(printf '\343\200\200')//
t s
/^#/d
/^\$/d"
  # runc refuses a variable holding a NUL byte (docker drops a line without '=' whose name holds one)
  ef_line=$(tr '\000' '\377' < "$1" | LC_ALL=C sed -n -e "$ef_strip" -e "/$(printf '\377')/{" -e '=' -e 'q' -e '}')
  [ -z "$ef_line" ] || die "--env-file $1: line $ef_line holds a NUL byte, which no variable can hold"
  # the name up to '=' (a line without '=' takes the variable from the environment)
  ef_names=$(tr '\000' '\377' < "$1" | LC_ALL=C sed -n -e "$ef_strip" -e '/=/!s/^/+/p' -e '/=/!d' -e 's/=.*//' \
    -e 's/^/=/p')
  # docker refuses a line whose name is empty or holds a space or a tab ("export A=1"), after run.sh's checks
  ef_bad=$(printf '%s\n' "$ef_names" | LC_ALL=C sed -n "/^=\$/p; /[$(printf ' \t')]/p" | head -n 1)
  [ "$ef_bad" != "=" ] || die "--env-file $1: a line has no name before its '='"
  # (its first word alone shown: "HF_TOKEN hf_..." lacks its '=', and what follows may be a secret)
  ef_word=${ef_bad#?}
  ef_word=${ef_word%%[$(printf ' \t')]*}
  [ -z "$ef_bad" ] || die "--env-file $1: a line whose name holds a space or a tab (it begins '$ef_word'), so no variable name (docker reads NAME=VALUE lines: no export, no space)"
  # a name run.sh sets; a line without '=' whose variable this environment lacks (docker would drop it
  # without a word, as run.sh refuses -e NAME of one)
  ef_own=$(printf '%s\n' "$ef_names" | while IFS= read -r ef_name; do
    case "${ef_name#?}" in PROFILE|PORT|MODEL_NAME|UNIBAKE_*|\
                           PATH|LD_LIBRARY_PATH|PYTHONPATH|PYTHONDONTWRITEBYTECODE|IFS|PPID|PWD|OPTIND|PS1|PS2|PS4|LINENO|SHLVL|_|OLDPWD|HOME|HOSTNAME|\
                           SHELLOPTS|BASHOPTS|RANDOM|SRANDOM|OPTERR|BASHPID|BASH_VERSION|BASH_ARGV0|HISTCMD|EPOCHSECONDS|EPOCHREALTIME|BASH_COMMAND|BASH_SUBSHELL|BASH|BASH_VERSINFO|COMP_WORDBREAKS|\
                           NVIDIA_VISIBLE_DEVICES)
      printf '%s\n' "${ef_name#?}"; break ;;
    esac
    case "$ef_name" in +*) in_env "${ef_name#+}" || { printf '+%s\n' "${ef_name#+}"; break; }
      case "${ef_name#+}" in
        [0-9]*|*[!A-Za-z0-9_]*) ef_value=$(env_value "${ef_name#+}") ;;  # (a name sh cannot read, which bash passes on)
        *) eval "ef_value=\${${ef_name#+}}" ;;
      esac
      is_utf8 "$ef_value" || { printf '%%%s\n' "${ef_name#+}"; break; } ;; esac
  done)
  case "$ef_own" in
    "") ;;
    +*) case "${ef_own#+}" in [0-9]*|*[!A-Za-z0-9_]*) ef_why=" (dash and busybox sh pass no variable of a name like it on)" ;; *) ef_why="" ;; esac
        die "--env-file $1: ${ef_own#+} (a line without '=') is not set in this environment$ef_why, so docker would drop it; set it or give ${ef_own#+}=VALUE" ;;
    %*) die "--env-file $1: ${ef_own#?} (a line without '='): its value in this environment $not_utf8; give it in UTF-8" ;;
    *) own_env "$ef_own" "--env-file $1" ;;
  esac
  ef_topo=$(printf '%s\n' "$ef_names" | grep -E '^[=+](NNODES|NODE_RANK|MASTER_ADDR|MASTER_PORT)$' | head -n 1) || :
  [ -z "$ef_topo" ] || own_env "${ef_topo#?}" "--env-file $1"
  ef_hip=$(printf '%s\n' "$ef_names" | grep -E '^[=+]HIP_VISIBLE_DEVICES$' | head -n 1) || :
  [ -z "$ef_hip" ] || own_env "${ef_hip#?}" "--env-file $1"
  # the values of the lines that number the GPUs (a line without '=' takes its value from the environment)
  ef_vis=$(tr '\000' '\377' < "$1" | LC_ALL=C sed -n -e "$ef_strip" -e '/^CUDA_VISIBLE_DEVICES=/p' \
    -e '/^CUDA_VISIBLE_DEVICES$/p' -e '/^ROCR_VISIBLE_DEVICES=/p' -e '/^ROCR_VISIBLE_DEVICES$/p' \
    -e '/^HIP_VISIBLE_DEVICES=/p' -e '/^HIP_VISIBLE_DEVICES$/p' -e '/^GPU_DEVICE_ORDINAL=/p' -e '/^GPU_DEVICE_ORDINAL$/p')
  while IFS= read -r ef_v; do
    case "$ef_v" in
      *=*) visible_devices "--env-file $1" "${ef_v%%=*}" "${ef_v#*=}" ;;
      ?*) eval "ef_value=\${$ef_v}"; visible_devices "--env-file $1, from this environment," "$ef_v" "$ef_value" ;;
    esac
  done <<EOF
$ef_vis
EOF
  env_files="$env_files $(quote "--env-file=$1")"
}

dry_run=0
name=""
profile=""
engine_args=""
env_args=""
env_names=""
env_files=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    --name|--name=*)  # (an empty one, an unset variable, would have named the container as if --name were not given)
      case "$1" in --name) [ "$#" -ge 2 ] || die "--name needs a value"; name=$2; shift ;; *) name=${1#--name=} ;; esac
      [ -n "$name" ] || die "--name given empty (an unset variable?): give a container name, or leave --name out" ;;
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
for vd_name in CUDA_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES HIP_VISIBLE_DEVICES GPU_DEVICE_ORDINAL; do
  vd_key=${vd_name%%_*}
  if eval "[ -n \"\$vd_where_$vd_key\" ]"; then
    eval "check_visible \"\$vd_where_$vd_key\" $vd_name \"\$vd_value_$vd_key\""
  fi
done
if [ -n "${PROFILE:-}" ] && [ -n "$profile" ] && [ "$PROFILE" != "$profile" ]; then
  die "PROFILE=$PROFILE and the profile argument '$profile' disagree; give one"
fi
# a variable set but empty (an unset one expanded, a fix half made) is refused, not taken as unset: MODEL_X= would
# start the engine without its weights, GPUS= on the first GPUs; a MODEL_ variable no mount is called is said
mount_vars=" MODEL_DRAFT MODEL_TARGET"  # (each a plain name)
for ev_name in GPUS PORT IMAGE MODEL_NAME $mount_vars; do
  eval "[ -z \"\${$ev_name+x}\" ] || [ -n \"\$$ev_name\" ]" \
    || die "$ev_name is set but empty (an unset variable?): give it a value, or unset it for its default"
done
# (`set`, the shell's own, lists them: a host's PATH may lack env)
for ev_name in $(set | LC_ALL=C sed -n 's/^\(MODEL_[A-Za-z0-9_]*\)=.*/\1/p'); do
  case " MODEL_NAME$mount_vars " in *" $ev_name "*) ;; *)
    echo "warning: $ev_name is set, but no mount of this release is called that (${mount_vars:+its mounts:}${mount_vars:-it has none}); it is not used" >&2 ;;
  esac
done
profile="${profile:-${PROFILE-tp4}}"  # (PROFILE set but empty: refused below, not the default)
case "$profile" in
  tp1) need=1; vendor=nvidia; nodes=1; network=bridge; ipc=host; shm=''; rdma=0; master_port=29500
    extra_devices=''; extra_groups='' ;;
  tp2) need=2; vendor=nvidia; nodes=1; network=bridge; ipc=host; shm=''; rdma=0; master_port=29500
    extra_devices=''; extra_groups='' ;;
  tp4) need=4; vendor=nvidia; nodes=1; network=bridge; ipc=host; shm=''; rdma=0; master_port=29500
    extra_devices=''; extra_groups='' ;;
  *) die "unknown profile '$profile'; known: tp1, tp2, tp4" ;;
esac
if [ -n "$topo_env" ] && [ "$nodes" -gt 1 ]; then
  die "$topo_env, which run.sh sets on profile $profile of $nodes nodes; use the variable run.sh reads (see ./run.sh --help)"
fi
if [ -n "$hip_env" ] && [ "$vendor" = hygon ]; then
  die "$hip_env, which run.sh sets on hygon profile $profile (to the GPUs of GPUS, numbered from 0); choose the GPUs with GPUS"
fi

if [ -z "$name" ]; then name="demo-llm-$profile"; fi
case "$name" in
  ?) die "the container name must be at least 2 characters (docker refuses one of 1); got '$name'" ;;
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
  [ "$count" -eq "$need" ] || die "profile $profile needs $need GPU$( [ "$need" -eq 1 ] || echo s); GPUS=$gpus names $count"
  if [ "$vis_max" -gt "$need" ]; then
    die "$vis_what, but the container of profile $profile sees only the GPUs of GPUS ($need), numbered from 0 to $((need - 1)): remove it, or number them from 0"
  fi
fi
# (GPUS=all too: the engine sees only the GPUs named, however many the container has)
if [ -n "$vis_few" ] && [ "$vis_few" -lt "$need" ]; then
  die "$vis_few_what, but profile $profile needs $need: the engine would see only those; remove it, or name $need, numbered from 0"
fi

# groups by their number on this host: the engine reads a name in the image's /etc/group, where it may be
# missing (docker: "Unable to find group render", exit 125) or another number than the group the host's
# device nodes belong to; each group once. A name this host lacks stays a name (the image's own group of
# that name, if it has one: no device node of this host belongs to it anyway)
# With ENGINE_GROUPS (name=number,...) the numbers are those given, of the engine's machine: DOCKER_HOST naming
# another machine's engine needs them, as this host's numbers are not that machine's
group_ids=""
engine_groups="${ENGINE_GROUPS:-}"
# the engine docker reaches, as docker picks it: DOCKER_HOST, else the context of DOCKER_CONTEXT, else the
# config's current one (docker context use); engine_at says which, engine_remote=1 when it is neither a unix
# socket here nor TCP to this machine's loopback (a context docker cannot show is taken as another machine's:
# its numbers are not looked up here)
engine_at=""
engine_remote=0
engine_here() {  # $1 an engine address as docker reads DOCKER_HOST: whether it is on this machine
  # unix://PATH; tcp://HOST[:PORT] (no scheme is tcp; no host is docker's 127.0.0.1) with HOST localhost, ::1
  # or 127.0.0.0/8 (a port forwarded from another machine, like a socket forwarded by ssh -L, counts as here)
  case "$1" in unix://*) return 0 ;; tcp://*) eh_host=${1#tcp://} ;; *://*) return 1 ;; *) eh_host=$1 ;; esac
  eh_host=${eh_host%%/*}
  case "$eh_host" in
    \[*\]|\[*\]:*) eh_host=${eh_host#?}; eh_host=${eh_host%%]*} ;;
    *:*:*) return 1 ;;  # (an IPv6 address without brackets: docker refuses it)
    *) eh_host=${eh_host%%:*} ;;
  esac
  case "$eh_host" in
    ""|localhost|::1|0:0:0:0:0:0:0:1) return 0 ;;
    127.*) eh_rest=${eh_host#127.}
           for eh_part in 1 2 3; do
             eh_byte=${eh_rest%%.*}
             case "$eh_byte" in ""|*[!0-9]*|0?*) return 1 ;; esac
             [ "${#eh_byte}" -le 3 ] && [ "$eh_byte" -le 255 ] || return 1
             case "$eh_part" in 3) [ "$eh_byte" = "$eh_rest" ] || return 1 ;;
                                *) case "$eh_rest" in *.*) eh_rest=${eh_rest#*.} ;; *) return 1 ;; esac ;; esac
           done ;;
    *) return 1 ;;
  esac
}
if [ "$vendor" = nvidia ] && [ -z "$extra_groups" ]; then
  :  # (no group to join, no render node to find)
elif [ -n "${DOCKER_HOST:-}" ]; then
  engine_at="DOCKER_HOST=$DOCKER_HOST"
  engine_here "$DOCKER_HOST" || engine_remote=1
else
  ec_name="${DOCKER_CONTEXT:-}"
  ec_config="${DOCKER_CONFIG:-${HOME:+$HOME/.docker}}"
  if [ -z "$ec_name" ] && [ -n "$ec_config" ] && [ -f "$ec_config/config.json" ]; then
    ec_name=$(sed -n 's/.*"currentContext"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$ec_config/config.json" 2>/dev/null | head -n 1)
  fi
  if [ -n "$ec_name" ] && [ "$ec_name" != default ]; then
    ec_host=$(docker context inspect --format '{{.Endpoints.docker.Host}}' -- "$ec_name" 2>/dev/null) || ec_host=""
    case "$ec_host" in
      "") engine_at="docker context '$ec_name' (which docker could not show here)"; engine_remote=1 ;;
      *) engine_at="docker context '$ec_name' ($ec_host)"; engine_here "$ec_host" || engine_remote=1 ;;
    esac
  fi
fi
case ",$engine_groups," in
  ,,) ;;
  *,,*|*[!a-z0-9_=,-]*) die "ENGINE_GROUPS must be groups and their numbers on the engine's machine, like video=44,render=109; got '$engine_groups'" ;;
  *) eg_names=""
     for g in $(printf '%s' "$engine_groups" | tr ',' ' '); do
       case "$g" in [a-z_]*=[0-9]*) case "${g#*=}" in *[!0-9]*) die "ENGINE_GROUPS: '$g' is not NAME=NUMBER" ;; esac ;;
                    *) die "ENGINE_GROUPS: '$g' is not NAME=NUMBER, like render=109" ;; esac
       # (the first of two would be taken, silently)
       case " $eg_names " in *" ${g%%=*} "*) die "ENGINE_GROUPS gives group ${g%%=*} twice; give each group once" ;; esac
       eg_names="$eg_names ${g%%=*}"
     done ;;
esac
host_group() {  # $1 a group name or number
  case "$1" in
    *[!0-9]*)
      if [ -n "$engine_groups" ]; then
        case ",$engine_groups," in
          *",$1="*) hg_gid=",$engine_groups,"; hg_gid=${hg_gid#*",$1="}; hg_gid=${hg_gid%%,*} ;;
          *) die "ENGINE_GROUPS gives no number for group $1, which profile $profile joins; add $1=NUMBER (getent group $1 on the engine's machine)" ;;
        esac
      else
        case "$engine_remote" in
          0) ;;
          *) hg_names=""
             for hg in $(case "$vendor" in amd|hygon) echo video ;; esac) $extra_groups; do
               case "$hg" in *[!0-9]*) case ",$hg_names," in *",$hg="*) ;; *) hg_names="${hg_names:+$hg_names,}$hg=NUMBER" ;; esac ;; esac
             done
             die "$engine_at names another machine's engine, and profile $profile joins groups whose numbers there run.sh cannot look up; give ENGINE_GROUPS=$hg_names (getent group on that machine)" ;;
        esac
        hg_gid=$( (getent group "$1" 2>/dev/null || grep "^$1:" /etc/group 2>/dev/null) | head -n 1 | cut -d: -f3)
        case "$hg_gid" in ""|*[!0-9]*) hg_gid=$1 ;; esac
      fi ;;
    *) hg_gid=$1 ;;
  esac
  # runc takes a group number up to 2147483647 ("Unable to find group" past it, docker's exit 125)
  case "$hg_gid" in *[!0-9]*) ;; *)
    hg_n=$(printf '%s' "$hg_gid" | sed -e 's/^0*//' -e 's/^$/0/')
    if [ "${#hg_n}" -gt 10 ] || { [ "${#hg_n}" -eq 10 ] && [ "$hg_n" -gt 2147483647 ]; }; then
      case "$1" in
        *[!0-9]*) die "group $1 is number $hg_gid $([ -n "$engine_groups" ] && echo in ENGINE_GROUPS || echo on this host), past the 2147483647 docker's runtime takes: the container cannot join it (docker would fail the start with 'Unable to find group')" ;;
        *) die "profile $profile's group $1 is past the 2147483647 docker's runtime takes (docker would fail the start with 'Unable to find group')" ;;
      esac
    fi ;;
  esac
  case " $group_ids " in *" $hg_gid "*) ;; *) group_ids="${group_ids:+$group_ids }$hg_gid" ;; esac
}

# GPU N as ROCm numbers it (rocm-smi, HIP): the Nth GPU node of the kernel's KFD topology, whose render node is
# its drm_render_minor; not always renderD(128+N): a BMC's or an integrated GPU's render node may come first.
# Read on this host; with DOCKER_HOST or a docker context naming another machine's engine, or no topology here, 128+N
kfd_nodes=/sys/class/kfd/kfd/topology/nodes
render_node() {  # $1 a GPU number: its render node's minor number in rn_minor
  rn_minor=$((128 + $1))
  [ "$engine_remote" -eq 0 ] || return 0
  [ -d "$kfd_nodes" ] || return 0
  rn_i=0
  for rn_node in $(ls "$kfd_nodes" | sort -n); do
    rn_gpu=$(cat "$kfd_nodes/$rn_node/gpu_id" 2>/dev/null) || continue
    case "$rn_gpu" in ""|0|*[!0-9]*) continue ;; esac  # a CPU's node
    if [ "$rn_i" -eq "$1" ]; then
      rn_minor=$(sed -n 's/^drm_render_minor //p' "$kfd_nodes/$rn_node/properties" 2>/dev/null | head -n 1)
      [ -n "$rn_minor" ] || die "GPUS: GPU $1 has no render node in $kfd_nodes/$rn_node/properties"
      # a render node's minor number as the kernel gives them: 128 to 191, past 191 on a kernel of more DRM
      # devices, at most 2^20-1 (a plain number: 0128 or 12x would name a device node no kernel makes)
      case "$rn_minor" in *[!0-9]*|0*) rn_bad=1 ;; *) rn_bad=0 ;; esac
      if [ "$rn_bad" -eq 1 ] || [ "${#rn_minor}" -gt 7 ] || [ "$rn_minor" -lt 128 ] || [ "$rn_minor" -gt 1048575 ]; then
        die "GPUS: GPU $1's drm_render_minor in $kfd_nodes/$rn_node/properties is '$rn_minor', not a render node's number (128 to 1048575)"
      fi
      return 0
    fi
    rn_i=$((rn_i + 1))
  done
  die "GPUS names GPU $1, but this host has $rn_i GPUs, numbered from 0 (its KFD topology, as rocm-smi shows them)"
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
      for g in $(printf '%s' "$gpus" | tr ',' ' '); do render_node "$g"; set -- "$@" --device "/dev/dri/renderD$rn_minor"; done
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
if [ -n "${MODEL_NAME:-}" ]; then
  is_utf8 "$MODEL_NAME" || die "MODEL_NAME $not_utf8; give it in UTF-8"
  set -- "$@" -e MODEL_NAME="$MODEL_NAME"
fi
if [ -n "${MODEL_DRAFT:-}" ]; then
  case "${MODEL_DRAFT}" in /*) ;; *) die "MODEL_DRAFT must be an absolute path on this host; got '${MODEL_DRAFT}'" ;; esac
  case "${MODEL_DRAFT}" in *:*|*,*|*\"*|*[[:cntrl:]]*) die "MODEL_DRAFT must not hold ':', ',', '\"' or a control character; got '${MODEL_DRAFT}'" ;; esac
  ! has_c1 "${MODEL_DRAFT}" || die "MODEL_DRAFT must not hold ':', ',', '\"' or a control character; got '${MODEL_DRAFT}'"
  is_utf8 "${MODEL_DRAFT}" || die "MODEL_DRAFT $not_utf8, so the engine would look for another folder; got '${MODEL_DRAFT}'"
  # --mount, not -v: a source that does not exist is an error (-v would make an empty folder of it and
  # start the engine without its weights)
  set -- "$@" --mount "type=bind,source=${MODEL_DRAFT},target=/models/draft,readonly"
fi
if [ -n "${MODEL_TARGET:-}" ]; then
  case "${MODEL_TARGET}" in /*) ;; *) die "MODEL_TARGET must be an absolute path on this host; got '${MODEL_TARGET}'" ;; esac
  case "${MODEL_TARGET}" in *:*|*,*|*\"*|*[[:cntrl:]]*) die "MODEL_TARGET must not hold ':', ',', '\"' or a control character; got '${MODEL_TARGET}'" ;; esac
  ! has_c1 "${MODEL_TARGET}" || die "MODEL_TARGET must not hold ':', ',', '\"' or a control character; got '${MODEL_TARGET}'"
  is_utf8 "${MODEL_TARGET}" || die "MODEL_TARGET $not_utf8, so the engine would look for another folder; got '${MODEL_TARGET}'"
  # --mount, not -v: a source that does not exist is an error (-v would make an empty folder of it and
  # start the engine without its weights)
  set -- "$@" --mount "type=bind,source=${MODEL_TARGET},target=/models/target,readonly"
fi
# the files first, then each -e: the engine takes the last value of a name
if [ -n "$env_files$env_args" ]; then eval "set -- \"\$@\" $env_files $env_args"; fi
set -- "$@" "$IMAGE"
image_at=$#  # (the words after it are the engine's)
if [ -n "$engine_args" ]; then eval "set -- \"\$@\" serve $engine_args"; fi
ea_i=0
for word in "$@"; do  # (the engine's arguments; run.sh checked its own words above)
  ea_i=$((ea_i + 1))
  # (named by its place, not shown: it may be a secret, --api-key's, which --dry-run hides)
  [ "$ea_i" -le "$image_at" ] || is_utf8 "$word" \
    || die "the engine's argument $((ea_i - image_at - 1)) (counted after the profile) $not_utf8; give it in UTF-8"
done

if [ "$dry_run" -eq 1 ]; then
  # the value of a -e NAME=VALUE whose NAME says it is a secret (TOKEN, SECRET, PASSWORD, API_KEY, ... as unibake's
  # sanitiser reads names) shown as <hidden>: a dry run's line is pasted into tickets and logs; so is the value of
  # an engine's option whose name says so, its '-' read as '_' (--api-key sk-..., --hf-token=...), or of its NAME=VALUE
  secret_name() {  # $1 a variable's or an option's name
    sn_name=$(printf '%s' "$1" | tr '[:lower:]-' '[:upper:]_' | sed -e 's/TOKENS/#/g' -e 's/TOKENI[SZ]/#/g')
    case "$sn_name" in
      *PASSWORD*|*PASSWD*|*PASSPHRASE*|*SECRET*|*TOKEN*|*CREDENTIAL*|*APIKEY*|*API_KEY*|*PRIVATEKEY*|\
      *PRIVATE_KEY*|PWD|*_PWD|PASS|*_PASS|AUTH|AUTH_*|*_AUTH|*_AUTH_*|*AUTHORIZATION|*AUTHORISATION|*_KEY|\
      *CONNSTR|*CONN_STR|*CONNSTRING|*CONN_STRING|*CONNECTIONSTR|*CONNECTION_STR|*CONNECTIONSTRING|\
      *CONNECTION_STRING) return 0 ;;
    esac
    return 1
  }
  out=""
  dr_i=0
  dr_prev=""
  dr_hide=0
  for word in "$@"; do
    dr_i=$((dr_i + 1))
    if [ "$dr_prev" = -e ] && [ "$dr_i" -lt "$image_at" ]; then  # (before the image: run.sh's own -e, not the engine's)
      case "$word" in ?*=?*) if secret_name "${word%%=*}"; then word="${word%%=*}=<hidden>"; fi ;; esac
    elif [ "$dr_i" -gt "$image_at" ]; then  # the engine's: --api-key VALUE, --api-key=VALUE, HF_TOKEN=VALUE
      case "$dr_hide$word" in 1|1-*) ;; 1*) word="<hidden>" ;; esac  # (no value, or the next option: none taken)
      dr_hide=0
      case "$word" in
        -?*) dr_opt=${word#-}; dr_opt=${dr_opt#-}
             if [ -n "${dr_opt%%=*}" ] && secret_name "${dr_opt%%=*}"; then
               case "$word" in *=?*) word="${word%%=*}=<hidden>" ;; *=) ;; *) dr_hide=1 ;; esac
             fi ;;
        [A-Za-z_]*=?*) case "${word%%=*}" in *[!A-Za-z0-9_]*) ;; *)  # (as for the engine's own -e)
                         if secret_name "${word%%=*}"; then word="${word%%=*}=<hidden>"; fi ;; esac ;;
      esac
    fi
    dr_prev=$word
    word=$(shell_word "$word" 2>/dev/null) || word=$(quote "$dr_prev" | unprintable)
    out="${out:+$out }$word"
  done
  printf '%s\n' "$out"
  exit 0
fi
# docker itself (the shell would say "exec: docker: not found", with no error line)
if ! command -v docker >/dev/null 2>&1; then
  printf '%s\n' "error: docker is not on PATH: install Docker Engine's client (./run.sh --dry-run prints the command)" >&2
  exit 127
fi
# (tried in a subshell first: bash as sh stops at an exported read-only variable it cannot set back, SHELLOPTS
# or BASHOPTS given in the environment; bash itself only says so. There the read-only ones, which run.sh never
# set, are left out: bash writes each variable on a line of its own, a newline in a value as $'\n')
if ! (eval "$env_at_start") 2>/dev/null; then
  ro_names=$(readonly -p | sed -n 's/^[a-z]* \(-[A-Za-z]* \)\{0,1\}\([A-Za-z_][A-Za-z0-9_]*\).*/\2/p' | tr '\n' '|')
  env_at_start=$(printf '%s\n' "$env_at_start" | grep -v -E "^(export|declare -[A-Za-z]*) (${ro_names%|})(=|\$)")
fi
if (eval "$env_at_start") 2>/dev/null; then eval "$env_at_start" 2>/dev/null || :; fi
exec "$@"
