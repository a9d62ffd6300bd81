#!/bin/sh
# Verify a downloaded release with nothing but POSIX sh, coreutils, grep, sed, awk, tar (GNU or busybox:
# --to-command), gzip (for layers saved gzip-compressed), zstd and docker (gpgv or minisign for --key).
# What is loaded is exactly what was checked:
#   1. SHA256SUMS is well formed (plain file names of this folder, each once) and every file it
#      lists is a regular file here; nothing it does not list is read, and a file named like the
#      archive that it does not list fails
#   2. sha256sum -c SHA256SUMS
#   3. the archive (the .tar.zst, or its parts in order, as listed) decompresses, and holds one
#      image in our canonical form: plain tar entries only (each header where its listing puts it,
#      read as the engine reads it, and two zero blocks after the last: no extended header or header
#      field another tar reads otherwise), the release's tag only, nothing that nothing
#      refers to; every blob's sha256 is its name, and each layer is in it (a hotfix's left-out
#      layers aside) and is the one manifest.json records
#      (manifest.json, the SBOM and the provenance are read in the one form unibake writes them, json.dumps
#      with indent 2; the SBOM's subject is the release's image, the provenance's subjects its image and files)
#   4. zstd -dc | docker load, refused first if the engine's tag already names another image
#   5. the loaded image ID equals the one in IMAGE_ID; if not (or the load fails, or the archive
#      changed while it was loaded), what the load tagged and added is undone
# With --key PUBKEY, the signature of SHA256SUMS comes first (gpgv for an armoured OpenPGP public
# key, minisign for a minisign public key): absent, wrong, or made by a revoked key, nothing else is read.
# A provenance.intoto.json.asc (.minisig with a minisign key) beside it must be a good signature of the
# provenance by the same key too, as build.py verify checks it.
# A SHA256SUMS.asc may hold other signatures beside the key's good one (co-signers whose keys are not
# given); a minisign trusted comment in unibake's form ("PRODUCT RELEASE SHA256SUMS") must name the
# release manifest.json says this is.
# Usage: scripts/verify-release.sh RELEASE_DIR [--no-load] [--key PUBKEY]
# Exit: 0 all passed; 3 a check failed (a signature absent or wrong too); 2 bad usage; 1 a tool it
# needs is missing, or no engine answers; 130 interrupted.
# A hotfix's apply.sh carries this script, as it was when the release was made, and runs it on its folder.
set -eu
# first thing: a signal at any point is exit 130 (before this line, the shell dies of it: 143 for TERM),
# and the work folder, once made, is removed
work=
trap '[ -z "$work" ] || rm -rf "$work"' EXIT
trap 'exit 130' HUP INT TERM
# only absolute PATH entries: an empty one (a PATH that starts or ends with ':', or holds '::'), '.' or
# another relative one would run the release folder's own files as the checks once the script is in it
if [ -n "${PATH+set}" ]; then
  path=$PATH:
  PATH=
  while [ -n "$path" ]; do
    case "${path%%:*}" in /*) PATH=${PATH:+$PATH:}${path%%:*} ;; esac
    path=${path#*:}
  done
fi
unset CDPATH  # which would take "cd RELEASE_DIR" (a relative name) to a folder of that name elsewhere
# options the tools read from the environment (GNU tar's TAR_OPTIONS=-v lists and extracts otherwise,
# an older grep takes GREP_OPTIONS, gzip GZIP): each tool runs as this script calls it
unset TAR_OPTIONS GREP_OPTIONS GZIP

usage() { echo "error: usage: verify-release.sh RELEASE_DIR [--no-load] [--key PUBKEY]" >&2; exit 2; }
case "${1:-}" in -h|--help) sed -n '2,/^set -eu$/p' < "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
# A line that may hold what the folder says (a file name, a manifest.json value) is printed with printf,
# not echo (dash's reads '\033' and '\c' in it), and each control byte as '?': an escape sequence would
# reach the terminal (hide the lines after it), a newline would print a line the script never wrote; so is
# each character a terminal shows as nothing or as another order of the text around it (UTF-8's C1
# controls, the bidi embeddings, overrides, isolates and marks, the line separators, the zero-width ones,
# the byte-order mark, the tag characters): a name "run<U+202E>hs.txt" would read "runtxt.sh"
hidden=$(printf 's/\302[\200-\237\255]/?/g; s/\330\234/?/g; s/\341\240\216/?/g; s/\342\200[\213\216\217\250-\256]/?/g; s/\342\201[\240-\244\246-\257]/?/g; s/\357\273\277/?/g; s/\357\277[\271-\273]/?/g; s/\363\240[\200\201][\200-\277]/?/g')
# Text that is not UTF-8 has each byte above 127 shown as '?' too: a lone 0x9b byte is CSI to a terminal that
# takes 8-bit controls (a name "x<9b>2Jy" cleared the screen); no iconv to tell: always so
utf8_only() {
  t=$(cat; echo .); t=${t%.}
  if printf '%s' "$t" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1; then printf '%s' "$t"
  else printf '%s' "$t" | LC_ALL=C tr '\200-\377' '?'; fi
}
shown() { { printf '%s' "$*" | tr '\001-\037\177' '?'; echo; } | LC_ALL=C sed "$hidden" | utf8_only; }
# a file of lines another program wrote (gpgv's, minisign's: a key's user ID, a trusted comment), shown alike
shown_lines() { tr '\001-\011\013-\037\177' '?' < "$1" | LC_ALL=C sed "$hidden" | utf8_only; }
fail() { shown "error: $*" >&2; exit 3; }

[ "$#" -ge 1 ] || usage
dir=$1
shift
load=1
key=
# the release a hotfix's apply.sh was written for, set by its engine checks (run in this shell, after the
# signature's): another release's folder, in whole and consistent, is refused before anything is loaded
expect_image= expect_tag=
while [ "$#" -gt 0 ]; do
  case "$1" in
    --no-load) load=0; shift ;;
    --key) [ "$#" -ge 2 ] || usage
      # an unset variable (--key "$PUBKEY") would otherwise mean no signature check at all
      [ -n "$2" ] || { echo "error: --key given empty (an unset variable?): give a value, or leave it out" >&2; exit 2; }
      # a second key would replace the first unsaid: the one asked to be checked would not be
      [ -z "$key" ] || { echo "error: --key given twice: one public key is checked per run; run the script once for each key" >&2; exit 2; }
      key=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ -d "$dir" ] || { printf '%s\n' "error: $dir: not a folder" >&2; exit 2; }
# (a trailing slash, which a shell's completion adds, dropped: the errors name "DIR/IMAGE_ID", not "DIR//IMAGE_ID")
while :; do case "$dir" in */) [ "$dir" != / ] || break; dir=${dir%/} ;; *) break ;; esac; done
case "$dir" in -*) dir=./$dir ;; esac  # cd takes "-" for $OLDPWD, "-P" for an option
if [ -n "$key" ]; then
  [ -f "$key" ] || { if [ -e "$key" ]; then what="not a regular file; give the publisher's public key"; else what="no such file"; fi
    printf '%s\n' "error: --key $key: $what" >&2; exit 2; }
  key=$(cd -- "$(dirname -- "$key")" && pwd)/$(basename -- "$key")
fi
# every tool first: one missing would otherwise read as a corrupted release ("does not decompress")
need="awk cat cmp comm cut dd grep gzip head mkdir mkfifo mktemp od paste rm sed sha256sum sort tail tar tee tr uniq wc zstd"
[ "$load" = 0 ] || need="$need docker"
if [ -n "$key" ]; then
  if grep -q -- "-----BEGIN PGP PUBLIC KEY BLOCK-----" "$key"; then need="$need gpg gpgv"
  elif head -n 1 "$key" | grep -q "^untrusted comment:"; then need="$need minisign"; fi
fi
for tool in $need; do
  command -v "$tool" >/dev/null 2>&1 \
    || { echo "error: $tool is not installed here; ${0##*/} needs it (see its --help)" >&2; exit 1; }
done
sha256sum --strict --version >/dev/null 2>&1 \
  || { echo "error: this sha256sum takes no --strict (busybox's?); ${0##*/} needs coreutils' sha256sum" >&2; exit 1; }
# the work folder made before the cd, and named from /: a relative TMPDIR would otherwise be read in the
# release folder, where a link of that name puts it wherever the folder's maker likes
work=$(mktemp -d)  # (an interrupt stops the script: a trap that returns would go on without it)
case "$work" in /*) ;; *) work=$PWD/$work ;; esac
cd "$dir"
LIMIT=1048576  # SHA256SUMS and a signature: at most 1 MiB each, as unibake's own verifier reads them
copy() {  # $1: a regular file here (not a link, FIFO or folder) of at most $3 (LIMIT) bytes, copied once to $2
  [ -f "$1" ] && [ ! -L "$1" ] || return 1
  # read at most the limit + 1 bytes (busybox's wc counts a huge sparse file slowly, and wraps at 4 GiB)
  head -c $((${3:-$LIMIT} + 1)) -- "$1" > "$2"
  [ "$(wc -c < "$2")" -le "${3:-$LIMIT}" ] || fail "$dir/$1: more than ${3:-$LIMIT} bytes; not a release's $1"
}
# one there that copy() does not read (a link, a folder, a FIFO) is named as that, not as missing
here() { [ -e "$1" ] || [ -L "$1" ]; }
# SHA256SUMS is read once: the copy the signature is checked on is the one every step reads
copy SHA256SUMS "$work/sums" || { ! here SHA256SUMS || fail "$dir/SHA256SUMS: not a regular file (a link?): not a release's SHA256SUMS"
  fail "$dir/SHA256SUMS is missing: not a complete release folder"; }

# --- 0. the signature, before anything else --------------------------------------------------
if [ -n "$key" ]; then
  # the key read once, at most LIMIT bytes, as build.py verify reads it: a huge file is no key (grep and
  # head would read a sparse one for hours)
  head -c $((LIMIT + 1)) -- "$key" > "$work/key"
  [ "$(wc -c < "$work/key")" -le "$LIMIT" ] || { printf '%s\n' "error: --key $key: more than $LIMIT bytes; not a public key" >&2; exit 2; }
  secret='^-----BEGIN \([A-Z0-9]\{1,\} \)*PRIVATE KEY\( BLOCK\)\{0,1\}-----'"$(printf '\r')"'\{0,1\}$'
  if grep -q -- "-----BEGIN PGP PUBLIC KEY BLOCK-----" "$work/key"; then
    # (gpg --dearmor takes a secret block as a key too; gpgv then refuses every signature, in its own words)
    ! grep -q "$secret" "$work/key" || { printf '%s\n' "error: --key $key: holds a secret key besides the public one; give the public key alone" >&2; exit 2; }
    echo "== gpgv SHA256SUMS.asc SHA256SUMS"
    copy SHA256SUMS.asc "$work/sums.asc" || { ! here SHA256SUMS.asc || fail "$dir/SHA256SUMS.asc: not a regular file (a link?): not a signature"
      [ ! -e SHA256SUMS.minisig ] || fail "$dir: SHA256SUMS has no SHA256SUMS.asc; it has SHA256SUMS.minisig: give the publisher's minisign public key"
      fail "$dir: SHA256SUMS is not signed (no SHA256SUMS.asc)"; }
    gpg --batch --quiet --homedir "$work" --dearmor --output "$work/publisher.gpg" "$work/key" \
      || { printf '%s\n' "error: --key $key: gpg cannot read it" >&2; exit 2; }
    # one primary key: gpgv takes any key of its keyring (an attacker's beside the publisher's would sign);
    # counted in that keyring, which --dearmor makes of every armoured block (--show-keys on the file
    # reads a block headed PGP ARMORED FILE as no key), and only if gpg could read all of it
    if gpg --batch --quiet --homedir "$work" --with-colons --show-keys "$work/publisher.gpg" > "$work/keys" 2>/dev/null
    then keys=$(grep -c '^pub:' "$work/keys" || true); else keys=; fi
    [ "$keys" = 1 ] || { printf '%s\n' "error: --key $key: holds ${keys:-no} OpenPGP keys (gpg 2.2.8 or later counts them); give the publisher's key alone" >&2; exit 2; }
    detached() {  # $1 (the file signed) for the message; $2: its signature. Each packet at its top level must be a
      # signature, at most 16 (one a signer), as gpg --detach-sign writes it: gpgv checks every signature a file holds,
      # inside a compressed packet too (100 000 copies of one good signature in 40 kB: minutes; in 1 MiB: hours), as
      # build.py verify reads it (RFC 4880 4.2: a tag, then a length of 1, 2 or 5 bytes, or of 1, 2 or 4 in the old form)
      name=$1
      rm -f "$work/signature.bin"
      if grep -q -- "-----BEGIN PGP" "$2"; then
        gpg --batch --quiet --homedir "$work" --dearmor --output "$work/signature.bin" "$2" 2>/dev/null \
          || fail "$dir: $name.asc is not a detached signature: its armour cannot be read"
      else cp "$2" "$work/signature.bin"; fi
      size=$(wc -c < "$work/signature.bin") at=0 count=0
      while [ "$at" -lt "$size" ]; do
        set -- $(od -An -tu1 -v -j "$at" -N 6 "$work/signature.bin") 0 0 0 0 0 0
        [ "$1" -ge 128 ] || fail "$dir: $name.asc is not a detached signature: byte $at begins no OpenPGP packet"
        if [ "$1" -ge 192 ]; then
          tag=$(($1 - 192))
          if [ "$2" -lt 192 ]; then head=2 length=$2
          elif [ "$2" -lt 224 ]; then head=3 length=$(( ($2 - 192) * 256 + $3 + 192 ))
          elif [ "$2" -eq 255 ]; then head=6 length=$(( (($3 * 256 + $4) * 256 + $5) * 256 + $6 ))
          else fail "$dir: $name.asc is not a detached signature: a packet of partial lengths, which no signature has"; fi
        else
          tag=$(( ($1 - 128) / 4 ))
          case $(( $1 % 4 )) in
            0) head=2 length=$2 ;;
            1) head=3 length=$(( $2 * 256 + $3 )) ;;
            2) head=5 length=$(( (($2 * 256 + $3) * 256 + $4) * 256 + $5 )) ;;
            *) fail "$dir: $name.asc is not a detached signature: a packet that runs to the end of the file, which no signature has" ;;
          esac
        fi
        [ "$tag" = 2 ] || fail "$dir: $name.asc is not a detached signature: a packet of type $tag at byte $at"
        count=$((count + 1))
        [ "$count" -le 16 ] || fail "$dir: $name.asc is not a detached signature: more than 16 signatures"
        at=$((at + head + length))
      done
      [ "$count" -gt 0 ] || fail "$dir: $name.asc is not a detached signature: no signature in it"
    }
    gpg_checked() {  # $1 (the file signed: SHA256SUMS, the provenance) as $2 holds it, against the signature $3 holds
      detached "$1" "$3"
      # a good signature (GOODSIG, or EXPKEYSIG: by a key that has expired (a warning: gpgv cannot tell whether it signed before or after)) and VALIDSIG;
      # gpgv exits 0 for a revoked key's signature too, so REVKEYSIG is looked for, not the exit status
      gpgv --homedir "$work" --status-fd 3 --keyring "$work/publisher.gpg" "$3" "$2" \
        3> "$work/gpgv.status" 2> "$work/gpgv.err" && gpgv=0 || gpgv=$?
      shown_lines "$work/gpgv.err" >&2  # (a co-signer's user ID is the folder's to choose)
      if grep -q '^\[GNUPG:\] REVKEYSIG ' "$work/gpgv.status"; then
        fail "$dir: $1.asc was made by a key that has been revoked ($key)"
      fi
      if grep -q '^\[GNUPG:\] EXPSIG ' "$work/gpgv.status"; then fail "$dir: $1.asc is a signature that has expired"; fi
      # each signature of the file (NEWSIG begins one) is good, or one a co-signer made whose key was not
      # given (ERRSIG code 9: gpgv exits 2 for it alone); at least one is good
      awk -v rc="$gpgv" '$1 != "[GNUPG:]" { next } $2 == "NEWSIG" { if (seen) n++; seen = 1 } !n { n = 1 }
        $2 == "GOODSIG" || $2 == "EXPKEYSIG" { good[n] = 1 } $2 == "VALIDSIG" { valid[n] = 1 } $2 == "BADSIG" { bad[n] = 1 }
        $2 == "ERRSIG" && $8 == "9" { nokey[n] = 1 }
        END { for (i = 1; i <= n; i++) { if (good[i] && valid[i] && !bad[i]) ok++; else if (nokey[i] && !good[i] && !valid[i] && !bad[i]) other++; else exit 1 }
              exit !(ok && (rc == 0 || other)) }' "$work/gpgv.status" \
        || fail "$dir: $1.asc is not a good signature of $1 by $key"
      if grep -q '^\[GNUPG:\] EXPKEYSIG ' "$work/gpgv.status"; then
        echo "warning: $1.asc is good, but the key that made it has expired: ask the publisher" >&2
      fi
    }
    gpg_checked SHA256SUMS "$work/sums" "$work/sums.asc"
    # a provenance the key signed too is checked as build.py verify checks it (SHA256SUMS lists it and its
    # signature): a bad signature of it fails, whatever its sum says
    if [ -f provenance.intoto.json.asc ]; then
      echo "== gpgv provenance.intoto.json.asc provenance.intoto.json"
      copy provenance.intoto.json.asc "$work/provenance.asc" || fail "$dir/provenance.intoto.json.asc: not a regular file (a link?): not a signature"
      copy provenance.intoto.json "$work/provenance.signed" 67108864 || fail "$dir/provenance.intoto.json: not a regular file, which its signature provenance.intoto.json.asc signs"
      gpg_checked provenance.intoto.json "$work/provenance.signed" "$work/provenance.asc"
    fi
  elif head -n 1 "$work/key" | grep -q "^untrusted comment:" && sed -n "2{s/$(printf '\r')*\$//;p;}" "$work/key" \
      | grep -qx 'RW[QRST][A-Za-z0-9+/]\{53\}'; then  # a comment, then an Ed25519 key: 42 bytes in base64, from "Ed" (only carriage
    # returns trimmed from its end, as minisign reads it), as build.py verify reads it
    # each file minisign checks is a copy under the release's own name, checked there: minisign's own
    # messages ("Signature key id in SHA256SUMS.minisig is ...") name the release's files, not the copies
    mkdir "$work/minisign"
    minisign_checked() {  # $1 (SHA256SUMS, the provenance) against $1.minisig, both copied into $work/minisign
      (cd "$work/minisign" && minisign -V -p "$work/key" -m "$1" -x "$1.minisig") > "$work/minisign.out" \
        || { shown_lines "$work/minisign.out"; fail "$dir: $1.minisig is not a good signature of $1 by $key"; }
      shown_lines "$work/minisign.out"
    }
    echo "== minisign -Vm SHA256SUMS"
    cp "$work/sums" "$work/minisign/SHA256SUMS"
    copy SHA256SUMS.minisig "$work/minisign/SHA256SUMS.minisig" || { ! here SHA256SUMS.minisig || fail "$dir/SHA256SUMS.minisig: not a regular file (a link?): not a signature"
      [ ! -e SHA256SUMS.asc ] || fail "$dir: SHA256SUMS has no SHA256SUMS.minisig; it has SHA256SUMS.asc: give the publisher's OpenPGP public key"
      fail "$dir: SHA256SUMS is not signed (no SHA256SUMS.minisig)"; }
    minisign_checked SHA256SUMS
    # its trusted comment, compared with manifest.json below when it is in unibake's form
    sed -n 's/^Trusted comment: //p' "$work/minisign.out" | head -n 1 > "$work/comment"
    # a provenance the key signed too is checked as build.py verify checks it (its trusted comment too)
    if [ -f provenance.intoto.json.minisig ]; then
      echo "== minisign -Vm provenance.intoto.json"
      copy provenance.intoto.json.minisig "$work/minisign/provenance.intoto.json.minisig" || fail "$dir/provenance.intoto.json.minisig: not a regular file (a link?): not a signature"
      copy provenance.intoto.json "$work/minisign/provenance.intoto.json" 67108864 || fail "$dir/provenance.intoto.json: not a regular file, which its signature provenance.intoto.json.minisig signs"
      minisign_checked provenance.intoto.json
      sed -n 's/^Trusted comment: //p' "$work/minisign.out" | head -n 1 > "$work/provenance.comment"
    fi
  else  # a file that is no public key is bad usage, not a bad signature of the release
    if head -n 1 "$work/key" | grep -q "^untrusted comment:" && sed -n '2{s/^[[:space:]]*//;s/[[:space:]]*$//;p;}' "$work/key" \
        | grep -qx 'RW[QRST][A-Za-z0-9+/]\{53\}'; then
      printf '%s\n' "error: --key $key: its key line (line 2) has blanks around it, which minisign does not take: remove them" >&2
      exit 2
    fi
    # a secret key by its armour line or minisign's comment line (not by the words anywhere: a README)
    if grep -q "$secret" "$work/key" \
        || head -n 1 "$work/key" | grep -q '^untrusted comment:.*secret key'; then
      printf '%s\n' "error: --key $key: this is a secret key; give the public one" >&2
      exit 2
    fi
    printf '%s\n' "error: --key $key: neither an armoured OpenPGP public key nor a minisign public key" >&2
    exit 2
  fi
fi

NAME='[A-Za-z0-9_][A-Za-z0-9_.+-]\{0,254\}'
HEX='[0-9a-fA-F]\{64\}'

# (a hotfix's apply.sh runs its own engine checks here, once the signature is good: keep the next line as it is)
# --- 1. SHA256SUMS, read as unibake's own verifier reads it -----------------------------------
# a NUL byte makes grep call the file binary and keep its lines to itself: refused first
tr -d '\000' < "$work/sums" | cmp -s - "$work/sums" || fail "$dir/SHA256SUMS: holds a NUL byte"
if grep -n "$(printf '\r')" "$work/sums" >/dev/null; then fail "$dir/SHA256SUMS: a carriage return ends a line"; fi
bad=$(grep -n -v -e "^$HEX [ *]$NAME\$" -e "^SHA256 ($NAME) = $HEX\$" "$work/sums" | head -n 1 || true)
[ -z "$bad" ] || fail "$dir/SHA256SUMS:${bad%%:*}: not a 'sha256  name' line of a file of this folder"
sed -e "s/^$HEX [ *]//" -e 's/^SHA256 (\(.*\)) = .*$/\1/' "$work/sums" > "$work/names"
[ -s "$work/names" ] || fail "$dir/SHA256SUMS lists nothing"
twice=$(sort "$work/names" | uniq -d | head -n 1)
[ -z "$twice" ] || fail "$dir/SHA256SUMS: '$twice' is listed twice"
# (a last line without its newline is read too: read fails on it, having set name)
while IFS= read -r name || [ -n "$name" ]; do
  case "$name" in .|..) fail "$dir/SHA256SUMS: '$name' is not a file of this folder" ;; esac
  [ -e "$name" ] || [ -L "$name" ] || fail "$dir/$name: missing (listed in SHA256SUMS)"
  [ -f "$name" ] && [ ! -L "$name" ] || fail "$dir/$name: not a regular file"
done < "$work/names"
for needed in IMAGE_ID manifest.json; do
  grep -qx "$needed" "$work/names" || fail "$dir/SHA256SUMS does not list $needed: not a complete release folder"
done

# each listed file's sha256, as SHA256SUMS lists it: "NAME DIGEST"
sed -e "s/^\($HEX\) [ *].*\$/\1/" -e 's/^SHA256 (.*) = \(.*\)$/\1/' "$work/sums" | tr A-F a-f |
  paste -d ' ' "$work/names" - > "$work/listed"

echo "== sha256sum -c SHA256SUMS"
sha256sum --strict -c "$work/sums" || fail "$dir: files differ from SHA256SUMS (see the lines above)"
# Everything read after this is read as it was checked: IMAGE_ID and manifest.json from copies whose
# sha256 is checked again, the archive hashed on every read (a file changed after sha256sum -c,
# between two reads, or while it is loaded would otherwise be read as something never checked)
# (VALIDATION.json too when SHA256SUMS lists it: whether the smoke gates ran, warned of below)
metas="IMAGE_ID manifest.json"
! grep -qx VALIDATION.json "$work/names" || metas="$metas VALIDATION.json"
# (IMAGE_ID at most 1 KiB, as build.py verify reads it: more is no image ID)
for meta in $metas; do
  limit=16777216; [ "$meta" != IMAGE_ID ] || limit=1024
  copy "$meta" "$work/$meta" "$limit" || fail "$dir/$meta: not a regular file"
  [ "$(sha256sum < "$work/$meta" | cut -c 1-64)" = "$(awk -v n="$meta" '$1 == n { print $2 }' "$work/listed")" ] \
    || fail "$dir/$meta: changed after sha256sum -c read it: refused"
done

# --- what the release says it is --------------------------------------------------------------
# manifest.json is read line by line, each key as unibake writes it (two spaces a level): a key
# written twice, which JSON readers take either of (this script the first, unibake's verifier
# refuses it), is refused among the top-level keys and those of "archive" and "hotfix"
twice=$(awk '/^  "[^"]*": / { match($0, /"[^"]*"/); key = substr($0, RSTART, RLENGTH); print key }
  /^  "(archive|hotfix)": \{$/ { block = key; next } /^  [}]/ { block = "" }
  block != "" && /^    "[^"]*": / { match($0, /"[^"]*"/); print block "." substr($0, RSTART, RLENGTH) }' \
  "$work/manifest.json" | sort | uniq -d | head -n 1)
[ -z "$twice" ] || fail "$dir/manifest.json: the key $twice is written twice: not a manifest unibake writes"
# and each line one element as unibake writes it (json.dumps, two spaces a level): a key read by its line
# is then the JSON key of that depth (written two on a line, or a top-level key indented as a label's,
# it would be another value than the one JSON readers, build.py verify among them, take)
# (each string JSON: an escape JSON has, no control character; each number JSON's, no leading zero), a key
# twice in one object refused however it is written ("t\u0061g" is "tag" to JSON readers; a byte not
# ASCII in a key, which unibake writes escaped, is refused). Each value is in the one form json.dumps
# writes it, as build.py verify requires too: ASCII only, an escape only where json.dumps writes one
# ("linux\/amd64" and "\u0061" are another text for the same value), whole numbers (a manifest holds no
# other) of at most 4300 digits (as build.py verify reads them), no "-0"; and the file ends with its last line's newline
# shellcheck disable=SC2016  # awk's, not the shell's
json_form='function canon(k,   out, i, j, c, code) {  # a key as one text, its escapes decoded
    out = ""
    for (i = 1; i <= length(k); i++) {
      c = substr(k, i, 1)
      if (c == "\\") { c = substr(k, ++i, 1)
        if (c == "u") { code = 0; for (j = 1; j <= 4; j++) code = code * 16 + index(hex, tolower(substr(k, i + j, 1))) - 1; i += 4 }
        else code = c == "b" ? 8 : c == "f" ? 12 : c == "n" ? 10 : c == "r" ? 13 : c == "t" ? 9 : c == "/" ? 47 : c == q ? 34 : 92
      } else if (c == "\177") code = 127; else { out = out c; continue }
      out = out ((code >= 32 && code < 127 && code != 34 && code != 92) ? sprintf("%c", code) : sprintf("\\u%04x", code))
    }
    return out
  }
  BEGIN { hex = "0123456789abcdef"; x = "[0-9a-fA-F]"
    str = q "([^" q "\\\\]|\\\\[" q "\\\\/bfnrt]|\\\\u" x x x x ")*" q; d = 0
    element = "^(" str ": )?(" str "|-?(0|[1-9][0-9]*)|true|false|null|[{][}]|[[][]]|[{]|[[])(,)?$" }
  function escaped(s,   i, e, h, code) {  # an escape json.dumps does not write (it writes \" \\ \b \f \n \r \t, else \u in lower case)
    for (i = 1; i <= length(s); i++) {
      if (substr(s, i, 1) != "\\") continue
      e = substr(s, ++i, 1)
      if (e == "/") return 1
      if (e != "u") continue
      h = substr(s, i + 1, 4); i += 4
      if (h !~ /^[0-9a-f][0-9a-f][0-9a-f][0-9a-f]$/) return 1
      code = (index(hex, substr(h, 1, 1)) - 1) * 4096 + (index(hex, substr(h, 2, 1)) - 1) * 256 + (index(hex, substr(h, 3, 1)) - 1) * 16 + index(hex, substr(h, 4, 1)) - 1
      if ((code >= 32 && code < 127) || code == 8 || code == 9 || code == 10 || code == 12 || code == 13) return 1
    }
    return 0
  }
  { match($0, /^ */); body = substr($0, RLENGTH + 1); closing = body ~ /^[]}],?$/
    if (ended || (NR == 1 && body != "{") || $0 ~ /[\001-\037\177-\377]/ || escaped(body) || body ~ /(^|: )-0,?$/) { print NR; exit }
    if (length(body) > 4300 && body ~ /(^|: )-?[0-9]+,?$/) {  # a whole number of more digits than build.py verify reads
      digits = body; sub(/^.*: /, "", digits); gsub(/[^0-9]/, "", digits); if (length(digits) > 4300) { print NR; exit } }
    if (closing) { if (d == 0 || last == "," || last == "open" || substr(body, 1, 1) != (kind[d] == "{" ? "}" : "]")) { print NR; exit }; d-- }
    else if (NR > 1 && last != "," && last != "open") { print NR; exit }
    if (RLENGTH != 2 * d || (!closing && body !~ element)) { print NR; exit }
    if (!closing && d > 0 && (body ~ ("^" str ": ")) != (kind[d] == "{")) { print NR; exit }
    if (!closing && kind[d] == "{") { match(body, "^" str); key = substr(body, 1, RLENGTH)
      if (key ~ /[\200-\377]/ || (obj[d], canon(key)) in seen) { print NR; exit }
      seen[obj[d], canon(key)] = 1 }  # a key twice in one object, at any depth
    last = body ~ /,$/ ? "," : ""
    if (!closing && body ~ /[{[]$/) { d++; kind[d] = substr(body, length(body)); obj[d] = NR; last = "open"
      if (d > 256) { print NR " (nested more than 256 levels deep)"; exit } }  # (as build.py verify reads it)
    if (d == 0) ended = 1 }
  END { if (!ended && NR > 0) print NR }'
# (a file in that form, line by line: where each value is, its keys in their JSON text, "/" between them, a
# tab, then its JSON text (an object or list by its first line: "{", "[", or "{}", "[]" when empty))
# shellcheck disable=SC2016  # awk's, not the shell's
json_paths='BEGIN { x = "[0-9a-fA-F]"; str = q "([^" q "\\\\]|\\\\[" q "\\\\/bfnrt]|\\\\u" x x x x ")*" q }
  { match($0, /^ */); d = RLENGTH / 2; body = substr($0, RLENGTH + 1); sub(/,$/, "", body)
    if (body ~ /^[]}]$/) next
    if (d > 0) {
      if (kind[d] == "{") { match(body, "^" str ": "); name = substr(body, 1, RLENGTH - 2); body = substr(body, RLENGTH + 1) }
      else name = n[d]++
      path[d] = (d > 1 ? path[d - 1] "/" : "") name
    }
    print (d > 0 ? path[d] : "") "\t" body
    if (body == "{" || body == "[") { kind[d + 1] = body; n[d + 1] = 0 } }'
odd=$(LC_ALL=C awk -v q='"' "$json_form" "$work/manifest.json" | head -n 1)
[ -z "$odd" ] || fail "$dir/manifest.json:$odd: not written as unibake writes it (json.dumps, indent 2, every value in one form): its lines could be read otherwise than its JSON"
[ "$(tail -c 1 "$work/manifest.json" | od -An -tu1 | tr -d ' ')" = 10 ] \
  || fail "$dir/manifest.json: its end: not written as unibake writes it (json.dumps, indent 2, every value in one form): its lines could be read otherwise than its JSON"
# a \ud800-\udfff escape is half of a character written as two (json.dumps writes a high one, then its low one):
# one alone is no character, which build.py verify's schema reader refuses as invalid JSON
# shellcheck disable=SC2016  # awk's, not the shell's
lone=$(LC_ALL=C awk 'function lone(s,   i, c, h, high) {
    for (i = 1; i <= length(s); i++) {
      c = substr(s, i, 1)
      if (c == "\\") { c = substr(s, ++i, 1); h = c == "u" ? substr(s, i + 1, 4) : ""; if (c == "u") i += 4 } else h = ""
      if (h ~ /^d[c-f]/ && high) { high = 0; continue }
      if (high || h ~ /^d[c-f]/) return 1
      high = h ~ /^d[89ab]/
    }
    return high
  }
  lone($0) { print NR; exit }' "$work/manifest.json")
[ -z "$lone" ] || fail "$dir/manifest.json:$lone: not a valid release manifest: a string holds half of a character \
(a \\ud800-\\udfff escape without its pair), which is invalid JSON"
# and it is what its schema takes, as far as sh and awk can tell (build.py verify parses it against the
# schema itself): no key the schema does not have, none it requires left out, each value of a type it
# takes (a size a whole number, not negative), an integer within its bounds, a string within its length,
# a list of at least its items, one of the values it may take; no control character in a string (the
# labels aside); each string of a pattern matching it (grep -E: awk may read no {m,n}), the env and mount
# names too; first_published not later than published; a push's reference its repository@digest. Not checked
# here: the regexes of a smoke gate (build.py verify compiles them).
# The shape, one line a key path, from the schema itself (a unit test keeps it so: unibake.manifest.shell_shape):
# its JSON key path ("*" each list item or map value), its types, 1 if required, the least and the most
# (an integer's value, a string's length, a list's items; "-" none), the values it may take ("|" between),
# its pattern as an ERE, and an ERE it must not match (a "." or ".." component; "-" none); "+" a map's keys
manifest_shape='"schema"	integer	1	-	-	2	-	-
"tool"	object	1	-	-	-	-	-
"tool"/"name"	string	1	-	-	"unibake"	-	-
"tool"/"version"	string	1	-	64	-	-	-
"product"	string	1	-	-	-	^([a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?)$	-
"release"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$	-
"version"	string	1	-	128	-	-	-
"tag"	string	1	-	255	-	^(([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?)$	-
"image_id"	string	1	-	-	-	^(sha256:[0-9a-f]{64})$	-
"image_size"	integer	1	0	9223372036854775807	-	-	-
"diff_ids"	array	1	-	-	-	-	-
"diff_ids"/*	string	0	-	-	-	^(sha256:[0-9a-f]{64})$	-
"save_layout"	string	1	-	-	"docker"|"oci"	-	-
"default_profile"	string,null	1	-	-	-	^([a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?)$	-
"profiles"	map	1	-	-	-	-	-
"profiles"/+	string	0	-	-	-	^([a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?)$	-
"profiles"/*	object	0	-	-	-	-	-
"profiles"/*/"gpus"	integer	1	1	1024	-	-	-
"profiles"/*/"vendor"	string	1	-	-	"nvidia"|"amd"|"hygon"	-	-
"profiles"/*/"kernels"	array	1	-	-	-	-	-
"profiles"/*/"kernels"/*	string	0	-	-	-	-	-
"profiles"/*/"tune_caches"	integer	1	0	2147483648	-	-	-
"profiles"/*/"sidecars"	array	1	-	-	-	-	-
"profiles"/*/"sidecars"/*	object	0	-	-	-	-	-
"profiles"/*/"sidecars"/*/"name"	string	1	-	-	-	^([A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9_])?)$	-
"profiles"/*/"sidecars"/*/"version"	string	1	-	-	-	^([A-Za-z0-9][A-Za-z0-9._+~:-]{0,127})$	-
"profiles"/*/"args"	array	1	-	-	-	-	-
"profiles"/*/"args"/*	string	0	-	-	-	-	-
"profiles"/*/"smoke"	object	1	-	-	-	-	-
"profiles"/*/"smoke"/"expect_reply"	string,null	0	-	4096	-	-	-
"profiles"/*/"smoke"/"prompt"	string,null	0	-	4096	-	-	-
"profiles"/*/"smoke"/"match"	string	0	-	-	"exact"|"contains"|"regex"	-	-
"profiles"/*/"smoke"/"prompts"	array	0	-	-	-	-	-
"profiles"/*/"smoke"/"prompts"/*	object	0	-	-	-	-	-
"profiles"/*/"smoke"/"prompts"/*/"prompt"	string	1	-	4096	-	-	-
"profiles"/*/"smoke"/"prompts"/*/"expect"	string,null	0	-	4096	-	-	-
"profiles"/*/"smoke"/"prompts"/*/"match"	string	0	-	-	"exact"|"contains"|"regex"	-	-
"profiles"/*/"smoke"/"timeout"	integer	1	1	3600	-	-	-
"profiles"/*/"smoke"/"skip"	string,null	0	1	300	-	-	-
"profiles"/*/"devices"	object	0	-	-	-	-	-
"profiles"/*/"devices"/"extra"	array	0	-	-	-	-	-
"profiles"/*/"devices"/"extra"/*	string	0	-	-	-	^(/dev(/[A-Za-z0-9_.][A-Za-z0-9_.+-]*)+)$	(^|/)\.{1,2}(/|$)
"profiles"/*/"devices"/"groups"	array	0	-	-	-	-	-
"profiles"/*/"devices"/"groups"/*	string	0	-	-	-	^(([a-z_][a-z0-9_-]{0,31}|[0-9]{1,10}))$	-
"profiles"/*/"topology"	object	0	-	-	-	-	-
"profiles"/*/"topology"/"nodes"	integer	0	1	1024	-	-	-
"profiles"/*/"topology"/"network"	string	0	-	-	"bridge"|"host"	-	-
"profiles"/*/"topology"/"ipc"	string	0	-	-	"host"|"private"|"shareable"	-	-
"profiles"/*/"topology"/"shm_size"	string,null	0	-	-	-	^([1-9][0-9]{0,9}[bkmg]?)$	-
"profiles"/*/"topology"/"rdma"	boolean	0	-	-	-	-	-
"profiles"/*/"topology"/"master_port"	integer	0	1	65535	-	-	-
"profiles"/*/"env"	map	0	-	-	-	-	-
"profiles"/*/"env"/+	string	0	-	-	-	^([A-Za-z_][A-Za-z0-9_]{0,127})$	-
"profiles"/*/"env"/*	string	0	-	4096	-	-	-
"launch"	object,null	1	-	-	-	-	-
"launch"/"port"	integer	1	1	65535	-	-	-
"launch"/"model_name"	string	1	-	4096	-	-	-
"launch"/"mounts"	map	1	-	-	-	-	-
"launch"/"mounts"/+	string	0	-	-	-	^([a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?)$	-
"launch"/"mounts"/*	string	0	-	-	-	^(/[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*)$	-
"components"	array	1	-	-	-	-	-
"components"/*	object	0	-	-	-	-	-
"components"/*/"kind"	string	1	-	-	"engine"|"kernel"|"sidecar"|"tune_caches"|"overlay"|"patch"|"env_file"	-	-
"components"/*/"name"	string	1	-	1024	-	-	-
"components"/*/"version"	string	1	-	4096	-	-	-
"components"/*/"digest"	string	1	-	-	-	^([0-9a-f]{64})$	-
"components"/*/"profile"	string	0	-	64	-	-	-
"archive"	object	1	-	-	-	-	-
"archive"/"name"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
"archive"/"files"	array	1	1	-	-	-	-
"archive"/"files"/*	object	0	-	-	-	-	-
"archive"/"files"/*/"name"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
"archive"/"files"/*/"bytes"	integer	1	0	9223372036854775807	-	-	-
"archive"/"files"/*/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"archive"/"bytes"	integer	1	0	9223372036854775807	-	-	-
"archive"/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"archive"/"uncompressed_bytes"	integer	1	0	9223372036854775807	-	-	-
"archive"/"uncompressed_sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"archive"/"compression"	object	1	-	-	-	-	-
"archive"/"compression"/"algorithm"	string	1	-	-	"zstd"	-	-
"archive"/"compression"/"level"	integer	1	1	19	-	-	-
"archive"/"compression"/"long_distance"	boolean	1	-	-	-	-	-
"labels"	map	1	-	-	-	-	-
"labels"/*	string	0	-	-	-	-	-
"revision"	string	1	-	256	-	-	-
"created"	string	1	-	64	-	-	-
"source_date_epoch"	integer,null	1	0	253402300799	-	-	-
"published"	string	1	-	-	-	^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)$	-
"first_published"	string,null	0	-	-	-	^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)$	-
"previous"	string,null	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$	-
"hotfix"	object,null	1	-	-	-	-	-
"hotfix"/"base_release"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$	-
"hotfix"/"base_tag"	string	1	-	255	-	^(([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?)$	-
"hotfix"/"base_image_id"	string	1	-	-	-	^(sha256:[0-9a-f]{64})$	-
"hotfix"/"base_archive_bytes"	integer	1	1	9223372036854775807	-	-	-
"hotfix"/"omitted_diff_ids"	array	1	-	-	-	-	-
"hotfix"/"omitted_diff_ids"/*	string	0	-	-	-	^(sha256:[0-9a-f]{64})$	-
"hotfix"/"shipped_diff_ids"	array	1	-	-	-	-	-
"hotfix"/"shipped_diff_ids"/*	string	0	-	-	-	^(sha256:[0-9a-f]{64})$	-
"attachments"	array	0	-	-	-	-	-
"attachments"/*	object	0	-	-	-	-	-
"attachments"/*/"name"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
"attachments"/*/"bytes"	integer	1	0	9223372036854775807	-	-	-
"attachments"/*/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"external"	array	0	-	-	-	-	-
"external"/*	object	0	-	-	-	-	-
"external"/*/"name"	string	1	-	1024	-	^([A-Za-z0-9_.][A-Za-z0-9._+-]*(/[A-Za-z0-9_.][A-Za-z0-9._+-]*)*)$	(^|/)\.{1,2}(/|$)
"external"/*/"bytes"	integer	1	0	9223372036854775807	-	-	-
"external"/*/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"registry"	array	0	-	-	-	-	-
"registry"/*	object	0	-	-	-	-	-
"registry"/*/"reference"	string	1	-	512	-	^((([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|[[][0-9a-fA-F:]+[]])(:[0-9]{1,5})?/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*@sha256:[0-9a-f]{64})$	-
"registry"/*/"repository"	string	1	-	255	-	^((([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|[[][0-9a-fA-F:]+[]])(:[0-9]{1,5})?/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*)$	-
"registry"/*/"tag"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$	-
"registry"/*/"digest"	string	1	-	-	-	^(sha256:[0-9a-f]{64})$	-
"registry"/*/"media_type"	string	1	-	128	-	-	-
"registry"/*/"layers"	string	1	-	-	"gzip"|"zstd"	-	-
"registry"/*/"pushed"	string	1	-	64	-	-	-
"registry"/*/"index"	string	0	-	-	-	^((sha256:[0-9a-f]{64})?)$	-
"platform"	string,null	0	-	-	-	^([a-z0-9]{1,32}/[a-z0-9_]{1,32}(/[a-z0-9.]{1,16})?)$	-
"supply_chain"	object,null	0	-	-	-	-	-
"supply_chain"/"sbom"	object	1	-	-	-	-	-
"supply_chain"/"sbom"/"name"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
"supply_chain"/"sbom"/"bytes"	integer	1	0	9223372036854775807	-	-	-
"supply_chain"/"sbom"/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"supply_chain"/"provenance"	object	1	-	-	-	-	-
"supply_chain"/"provenance"/"name"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
"supply_chain"/"provenance"/"bytes"	integer	1	0	9223372036854775807	-	-	-
"supply_chain"/"provenance"/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"supply_chain"/"kit"	object,null	1	-	-	-	-	-
"supply_chain"/"kit"/"name"	string	1	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
"supply_chain"/"kit"/"bytes"	integer	1	0	9223372036854775807	-	-	-
"supply_chain"/"kit"/"sha256"	string	1	-	-	-	^([0-9a-f]{64})$	-
"supply_chain"/"signatures"	array	1	-	-	-	-	-
"supply_chain"/"signatures"/*	object	0	-	-	-	-	-
"supply_chain"/"signatures"/*/"kind"	string	1	-	-	"openpgp"|"minisign"	-	-
"supply_chain"/"signatures"/*/"key"	string	1	-	-	-	^([0-9A-F]{1,64})$	-
"supply_chain"/"signatures"/*/"files"	array	1	-	-	-	-	-
"supply_chain"/"signatures"/*/"files"/*	string	0	-	-	-	^([A-Za-z0-9_][A-Za-z0-9_.+-]{0,254})$	-
'
# shellcheck disable=SC2016  # awk's, not the shell's
json_shape='function more(a, b) {  # whether the whole number a is more than b (both written as JSON writes them)
    if (substr(a, 1, 1) == "-") return substr(b, 1, 1) == "-" ? more(substr(b, 2), substr(a, 2)) : 0
    if (substr(b, 1, 1) == "-") return 1
    if (length(a) != length(b)) return length(a) > length(b)
    return (a "") > (b "")
  }
  function chars(s,   i, n, e, h, high) {  # the characters of the JSON string s, as Python counts them
    n = 0; high = 0
    for (i = 2; i < length(s); i++) {
      if (substr(s, i, 1) == "\\") { e = substr(s, ++i, 1)
        if (e == "u") { h = tolower(substr(s, i + 1, 4)); i += 4
          if (high && h ~ /^d[c-f]/) { high = 0; continue }  # a surrogate pair: one character
          high = h ~ /^d[89ab]/; n++; continue } }
      high = 0; n++
    }
    return n
  }
  function control(s,   i, e, h) {  # whether the JSON string s holds a control character (an escape of one)
    for (i = 2; i < length(s); i++) {
      if (substr(s, i, 1) != "\\") continue
      e = substr(s, ++i, 1)
      if (e ~ /[bfnrt]/) return 1
      if (e == "u") { h = tolower(substr(s, i + 1, 4)); i += 4; if (h ~ /^00[01]/ || h == "007f") return 1 }
    }
    return 0
  }
  function shown(k) { return k ~ /^"/ ? substr(k, 2, length(k) - 2) : k }
  function refuse(what) { print what; refused = 1; exit }
  function shut(d,   n, i, need) {  # the container opened at depth d ends: what it requires is there
    if (kind[d] == "object") {
      n = split(required[pat[d]], need, " ")
      for (i = 1; i <= n; i++) if (!((id[d], need[i]) in seen)) refuse((where[d] == "" ? "" : where[d] ".") shown(need[i]) ": missing (a key the schema requires)")
    }
    if (kind[d] == "array") {
      if (least[pat[d]] != "-" && count[d] < least[pat[d]] + 0) refuse(where[d] ": " count[d] " items, fewer than " least[pat[d]])
      if (most[pat[d]] != "-" && count[d] > most[pat[d]] + 0) refuse(where[d] ": " count[d] " items, more than " most[pat[d]])
    }
    # the record of a push: pulled by its reference, which must be its repository at its digest (the escapes
    # of the three no pattern takes; the pattern check names them)
    if (pat[d] == q "registry" q "/*" && (id[d], "reference") in pushed && pushed[id[d], "reference"] != \
        substr(pushed[id[d], "repository"], 1, length(pushed[id[d], "repository"]) - 1) "@" substr(pushed[id[d], "digest"], 2))
      refuse(where[d] ".reference: " substr(shown(pushed[id[d], "reference"]), 1, 300) " is not repository@digest")
  }
  BEGIN { x = "[0-9a-fA-F]"; str = q "([^" q "\\\\]|\\\\[" q "\\\\/bfnrt]|\\\\u" x x x x ")*" q }
  FILENAME == ARGV[1] { split($0, f, "\t"); types[f[1]] = "," f[2] ","; least[f[1]] = f[4]; most[f[1]] = f[5]; values[f[1]] = f[6]
    pattern[f[1]] = f[7]
    if (f[3] == "1") { up = f[1]; last = up; sub(/^.*\//, "", last); if (up == last) up = ""; else sub(/\/[^\/]*$/, "", up)
      required[up] = required[up] " " last }
    next }
  { match($0, /^ */); d = RLENGTH / 2; body = substr($0, RLENGTH + 1); sub(/,$/, "", body)
    if (body ~ /^[]}]$/) { shut(d); next }
    if (d == 0) { pat[0] = ""; kind[0] = "object"; id[0] = NR; where[0] = ""; next }
    k = d - 1; count[k]++; key = ""
    if (kind[k] == "array") { p = (pat[k] == "" ? "" : pat[k] "/") "*"; at = where[k] "." (count[k] - 1) }
    else {
      match(body, "^" str ": "); key = substr(body, 1, RLENGTH - 2); body = substr(body, RLENGTH + 1)
      at = (where[k] == "" ? "" : where[k] ".") shown(key)
      if (kind[k] == "map") { p = pat[k] "/*"  # (the keys of a map, where they have a pattern: its path and "/+")
        if (pattern[pat[k] "/+"] != "" && pattern[pat[k] "/+"] != "-") print pat[k] "/+\t" at "\t" substr(key, 2, length(key) - 2) > strings }
      else { p = (pat[k] == "" ? "" : pat[k] "/") key; seen[id[k], key] = 1
        if (!(p in types)) refuse(substr(at, 1, 200) ": a key the schema does not have") }
    }
    free = unlabelled[k] || key == q "labels" q  # the labels may hold any text (build.py verify takes them so too)
    if (!free && key != "" && control(key)) refuse(substr(at, 1, 200) ": its key holds a control character")
    c = substr(body, 1, 1)
    t = c == "{" ? "object" : c == "[" ? "array" : c == q ? "string" : body == "true" || body == "false" ? "boolean" : body == "null" ? "null" : "integer"
    if (t == "object" && index(types[p], ",map,")) t = "map"
    if (!index(types[p], "," t ",")) { want = substr(types[p], 2, length(types[p]) - 2); gsub(/,/, " or ", want); sub(/map/, "object", want)
      refuse(at ": " (t == "map" ? "object" : t) ", where the schema takes " want) }
    if (values[p] != "-" && !index("|" values[p] "|", "|" body "|")) refuse(at ": " substr(body, 1, 80) ", not one of " values[p])
    if (t == "integer" && least[p] != "-" && more(least[p], body)) refuse(at ": " substr(body, 1, 40) ", less than " least[p])
    if (t == "integer" && most[p] != "-" && more(body, most[p])) refuse(at ": " substr(body, 1, 40) ", more than " most[p])
    if (t == "string") { n = chars(body)
      if (least[p] != "-" && n < least[p] + 0) refuse(at ": " n " characters, fewer than " least[p])
      if (most[p] != "-" && n > most[p] + 0) refuse(at ": " n " characters, more than " most[p])
      if (!free && control(body)) refuse(at ": holds a control character")
      if (pattern[p] != "-") print p "\t" at "\t" substr(body, 2, length(body) - 2) > strings  # (its escapes no pattern takes)
      if (p ~ /\/"smoke"\/"skip"$/ && body ~ /^"( |\\u(0085|00a0|1680|200[0-9a]|202[89f]|205f|3000))*"$/) refuse(at ": blank (a skipped gate needs its reason)")
      if (p == q "published" q) published = body
      if (p == q "first_published" q) first = body
      if (pat[k] == q "registry" q "/*") pushed[id[k], shown(key)] = body }
    if (body == "{" || body == "[") { pat[d] = p; kind[d] = t; id[d] = NR; count[d] = 0; where[d] = at; unlabelled[d] = free }
    else if (body == "{}" || body == "[]") { pat[d] = p; kind[d] = t; id[d] = NR; count[d] = 0; where[d] = at; shut(d) } }
  END { if (!refused && first != "" && published != "" && (first "") > (published "")) print "first_published " shown(first) " is later than published " shown(published) }'
printf '%s' "$manifest_shape" > "$work/manifest.shape"
: > "$work/manifest.strings"
why=$(LC_ALL=C awk -v q='"' -v strings="$work/manifest.strings" "$json_shape" "$work/manifest.shape" "$work/manifest.json" | head -n 1)
[ -z "$why" ] || fail "$dir/manifest.json: not a valid release manifest: $why"
tab=$(printf '\t')
while IFS="$tab" read -r path _ _ _ _ _ ere unlike; do
  [ "$ere" != - ] || continue
  awk -F '\t' -v p="$path" '$1 == p { print $3 }' "$work/manifest.strings" > "$work/values"
  at=$(LC_ALL=C grep -Env -e "$ere" "$work/values" | head -n 1 | cut -d : -f 1)
  [ -n "$at" ] || [ "$unlike" = - ] || at=$(LC_ALL=C grep -En -e "$unlike" "$work/values" | head -n 1 | cut -d : -f 1)
  [ -z "$at" ] || fail "$dir/manifest.json: not a valid release manifest: $(awk -F '\t' -v p="$path" -v n="$at" \
'$1 == p && ++i == n { print $2 ": " substr($3, 1, 80); exit }' "$work/manifest.strings") does not match the pattern $ere"
done < "$work/manifest.shape"
# (read as the guide's test "$(cat IMAGE_ID)" reads it, its last newlines dropped; a NUL byte, which the
# shell drops there too, refused: build.py verify reads the file, NUL and all)
tr -d '\000' < "$work/IMAGE_ID" | cmp -s - "$work/IMAGE_ID" || fail "$dir/IMAGE_ID: holds a NUL byte: does not hold an image ID"
want=$(cat "$work/IMAGE_ID")
case "$want" in sha256:*) ;; *) fail "$dir/IMAGE_ID does not hold an image ID" ;; esac
[ "$(printf '%s\n' "$want" | wc -l)" -eq 1 ] && printf '%s\n' "${want#sha256:}" | grep -qx '[0-9a-f]\{64\}' \
  || fail "$dir/IMAGE_ID does not hold an image ID"
recorded=$(sed -n 's/^  "image_id": "\(sha256:[0-9a-f]*\)",$/\1/p' "$work/manifest.json")
[ "$recorded" = "$want" ] || fail "$dir/IMAGE_ID names $want, but manifest.json records ${recorded:-no single image ID}"
tag=$(sed -n 's/^  "tag": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
[ "$(printf '%s\n' "$tag" | grep -c .)" -eq 1 ] || fail "$dir/manifest.json: no single tag"
printf '%s\n' "$tag" | grep -qx '[a-z0-9][A-Za-z0-9_./:@-]*' || fail "$dir/manifest.json: tag '$tag' is not an image reference"
if [ -n "$expect_image" ] && { [ "$want" != "$expect_image" ] || [ "$tag" != "$expect_tag" ]; }; then
  fail "$dir holds release $tag ($want), not the one this apply.sh is for: $expect_tag ($expect_image); nothing was loaded"
fi
# a minisign trusted comment unibake wrote ("PRODUCT RELEASE SHA256SUMS") names this release: a
# signature made for another release with the same key would otherwise be shown as that release's
if [ -s "$work/comment" ] && grep -qxE '[a-z0-9][a-z0-9._-]{0,63} [A-Za-z0-9_][A-Za-z0-9_.-]{0,127} (SHA256SUMS|provenance\.intoto\.json)' "$work/comment"; then
  product=$(sed -n 's/^  "product": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
  release=$(sed -n 's/^  "release": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
  [ "$(cat "$work/comment")" = "$product $release SHA256SUMS" ] || fail "$dir: SHA256SUMS.minisig's trusted comment says \
'$(cat "$work/comment")', but this is '$product $release SHA256SUMS' (manifest.json): a signature made for another release or file"
fi
if [ -s "$work/provenance.comment" ] && grep -qxE '[a-z0-9][a-z0-9._-]{0,63} [A-Za-z0-9_][A-Za-z0-9_.-]{0,127} (SHA256SUMS|provenance\.intoto\.json)' "$work/provenance.comment"; then
  product=$(sed -n 's/^  "product": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
  release=$(sed -n 's/^  "release": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
  [ "$(cat "$work/provenance.comment")" = "$product $release provenance.intoto.json" ] || fail "$dir: provenance.intoto.json.minisig's \
trusted comment says '$(cat "$work/provenance.comment")', but this is '$product $release provenance.intoto.json' (manifest.json): a signature made for another release or file"
fi

# The archive manifest.json names (the folder may hold other .tar.zst files, such as the reconstruct kit):
# NAME.tar.zst, or NAME.tar.zst.part-000, -001, ... in that order; only files SHA256SUMS lists.
archive=$(awk '/^  "archive": \{$/ { inside = 1; next } inside && /^    "name": "/ { print; exit }' "$work/manifest.json" |
  sed -n 's/^    "name": "\([^"\\]*\)",$/\1/p')
printf '%s\n' "$archive" | grep -qx "$NAME\\.tar\\.zst" || fail "$dir/manifest.json: no archive name ending in .tar.zst"
# named as unibake names a release's archive, as its notes and README-DIST load it (build.py verify checks it)
release=$(sed -n 's/^  "release": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
own_archive=$(sed -n 's/^  "product": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")-$release.tar.zst
[ "$archive" = "$own_archive" ] \
  || fail "$dir/manifest.json: its archive is named $archive, not $own_archive, as unibake names the archive of \
release $release"
# (in the order of their numbers: NAME.part-1000 after NAME.part-999, not after NAME.part-100)
awk -v a="$archive" '$0 == a || index($0, a ".part-") == 1 { print length($0) " " $0 }' "$work/names" |
  LC_ALL=C sort -k 1,1n -k 2 | cut -d ' ' -f 2- > "$work/parts"
[ -s "$work/parts" ] || fail "$dir: SHA256SUMS does not list the archive $archive"
# and they are the files manifest.json records as the archive, in order, as unibake's verifier reads
# them: a part listed beside them would be read by whoever loads the parts by a pattern, and one left
# out of manifest.json by this script alone
awk '/^  "archive": \{$/ { inside = 1; next } inside && /^  [}]/ { exit }
  inside && /^    "files": \[$/ { files = 1; next } files && /^    \]/ { exit } files' "$work/manifest.json" |
  sed -n 's/^        "name": "\([^"\\]*\)",\{0,1\}$/\1/p' > "$work/recorded"
cmp -s "$work/parts" "$work/recorded" || fail "$dir: SHA256SUMS lists the archive as $(tr '\n' ' ' < "$work/parts")\
but manifest.json records $(tr '\n' ' ' < "$work/recorded")as its files: not one release's archive"
if grep -qx -F "$archive" "$work/parts" && [ "$(wc -l < "$work/parts")" -gt 1 ]; then
  fail "$dir: SHA256SUMS lists $archive both whole and in parts"
fi
if grep -q '\.part-' "$work/parts"; then
  n=0
  while IFS= read -r part; do
    expected=$(printf '%s.part-%03d' "$archive" "$n")
    [ "$part" = "$expected" ] || fail "$dir: the archive's parts are not NAME.part-000 onwards in order ($part)"
    n=$((n + 1))
  done < "$work/parts"
fi
# the archive as manifest.json records it (build.py verify checks the same): each file's size and sha256
# (the one SHA256SUMS lists), their total, and below the sha256 of the whole compressed stream and the
# sha256 and size of the tar it decompresses to
awk '/^  "archive": \{$/ { inside = 1; next } inside && /^  [}]/ { exit }
  function v() { x = $2; gsub(/[",]/, "", x); return x }
  inside && /^      \{$/ { name = size = sha = "-"; next }
  inside && /^      [}],?$/ { print "file", name, size, sha; next }
  inside && /^        "name": / { name = v() } inside && /^        "bytes": / { size = v() } inside && /^        "sha256": / { sha = v() }
  inside && /^    "(bytes|sha256|uncompressed_bytes|uncompressed_sha256)": / { k = $1; gsub(/[":]/, "", k); print k, v() }' \
  "$work/manifest.json" > "$work/record"
record() { awk -v k="$1" '$1 == k { print $2; exit }' "$work/record"; }
total=0
while read -r what name size sha; do
  [ "$what" = file ] || continue
  listed=$(awk -v n="$name" '$1 == n { print $2; exit }' "$work/listed")
  [ "$sha" = "$listed" ] || fail "$dir/manifest.json records $name with the sha256 $sha; SHA256SUMS lists $listed"
  # ls, not wc: busybox's wc reads the whole file and wraps at 4 GiB
  has=$(ls -ln -- "$name" | awk '{ print $5 }')
  [ "$size" = "$has" ] || fail "$dir/$name: $has bytes, but manifest.json records $size"
  total=$(awk -v t="$total" -v s="$size" 'BEGIN { printf "%.0f", t + s }')
done < "$work/record"
[ "$(record bytes)" = "$total" ] || fail "$dir/manifest.json records the archive as $(record bytes) bytes; its files make $total"
# Every read of the archive: its parts in order, each hashed as it is read (one line a part in
# $work/streamed); "unchanged" then says whether that read was of the bytes SHA256SUMS lists. Each
# reader reads to the end (a part cut short hashes otherwise).
awk 'NR == FNR { d[$1] = $2; next } { print d[$0] }' "$work/listed" "$work/parts" > "$work/parts.sha256"
stream() {
  : > "$work/streamed"
  : > "$work/streamed.raw"
  # (one FIFO for every part, and the hashes cut to 64 once at the end: two processes a part, not
  # six; a release in thousands of parts is read several times)
  rm -f "$work/read.fifo" && mkfifo "$work/read.fifo" || exit 1
  while IFS= read -r part; do
    sha256sum < "$work/read.fifo" >> "$work/streamed.raw" &
    # (the FIFO also held open around tee: a part gone since the size check fails its redirection
    # before tee opens the FIFO, and the hash would wait for a writer for ever; the hash of nothing
    # then differs from the listed one, and "unchanged" refuses the read)
    { tee -- "$work/read.fifo" < "$part" || :; } 8> "$work/read.fifo"
    wait
  done < "$work/parts"
  cut -c 1-64 "$work/streamed.raw" > "$work/streamed"
}
unchanged() {
  cmp -s "$work/streamed" "$work/parts.sha256" || fail "$dir: the archive changed after sha256sum -c read it (a read \
of it no longer has the sha256 SHA256SUMS lists): refused${1:-}"
}
# a file named like the archive that SHA256SUMS does not list (a part added after the release was
# signed) fails: whoever loads the parts by a pattern would load it too; any other is named, not read
nl='
'
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  case "$f" in SHA256SUMS|SHA256SUMS.asc|SHA256SUMS.minisig) continue ;; esac
  case "$f" in *"$nl"*) ;; *) if grep -qxF -- "$f" "$work/names"; then continue; fi ;; esac
  case "$f" in
    "$archive"*) fail "$dir/$f: named like the archive, but SHA256SUMS does not list it: nothing vouches for it; remove it" ;;
    *) shown "note: $f is not listed in SHA256SUMS: not part of the release, not read" ;;
  esac
done

# --- 3. the archive's structure, before anything is loaded ------------------------------------
echo "== its structure (zstd -dc $(tr '\n' ' ' < "$work/parts")| tar -tv)"
# (tar stops reading at the end-of-archive blocks; what follows them is drained, so zstd reads to its end)
# (and the sha256 of the whole compressed stream and of the tar, as manifest.json records them, taken on the way)
# (and its first 4 bytes: the zstd tool also decodes gzip, xz, lzma and lz4 streams and zstd's legacy formats,
# which build.py verify and the release's own reader do not)
rm -f "$work/whole.fifo" "$work/tar.fifo" "$work/magic.fifo" && mkfifo "$work/whole.fifo" "$work/tar.fifo" "$work/magic.fifo"
{ head -c 4 > "$work/magic"; cat > /dev/null; } < "$work/magic.fifo" &
tee "$work/magic.fifo" < "$work/whole.fifo" | sha256sum | cut -c 1-64 > "$work/whole.sha256" &
sha256sum < "$work/tar.fifo" | cut -c 1-64 > "$work/tar.sha256" &
# (what follows the end is read up to 1 MiB: gigabytes of zeros compress to almost nothing, and every pass
# below would decode them all; a tar program pads its end to 10 kB)
# (and the tar no longer than manifest.json records: decoding stops one byte past it, so zstd frames of
# zeros cost the recorded length, not theirs)
tar_recorded=$(record uncompressed_bytes)
{ stream | tee "$work/whole.fifo" | zstd -q -dc 2>/dev/null || echo 1 > "$work/zstd.rc"; } | {
  head -c "$tar_recorded"; [ "$(head -c 1 | wc -c)" -eq 0 ] || echo 1 > "$work/over.rc"; } | tee "$work/tar.fifo" | {
  if tar -tvf - > "$work/list" 2>"$work/tar.err"; then echo 0; else echo 1; fi > "$work/tar.rc"
  [ "$(head -c 1048577 | wc -c)" -le 1048576 ] || echo 1 > "$work/after.rc"; }
wait
[ ! -s "$work/over.rc" ] || fail "$dir: the archive decompresses to more than the $tar_recorded bytes its manifest.json \
records: refused there, not decompressed further, before any load"
[ ! -s "$work/after.rc" ] || fail "$dir: the archive's tar is followed by more than 1 MiB after its end: no tar unibake (or a tar program) writes; refused before any load"
unchanged
[ ! -s "$work/zstd.rc" ] || fail "$dir: the archive does not decompress (corrupted or truncated)"
# a zstd frame first (or a skippable one), as build.py verify decodes it
case "$(od -An -tx1 "$work/magic" | tr -d ' \n')" in
  28b52ffd|5[0-9a-f]2a4d18) ;;
  *) fail "$dir: the archive is not a zstd stream: it does not start with a zstd frame (gzip, xz or another format?)" ;;
esac
# and nothing but zstd frames after it: zstd -l walks the frames' headers (no decoding) and refuses another
# format's stream after them, which zstd -dc decodes. It reads a file only: an archive in parts (whose frames
# may cross the parts' ends) is not walked here (build.py verify refuses such a stream: docs/RELIABILITY.md)
if [ "$(wc -l < "$work/parts")" -eq 1 ] && ! zstd -q -l -- "./$(cat "$work/parts")" > /dev/null 2>&1; then
  stream > /dev/null
  unchanged  # (an archive gone or changed since it was read is said as such; this read is the failure's only)
  fail "$dir: the archive holds something other than zstd frames after its first (another format's stream?)"
fi
[ "$(cat "$work/tar.rc")" = 0 ] || fail "$dir: the archive is not a valid tar: $(head -n 1 "$work/tar.err")"
[ "$(cat "$work/whole.sha256")" = "$(record sha256)" ] || fail "$dir/manifest.json records the archive's sha256 \
(all its files in order) as $(record sha256); it is $(cat "$work/whole.sha256")"
[ "$(cat "$work/tar.sha256")" = "$(record uncompressed_sha256)" ] || fail "$dir/manifest.json records the sha256 of \
the tar the archive decompresses to as $(record uncompressed_sha256); it is $(cat "$work/tar.sha256")"
# every member: the two folders, blobs named by their digest, and the three metadata files, each once
awk 'NF != 6 { print "x", "a name with spaces or a link"; next } {print substr($1, 1, 1), $NF}' "$work/list" > "$work/members"
odd=$(grep -v -e '^d blobs/$' -e '^d blobs/sha256/$' -e '^- blobs/sha256/[0-9a-f]\{64\}$' \
              -e '^- index\.json$' -e '^- manifest\.json$' -e '^- oci-layout$' "$work/members" | head -n 1 || true)
[ -z "$odd" ] || fail "$dir: the archive holds '${odd#? }', which a release archive does not (a link, another file)"
twice=$(cut -d' ' -f2 "$work/members" | sort | uniq -d | head -n 1)
[ -z "$twice" ] || fail "$dir: the archive holds '$twice' twice"
for meta in index.json manifest.json oci-layout; do
  grep -qx -e "- $meta" "$work/members" || fail "$dir: the archive lacks $meta: not a release archive"
done
# not many more entries than an image of the layers manifest.json records has (the two folders, the three metadata
# files, its config, its image manifest, a blob a layer): each entry costs the header walk below a few processes,
# and a tiny archive of a million empty blobs would keep it busy for hours before the check that names a blob
# nothing refers to (below) refuses it (build.py verify refuses more than 65536 entries, and any such blob)
layers_recorded=$(awk '/^  "diff_ids": \[$/ { inside = 1; next } inside && /^  \]/ { exit } inside { n++ }
  END { print n + 0 }' "$work/manifest.json")
entries=$(($(wc -l < "$work/members")))
[ "$entries" -le $((layers_recorded + 7 + 64)) ] || fail "$dir: the archive holds $entries entries, far more than an \
image of $layers_recorded layers has (its folders, metadata files, config, image manifest and layers): entries which \
nothing refers to; refused before any load"
# Our writer emits plain ustar entries and two zero blocks: each header is where the listing puts it,
# and the tar is exactly as long as its listing. An extended header (a PAX 'x' or global 'g' size, a
# GNU long name) is read by one tar and skipped by another (busybox ignores a PAX size, Go a global
# one), so any header the listing does not show is refused, whichever tar runs here. Each header is
# also read as Go's archive/tar (the engine's) reads it, which GNU tar lists otherwise: a type other
# than a file's or a folder's (a sparse 'S' under ustar magic is listed as a file), a number that is
# not one (GNU tar reads no devminor of a file, and takes "7 junk"), a name prefix under GNU magic
# (GNU tar reads the name alone), anything after the first zero block (GNU tar stops there).
# The stream is read a piece at a time (dd reads a pipe as it comes: a piece may be short), every
# piece counted, at most 1 GiB a count (busybox's wc wraps at 4 GiB).
piece() {  # at most $1 bytes of stdin to stdout
  if [ "$1" -ge 65536 ]; then
    c=$(($1 / 65536)); [ "$c" -le 16384 ] || c=16384; dd bs=65536 count="$c" 2>/dev/null
  else dd bs="$1" count=1 2>/dev/null; fi
}
skip() {  # exactly $1 bytes of stdin read and dropped; fails at the stream's end
  n=$1
  while [ "$n" -gt 0 ]; do
    got=$(($(piece "$n" | wc -c)))
    [ "$got" -gt 0 ] || return 1
    n=$((n - got))
  done
}
block() {  # exactly $2 bytes of stdin to the file $1; fails at the stream's end
  : > "$1"; n=$2
  while [ "$n" -gt 0 ]; do
    piece "$n" > "$work/piece"
    got=$(($(wc -c < "$work/piece")))
    [ "$got" -gt 0 ] || return 1
    cat "$work/piece" >> "$1"; n=$((n - got))
  done
}
# shellcheck disable=SC2016  # awk's, not the shell's
header_form='function number(at, len, what,   i, j) {  # as Go reads it: blanks and NULs trimmed, up to a NUL
  if (b[at] == 128 || b[at] == 255) return ""  # base-256 (a size of 8 GiB or more)
  for (i = at; i < at + len && (b[i] == 32 || b[i] == 0); i++) ;
  for (j = at + len - 1; j >= i && (b[j] == 32 || b[j] == 0); j--) ;
  for (; i <= j && b[i] != 0; i++) if (b[i] < 48 || b[i] > 55) return "with its " what " field not an octal number"
  return ""
}
function value(at, len,   i, v) {  # a number checked above, as Go reads it (a negative base-256 one: -1)
  if (b[at] >= 128) { if (b[at] != 128) return -1; for (i = at + 1; i < at + len; i++) v = v * 256 + b[i]; return v }
  for (i = at; i < at + len && (b[i] == 32 || b[i] == 0); i++) ;
  for (; i < at + len && b[i] >= 48 && b[i] <= 55; i++) v = v * 8 + b[i] - 48
  return v + 0
}
function text(at, len,   i, s) {  # a name field up to its NUL; a byte no listing shows plainly makes it "?"
  for (i = at; i < at + len && b[i] != 0; i++) s = s (b[i] > 32 && b[i] < 127 ? sprintf("%c", b[i]) : "?")
  return s
}
{ for (f = 1; f <= NF; f++) b[n++] = $f }
END {
  t = b[156]
  if (t == 120 || t == 103 || t == 76 || t == 75) { print "after an extended header"; exit }
  if (t != 48 && t != 0 && t != 53) { printf "as a member of type %s\n", (t > 32 && t < 127 ? sprintf("\047%c\047", t) : sprintf("byte %d", t)); exit }
  why = number(100, 8, "mode") number(108, 8, "uid") number(116, 8, "gid") number(124, 12, "size") \
    number(136, 12, "mtime") number(148, 8, "checksum") number(329, 8, "devmajor") number(337, 8, "devminor")
  if (why != "") { print why; exit }
  ustar = b[257] == 117 && b[258] == 115 && b[259] == 116 && b[260] == 97 && b[261] == 114 && b[262] == 0 && b[263] == 48 && b[264] == 48
  if (b[345] != 0 && !ustar) { print "with a name prefix under another magic than ustar\047s, which GNU tar reads as none"; exit }
  # the name and size the engine reads there are the listed ones: a folder ("\0" type and a slash) whose
  # size GNU and busybox tar skip as content, the engine reads as headers; any header out of step with the
  # listing (a zero block too) is one the listing does not show
  star = b[508] == 116 && b[509] == 97 && b[510] == 114 && b[511] == 0
  got = text(0, 100); if (ustar && b[345] != 0) got = text(345, star ? 131 : 155) "/" got
  if (name ~ /\/$/ && value(124, 12) != 0) { printf "as a folder of %.0f bytes, which GNU and busybox tar may skip and the engine reads as members\n", value(124, 12); exit }
  if (got != name || value(124, 12) != size + 0)
    printf "where its listing puts it, but the engine reads that header as \047%s\047 of %.0f bytes\n", got, value(124, 12)
}'
walk() {  # why the tar is not in that form, or nothing
  while read -r size name <&3; do
    block "$work/header" 512 || { echo "ends before the header of $name, where its listing puts it"; return; }
    why=$(od -An -tu1 -v "$work/header" | awk -v name="$name" -v size="$size" "$header_form")
    [ -z "$why" ] || { echo "holds $name $why"; return; }
    skip $(((size + 511) / 512 * 512)) || { echo "ends inside $name"; return; }
  done 3< "$work/sizes"
  block "$work/end" 1024 && [ -z "$(od -An -tu1 -v "$work/end" | tr -d ' 0\n')" ] && [ "$(($(piece 1 | wc -c)))" = 0 ] \
    || echo "does not end with two zero blocks right after its last entry"
}
awk '{ print ($1 ~ /^d/ ? 0 : $3), $NF }' "$work/list" > "$work/sizes"  # a folder has no content, whatever its size says
echo "== every header where its listing puts it, as an engine reads it (zstd -dc | dd)"
stream | zstd -q -dc 2>/dev/null | { walk > "$work/walked"; cat > /dev/null; }
unchanged
[ ! -s "$work/walked" ] || fail "$dir: the archive's tar $(head -n 1 "$work/walked"): it holds an extended header or data past its end, or a header an engine reads otherwise, not the plain entries unibake writes; refused before any load"
# the tar is then exactly its entries (a header and the content padded to 512 bytes each) and two zero blocks
tar_bytes=$(awk '{ n += 512 + int(($1 + 511) / 512) * 512 } END { printf "%.0f", n + 1024 }' "$work/sizes")
[ "$tar_bytes" = "$(record uncompressed_bytes)" ] || fail "$dir/manifest.json records the tar the archive decompresses \
to as $(record uncompressed_bytes) bytes; it is $tar_bytes"
# index.json, manifest.json and the image manifest are read whole: at most 16 MiB each, as unibake's
# own verifier keeps them (an index naming a huge layer as its manifest must not fill the disk)
META=16777216
size_of() { awk -v n="$1" '$NF == n { print $3; exit }' "$work/list"; }
for meta in index.json manifest.json; do
  [ "$(size_of "$meta")" -le "$META" ] || fail "$dir: the archive's $meta is more than $META bytes: not a release archive"
done
mkdir "$work/x"
stream | zstd -q -dc 2>/dev/null | { if tar -xf - -C "$work/x" index.json manifest.json 2>/dev/null; then echo 0
  else echo 1; fi > "$work/tar.rc"; cat > /dev/null; }
unchanged
[ "$(cat "$work/tar.rc")" = 0 ] || fail "$dir: the archive's index.json and manifest.json cannot be read"
man=$(cat "$work/x/manifest.json")
# exactly one entry, byte for byte as our writer makes it: a '*' between "Layers":[ and the tag would
# also match '...]},{"Config":...', a second image (under any tag) loaded beside the release's
opening="[{\"Config\":\"blobs/sha256/${want#sha256:}\",\"Layers\":["
closing="],\"RepoTags\":[\"$tag\"]}]"
layers=-
case "$man" in *"$nl"*) ;; "$opening"*"$closing") layers=${man#"$opening"}; layers=${layers%"$closing"} ;; esac
BLOB='"blobs/sha256/[0-9a-f]\{64\}"'
printf '%s\n' "$layers" | grep -qx "\\($BLOB\\(,$BLOB\\)*\\)\\{0,1\\}" \
  || fail "$dir: the archive's manifest.json is not one image $want tagged $tag only: a load would do more than the release says"
first=${tag%%/*}
case "$tag" in
  */*) case "$first" in *.*|*:*|localhost) full=$tag ;; *) full=docker.io/$tag ;; esac ;;
  *) full=docker.io/library/$tag ;;
esac
case "${tag##*/}" in *:*) ref=${tag##*:} ;; *) ref=latest ;; esac
index=$(cat "$work/x/index.json")
oci=$(printf '%s' "$index" | grep -o '"digest":"sha256:[0-9a-f]\{64\}"' | sed 's/.*sha256:\([0-9a-f]*\)"/\1/')
# the whole index as our writer makes it (sizes and the platform aside): one image, the release's tag only
[ "$(printf '%s\n' "$index" | sed -e 's/"size":[0-9]\{1,\}/"size":N/g' \
  -e 's/"platform":{"architecture":"[^"\\]*","os":"[^"\\]*"\(,"variant":"[^"\\]*"\)\{0,1\}},//')" = \
  "{\"manifests\":[{\"annotations\":{\"io.containerd.image.name\":\"$full\",\"org.opencontainers.image.ref.name\":\"$ref\"},\"digest\":\"sha256:$oci\",\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"size\":N}],\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"schemaVersion\":2}" ] \
  || fail "$dir: the archive's index.json does not name the release's tag $tag only: it is not in the form unibake writes"
grep -qx -e "- blobs/sha256/$oci" "$work/members" || fail "$dir: the archive lacks the image manifest its index.json names"
[ "$(size_of "blobs/sha256/$oci")" -le "$META" ] || fail "$dir: the archive's image manifest blobs/sha256/$oci is more than $META bytes"
config="blobs/sha256/${want#sha256:}"  # read with it: the diffIDs an engine loads by are the config's
grep -qx -e "- $config" "$work/members" || fail "$dir: the archive lacks its image config"
[ "$(size_of "$config")" -le "$META" ] || fail "$dir: the archive's image config $config is more than $META bytes"
stream | zstd -q -dc 2>/dev/null | { if tar -xf - -C "$work/x" "blobs/sha256/$oci" "$config" 2>/dev/null; then echo 0
  else echo 1; fi > "$work/tar.rc"; cat > /dev/null; }
unchanged
[ "$(cat "$work/tar.rc")" = 0 ] || fail "$dir: the archive's image manifest and config cannot be read"
# the image manifest (what containerd loads) is, byte for byte but sizes, the one our writer makes of
# manifest.json (what Engine 20.10 loads): the same config and layers, nothing beside them
printf '%s' "$man" | grep -o 'blobs/sha256/[0-9a-f]\{64\}' | sed 's|blobs/sha256/||' > "$work/by-manifest"
LAYER=application/vnd.oci.image.layer.v1.tar
LAYER_RE='application/vnd\.oci\.image\.layer\.v1\.tar'  # in a pattern: '.' would take any character
expected=$(awk -v l="$LAYER" 'NR == 1 { printf "{\"config\":{\"digest\":\"sha256:%s\",\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"size\":N},\"layers\":[", $1; next }
  { printf "%s{\"digest\":\"sha256:%s\",\"mediaType\":\"%s\",\"size\":N}", (NR > 2 ? "," : ""), $1, l }
  END { printf "],\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"schemaVersion\":2}" }' "$work/by-manifest")
[ "$(sed -e 's/"size":[0-9]\{1,\}/"size":N/g' -e "s|\"$LAYER_RE+gzip\"|\"$LAYER\"|g" "$work/x/blobs/sha256/$oci")" = "$expected" ] \
  || fail "$dir: the archive's index.json and manifest.json describe different images"
# nothing that nothing refers to (a hotfix's archive leaves out layers; it never adds any)
{ cat "$work/by-manifest"; echo "$oci"; } | sort -u > "$work/referenced"
sed -n 's|^- blobs/sha256/||p' "$work/members" | sort > "$work/blobs"
stray=$(comm -23 "$work/blobs" "$work/referenced" | head -n 1)
[ -z "$stray" ] || fail "$dir: the archive holds blobs/sha256/$stray, which nothing refers to: refused before any load"
grep -qx "${want#sha256:}" "$work/blobs" || fail "$dir: the archive lacks its image config"

# every blob's content against its name, in one more streamed read (nothing is written to disk):
# the names checked above mean nothing until then, and an engine told of a mismatch may have tagged
# the image already
echo "== the sha256 of every blob (zstd -dc | tar --to-command sha256sum)"
# A blob that starts as bzip2 or xz does (moby's DetectCompression: "BZh", or the six bytes of xz's magic) gets
# a third field naming it: the engine would load it decompressed, and it is refused below.
# A blob that starts as gzip (an engine's containerd store can save layers so) gets a third field, the
# digest of what it decompresses to ("-" if it does not), which is its diffID: the engines and
# unibake's reader go by those bytes, the "+gzip" media type only says so. The decompressor drains
# what it leaves (a cut stream), so tee is never killed mid-blob and the raw digest stays whole.
# shellcheck disable=SC2016  # expanded by the sh that tar starts for each member, not here
hash_blob='case $TAR_FILENAME in
  blobs/sha256/*)
    dd bs=1 count=6 of="$W/head" 2>/dev/null || exit 1
    magic=$(od -An -tx1 "$W/head" | tr -d " \n")
    case $magic in
      425a68*) other=bzip2 ;; fd377a585a00) other=xz ;; *) other= ;;
    esac
    if [ -n "$other" ]; then
      printf "%s %s %s\n" "$TAR_FILENAME" "$(cat "$W/head" - | sha256sum | cut -c 1-64)" "$other"
    elif [ "${magic#1f8b}" != "$magic" ]; then
      rm -f "$W/fifo" "$W/gzbad" && mkfifo "$W/fifo" || exit 1
      { { gzip -dc 2>/dev/null || echo 1 > "$W/gzbad"; } | sha256sum | cut -c 1-64 > "$W/gunzipped"
        cat > /dev/null; } < "$W/fifo" &
      raw=$(cat "$W/head" - | tee "$W/fifo" | sha256sum | cut -c 1-64); wait
      if [ -e "$W/gzbad" ]; then echo - > "$W/gunzipped"; fi
      printf "%s %s %s\n" "$TAR_FILENAME" "$raw" "$(cat "$W/gunzipped")"
    else
      printf "%s %s\n" "$TAR_FILENAME" "$(cat "$W/head" - | sha256sum | cut -c 1-64)"
    fi ;;
  *) cat > /dev/null ;;
esac'
stream | zstd -q -dc 2>/dev/null | { if W=$work tar -xf - --to-command="$hash_blob" > "$work/hashed" 2>"$work/tar.err"
  then echo 0; else echo 1; fi > "$work/tar.rc"; cat > /dev/null; }
unchanged
[ "$(cat "$work/tar.rc")" = 0 ] && [ "$(wc -l < "$work/hashed")" -eq "$(wc -l < "$work/blobs")" ] \
  || fail "$dir: the archive's blobs cannot be read through: $(head -n 1 "$work/tar.err")"
bad=$(awk '"blobs/sha256/" $2 != $1 { print $1 " is " $2; exit }' "$work/hashed")
[ -z "$bad" ] || fail "$dir: the archive's ${bad%% is *} does not hold what its name says (its sha256 is ${bad#* is }): tampered or corrupted; refused before any load"
# and each layer is the one manifest.json records (a hotfix's left-out layers by their names alone)
awk '/^  "diff_ids": \[$/ { inside = 1; next } inside && /^  \]/ { exit } inside' "$work/manifest.json" |
  sed -n 's/^    "sha256:\([0-9a-f]\{64\}\)",\{0,1\}$/\1/p' > "$work/diff-ids"
sed 1d "$work/by-manifest" > "$work/layers"
[ "$(wc -l < "$work/layers")" -eq "$(wc -l < "$work/diff-ids")" ] \
  || fail "$dir: the archive holds $(wc -l < "$work/layers") layers; manifest.json records $(wc -l < "$work/diff-ids")"
hotfix_field() {
  awk '/^  "hotfix": \{$/ { inside = 1; next } inside && /^  [}]/ { exit } inside' "$work/manifest.json" |
    sed -n "s/^    \"$1\": \"\([A-Za-z0-9:._-]*\)\",\{0,1\}\$/\1/p" | head -n 1
}
# only a hotfix may leave a layer out, and only one its manifest.json lists as left out (the base
# release's): any other missing layer would be whatever the engine already holds under that name
awk '/^  "hotfix": \{$/ { inside = 1; next } inside && /^  [}]/ { exit }
  inside && /^    "omitted_diff_ids": \[$/ { list = 1; next } list && /^    \]/ { exit } list' "$work/manifest.json" |
  sed -n 's/^      "sha256:\([0-9a-f]\{64\}\)",\{0,1\}$/\1/p' > "$work/omitted"
# a hotfix names its base by image ID, which the load looks for first (none read: no base looked for)
if grep -q '^  "hotfix": {$' "$work/manifest.json"; then
  hotfix_field base_image_id | grep -qx 'sha256:[0-9a-f]\{64\}' \
    || fail "$dir/manifest.json: a hotfix whose base_image_id is not an image ID"
fi
bad=$(awk 'FILENAME == ARGV[1] { left[$1] = 1; next }
  FILENAME == ARGV[2] { raw[$1] = $2; un[$1] = (NF == 3 ? $3 : $2); next }
  FILENAME == ARGV[3] { rec[FNR] = $1; next }
  !(("blobs/sha256/" $1) in raw) { if (rec[FNR] in left && !carried) next
    if (rec[FNR] in left) { print FNR " (blobs/sha256/" $1 ") is left out above layer " carried ", which it carries: a hotfix leaves out only a bottom run of layers, and a load needs every one above them"; exit }
    print FNR " (blobs/sha256/" $1 ") is not in it, and manifest.json does not record it as left out by a hotfix"; exit }
  !carried { carried = FNR }
  { got = un["blobs/sha256/" $1] }
  got == "-" { print FNR " (blobs/sha256/" $1 ") starts as gzip but does not decompress"; exit }
  got == "xz" || got == "bzip2" { print FNR " (blobs/sha256/" $1 ") starts as " got " does: Engine 20.10 loads it " got "-compressed, which unibake neither writes nor reads (a layer is a tar, or gzip)"; exit }
  got != rec[FNR] { print FNR " has diffID sha256:" got ", but manifest.json records sha256:" rec[FNR]; exit }' \
  "$work/omitted" "$work/hashed" "$work/diff-ids" "$work/layers")
[ -z "$bad" ] || fail "$dir: the archive's layer $bad: refused before any load"
# and the config's own diffIDs (rootfs.diff_ids) are those: an engine loads by them, and takes a layer it
# holds under one of them in place of the archive's. The config (the engine's JSON) is read as Go's
# encoding/json reads it, byte by byte: its keys and its rootfs's ASCII, each once in any case (Go
# takes "Diff_IDs" for diff_ids, and the last of two), escapes decoded, as unibake's verifier reads it
# shellcheck disable=SC2016  # awk's, not the shell's
config_form='function add(code) {  # a decoded character of the string being read ("<" too as "<60>": one text, one string)
  if (code >= 128) { wide = 1; return }
  str = str ((code > 32 && code < 127 && code != 60) ? sprintf("%c", code) : "<" code ">")
}
function bad(why) { print "why image config" why; failed = 1; exit }
function hexval(c) { return c >= 48 && c <= 57 ? c - 48 : c >= 65 && c <= 70 ? c - 55 : c >= 97 && c <= 102 ? c - 87 : -1 }
function key(k,   what, folded) {  # a key of the top-level object (depth 1) or of its rootfs (depth 2)
  what = depth == 1 ? " has" : "\047s rootfs has"
  if (wide) bad(what " a key that is not ASCII, which an engine may read as another key")
  folded = depth SUBSEP tolower(k)
  if (folded in seen) bad(what " the keys \047" seen[folded] "\047 and \047" k "\047, which an engine reads as one (the last)")
  seen[folded] = k
}
function path(d,   i, p) {  # the keys to the value at depth d, in lower case, " " between ("" if a list is on the way)
  for (i = 1; i <= d; i++) { if (kind[i] != 123) return ""; p = p (i > 1 ? " " : "") tolower(current[i]) }
  return p
}
function shown(d,   i, p) {  # the same as written ("[]" for a list item), as build.py verify names it
  for (i = 1; i <= d; i++) p = p (kind[i] == 91 ? "[]" : (i > 1 ? "." : "") substr(current[i], 1, 40))
  return p
}
# the fields an engine decodes a number into (Go: a 64-bit integer) and the top-level ones it knows (a number
# under one of them, elsewhere, is refused by the engine), as build.py verify reads them (imagetar.INTEGER_FIELDS)
function integer(p) { return p == "size" || p ~ /^(config|container_config) (stoptimeout|healthcheck (interval|timeout|startperiod|startinterval|retries))$/ }
function known() { return tolower(current[1]) ~ /^(id|parent|comment|created|container|container_config|docker_version|author|config|architecture|variant|os|os\.version|os\.features|size|rootfs|history)$/ }
function number(   digits, limit) {  # a number ended at depth: one an engine reads where it is
  if (integer(path(depth))) {
    digits = lit; limit = sub(/^-/, "", digits) ? "9223372036854775808" : "9223372036854775807"
    if (lit !~ /^-?(0|[1-9][0-9]*)$/ || length(digits) > 19 || (length(digits) == 19 && (digits "") > (limit "")))
      bad("\047s " shown(depth) " is not a whole number of 64 bits, which an engine reads there (it would refuse the load)")
  } else if (depth > 0 && known()) bad("\047s " shown(depth) " is a number, where an engine reads none (it would refuse the load)")
}
function value(c) {  # a value starts with the byte c: where one may, and in rootfs.diff_ids a string
  if (expect != "value" && expect != "value]") bad(" is not valid JSON")
  if (integer(path(depth)) && c != 45 && (c < 48 || c > 57) && c != 110)
    bad("\047s " shown(depth) " is not a whole number of 64 bits, which an engine reads there (it would refuse the load)")
  if (depth == 3 && list && c != 34) bad("\047s rootfs.diff_ids holds something other than strings")
  if (depth == 0 && c != 123) bad(" is not a JSON object")
}
function literal(   ok) {  # a number, true, false or null ended
  inlit = 0; expect = "next"
  ok = lit ~ /^(true|false|null|-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)$/
  if (!ok) bad(" is not valid JSON")
  if (lit ~ /^-/ || lit ~ /^[0-9]/) number()
}
function byte(c,   h) {
  if (instr) {
    if (u >= 0) { h = hexval(c); if (h < 0) bad(" is not valid JSON")
      code = code * 16 + h; if (++u == 4) { add(code); u = -1 }; return }
    if (esc) { esc = 0
      if (c == 117) { u = 0; code = 0; return }
      if (c == 98) c = 8; else if (c == 102) c = 12; else if (c == 110) c = 10; else if (c == 114) c = 13
      else if (c == 116) c = 9; else if (c != 34 && c != 92 && c != 47) bad(" is not valid JSON")
      add(c); return }
    if (c == 92) { esc = 1; return }
    if (c < 32) bad(" is not valid JSON")
    if (c != 34) { add(c); return }
    instr = 0
    if (expect == "key" || expect == "key}") { expect = ":"; current[depth] = wide ? "<wide>" : str
      if (depth == 1 || (depth == 2 && inroot)) key(str)
      return }
    expect = "next"
    if (depth == 3 && list) print "id " (wide ? "<wide>" : str)
    if (depth == 1 && (tolower(current[1]) == "architecture" || tolower(current[1]) == "os" || tolower(current[1]) == "variant"))
      print "top " tolower(current[1]) " " (wide ? "<wide>" : str)  # the platform it records (its keys in any case, as Go reads them)
    return
  }
  if (inlit && ((c >= 48 && c <= 57) || (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c == 43 || c == 45 || c == 46)) {
    lit = lit sprintf("%c", c); return }
  if (inlit) literal()
  if (c == 32 || c == 9 || c == 10 || c == 13) return
  if (ended) bad(" is not one JSON object")
  if (c == 34) { if (expect != "key" && expect != "key}") value(c); instr = 1; str = ""; wide = 0; return }
  if (c == 123 || c == 91) {
    value(c); depth++; kind[depth] = c; current[depth] = ""; expect = c == 123 ? "key}" : "value]"
    if (depth > 256) bad(" is nested more than 256 levels deep, which no image\047s metadata is")  # (as build.py verify)
    if (depth == 2) inroot = c == 123 && tolower(current[1]) == "rootfs"
    if (depth == 3 && inroot && c == 91 && tolower(current[2]) == "diff_ids") { list = 1; print "found" }
    return
  }
  if (c == 125 || c == 93) {
    if (kind[depth] != c - 2 || (expect != "next" && expect != (c == 125 ? "key}" : "value]"))) bad(" is not valid JSON")
    if (depth == 3) list = 0; if (depth == 2) inroot = 0
    depth--; expect = "next"; if (depth == 0) ended = 1; return }
  if (c == 44) { if (expect != "next" || depth == 0) bad(" is not valid JSON"); expect = kind[depth] == 123 ? "key" : "value"; return }
  if (c == 58) { if (expect != ":") bad(" is not valid JSON"); expect = "value"; return }
  if ((c >= 48 && c <= 57) || (c >= 97 && c <= 122) || c == 45) { value(c); inlit = 1; lit = sprintf("%c", c); return }
  bad(" is not valid JSON")
}
BEGIN { u = -1; expect = "value" }
{ for (f = 1; f <= NF; f++) byte($f + 0) }
END { if (!failed && !ended) print "why image config is not valid JSON" }'
od -An -tu1 -v "$work/x/$config" | awk "$config_form" > "$work/config-ids"
why=$(sed -n 's/^why //p' "$work/config-ids" | head -n 1)
[ -z "$why" ] || fail "$dir: the archive's $why: refused before any load"
grep -qx found "$work/config-ids" || fail "$dir: the archive's image config has no list of diffIDs (rootfs.diff_ids)"
sed -n 's/^id //p' "$work/config-ids" > "$work/config-diff-ids"
sed 's/^/sha256:/' "$work/diff-ids" > "$work/recorded-ids"
bad=$(awk 'FILENAME == ARGV[1] { rec[FNR] = $0; n = FNR; next } { got[FNR] = $0; m = FNR }
  END { for (i = 1; i <= (n > m ? n : m); i++) if (rec[i] != got[i]) {
    print i " as " (i <= m ? got[i] : "none") ", but manifest.json records " (i <= n ? rec[i] : "none"); exit } }' \
  "$work/recorded-ids" "$work/config-diff-ids")
[ -z "$bad" ] || fail "$dir: the archive's image config (by which an engine loads) records the diffID of layer $bad: refused before any load"
# and the platform it records is the one manifest.json names (absent: linux/amd64, as in releases made
# before it was recorded; null: none), as build.py verify compares them (arm64 with or without its variant)
top() { sed -n "s/^top $1 //p" "$work/config-ids" | head -n 1; }
platform=
if [ -n "$(top architecture)" ] && [ -n "$(top os)" ]; then
  platform="$(top os)/$(top architecture)"
  case "$platform" in linux/amd64|linux/arm64) ;; *) [ -z "$(top variant)" ] || platform="$platform/$(top variant)" ;; esac
fi
if grep -q '^  "platform": null,\{0,1\}$' "$work/manifest.json"; then named=
elif grep -q '^  "platform": ' "$work/manifest.json"; then
  named=$(sed -n 's/^  "platform": "\([a-z0-9_./]*\)",\{0,1\}$/\1/p' "$work/manifest.json")
  [ -n "$named" ] || fail "$dir/manifest.json: a platform that is not one"
else named=linux/amd64; fi
[ "$platform" = "$named" ] || fail "$dir: the archive's image config is for ${platform:-no platform}, but manifest.json \
says ${named:-none}: refused before any load"
# and the archive's index.json names the config's platform (none where it records none), as its writer takes it:
# an engine that picks by the index (containerd's store) would take or refuse the image for another platform. An
# index that names none is a release's from before the index named one: read, as ever, by the config's platform
indexed=$(printf '%s\n' "$index" | sed -n 's/.*"platform":{"architecture":"\([^"\\]*\)","os":"\([^"\\]*\)"\(,"variant":"\([^"\\]*\)"\)\{0,1\}}.*/\2\/\1\/\4/p')
configured=
if [ -n "$(top architecture)" ] && [ -n "$(top os)" ]; then configured="$(top os)/$(top architecture)/$(top variant)"; fi
indexed=${indexed%/} configured=${configured%/}
[ -z "$indexed" ] || [ "$indexed" = "$configured" ] || fail "$dir: the archive's index.json names the platform '${indexed:-none}', but its \
image config is for '${configured:-none}': refused before any load"

# --- the SBOM's and the provenance's subjects: this release (build.py verify checks the same) ---------
# manifest.json's supply_chain record (absent or null in releases made before it): each file listed in
# SHA256SUMS with the sha256 it records, the SBOM's subject the release's image, the provenance's
# subjects its image and files (each a file SHA256SUMS lists, with the sha256 it lists), and each
# signature file it records there. Both are read as unibake writes them (json.dumps, indent 2), as
# build.py verify reads them too: a copy of each, its sha256 checked again, read line by line.
LC_ALL=C awk -v q='"' "$json_paths" "$work/manifest.json" > "$work/manifest.paths"
# each attachment it records (a file of the project copied into the release, which the notes list): a file
# SHA256SUMS lists with its sha256, of its size, named as unibake lets an attachment be named (not a file of
# the release itself, a signature of one or a .tar.zst; one name once, letter case aside), as build.py verify checks
# shellcheck disable=SC2016  # awk's, not the shell's
awk -F '\t' '$1 ~ /^"attachments"\/[0-9]+$/ { split($1, at, "/"); n = at[2] + 1 }
  $1 ~ /^"attachments"\/[0-9]+\/"(name|bytes|sha256)"$/ {
    split($1, at, "/"); v = $2; gsub(/"/, "", v); r[at[2], at[3]] = v }
  END { for (i = 0; i < n; i++) print i, r[i, "\"name\""], r[i, "\"bytes\""], r[i, "\"sha256\""] }' \
  "$work/manifest.paths" > "$work/attachments"
: > "$work/attached"
while read -r n name size sha; do
  lower=$(printf '%s\n' "$name" | tr A-Z a-z)
  for own in manifest.json validation.json sha256sums release_notes.md image_id run.sh apply.sh readme-dist.md \
      sbom.cdx.json provenance.intoto.json; do
    case "$lower" in "$own"|"$own".*) fail "$dir/manifest.json: its attachments.$n names $name, which an attachment \
cannot be named (a file of the release itself, a signature or a .tar.zst)" ;; esac
  done
  case "$lower" in *.tar.zst*) fail "$dir/manifest.json: its attachments.$n names $name, which an attachment cannot be \
named (a file of the release itself, a signature or a .tar.zst)" ;; esac
  ! grep -qxF -- "$lower" "$work/attached" \
    || fail "$dir/manifest.json: its attachments.$n names $name, as another attachment does (letter case aside)"
  printf '%s\n' "$lower" >> "$work/attached"
  listed=$(awk -v n="$name" '$1 == n { print $2; exit }' "$work/listed")
  [ -n "$listed" ] || fail "$dir/$name: not listed in SHA256SUMS (manifest.json records it as an attachment)"
  [ "$listed" = "$sha" ] || fail "$dir/$name: SHA256SUMS and manifest.json disagree on its sha256"
  has=$(ls -ln -- "$name" | awk '{ print $5 }')
  [ "$size" = "$has" ] || fail "$dir/$name: $has bytes, but manifest.json records $size"
done < "$work/attachments"
supply() { awk -F '\t' -v p="\"supply_chain\"/$1" '$1 == p { print $2; exit }' "$work/manifest.paths"; }
if [ -n "$(supply '"sbom"')" ]; then
  # each entry holds its own file, as unibake names it (build.py verify checks the same): another listed
  # file recorded there (the SBOM or the archive as the kit) would pass every check below
  product=$(sed -n 's/^  "product": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
  release=$(sed -n 's/^  "release": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
  kit_name=
  for what in sbom provenance kit; do
    [ "$what" != kit ] || [ "$(awk -F '\t' '$1 == "\"supply_chain\"/\"kit\"" { print $2; exit }' "$work/manifest.paths")" != null ] || continue
    name=$(supply "\"$what\"/\"name\"" | sed -n "s/^\"\\($NAME\\)\"\$/\\1/p")
    sha=$(supply "\"$what\"/\"sha256\"" | sed -n 's/^"\([0-9a-f]\{64\}\)"$/\1/p')
    [ -n "$name" ] && [ -n "$sha" ] || fail "$dir/manifest.json: its supply_chain record of the $what is not a file's name and sha256"
    case "$what" in
      sbom) own=sbom.cdx.json label=SBOM ;;
      provenance) own=provenance.intoto.json label=provenance ;;
      *) own=$product-$release-kit.tar.zst label=kit ;;
    esac
    [ "$name" = "$own" ] \
      || fail "$dir/manifest.json: its supply_chain.$what names $name, not the release's $label ($own)"
    listed=$(awk -v n="$name" '$1 == n { print $2; exit }' "$work/listed")
    [ -n "$listed" ] || fail "$dir/$name: not listed in SHA256SUMS (manifest.json records it as the release's $what)"
    [ "$listed" = "$sha" ] || fail "$dir/$name: SHA256SUMS and manifest.json disagree on its sha256"
    # its size too, as the archive's files' (the record's bytes an integer: the schema's check above)
    size=$(supply "\"$what\"/\"bytes\"")
    has=$(ls -ln -- "$name" | awk '{ print $5 }')
    [ "$size" = "$has" ] || fail "$dir/$name: $has bytes, but manifest.json records $size"
    eval "${what}_name=\$name"
  done
  # the kit is a kit: a zstd stream, not a copy of another file the release lists
  if [ -n "$kit_name" ]; then
    kit_sha=$(awk -v n="$kit_name" '$1 == n { print $2; exit }' "$work/listed")
    same=$(awk -v n="$kit_name" -v s="$kit_sha" '$2 == s && $1 != n { print $1 }' "$work/listed" |
      LC_ALL=C sort | head -n 1)
    [ -z "$same" ] || fail "$dir/$kit_name: the same bytes as $same (SHA256SUMS): not the release's kit"
    [ "$(head -c 4 -- "$kit_name" | od -An -tx1 | tr -d ' \n')" = 28b52ffd ] \
      || fail "$dir/$kit_name: does not start as a zstd stream, as the release's kit does: not its kit"
  fi
  # each kind's signatures are of SHA256SUMS and the provenance, as unibake writes them, one record a kind
  # shellcheck disable=SC2016  # awk's, not the shell's
  bad=$(awk -F '\t' 'function plain(s) { return substr(s, 2, length(s) - 2) }
    $1 ~ /^"supply_chain"\/"signatures"\/[0-9]+$/ { split($1, at, "/"); n = at[3] + 1 }
    $1 ~ /^"supply_chain"\/"signatures"\/[0-9]+\/"kind"$/ { split($1, at, "/"); kind[at[3]] = plain($2) }
    $1 ~ /^"supply_chain"\/"signatures"\/[0-9]+\/"files"\/[0-9]+$/ { split($1, at, "/"); i = at[3]
      files[i] = files[i] (count[i]++ ? ", " : "") plain($2); file[i, count[i]] = plain($2) }
    END { for (i = 0; i < n; i++) {
        record = "its supply_chain.signatures." i; suffix = kind[i] == "openpgp" ? ".asc" : ".minisig"
        if (seen[kind[i]]++) { print record " is a second " kind[i] " record (unibake signs with one key of each kind)"
          exit }
        if (count[i] != 2 || file[i, 1] != "SHA256SUMS" suffix || file[i, 2] != "provenance.intoto.json" suffix) {
          print record " (" kind[i] ") names " (count[i] ? files[i] : "no file") ", not SHA256SUMS" suffix \
            " and provenance.intoto.json" suffix; exit } } }' \
    "$work/manifest.paths")
  [ -z "$bad" ] || fail "$dir/manifest.json: $bad"
  # shellcheck disable=SC2154  # set by the eval above
  for what in sbom provenance; do
    eval "name=\$${what}_name"
    copy "$name" "$work/$what.json" 67108864 || fail "$dir/$name: not a regular file"
    [ "$(sha256sum < "$work/$what.json" | cut -c 1-64)" = "$(awk -v n="$name" '$1 == n { print $2 }' "$work/listed")" ] \
      || fail "$dir/$name: changed after sha256sum -c read it: refused"
    odd=$(LC_ALL=C awk -v q='"' "$json_form" "$work/$what.json" | head -n 1)
    [ -z "$odd" ] || fail "$dir/$name:$odd: not written as unibake writes it (json.dumps, indent 2, every value in one form): its lines could be read otherwise than its JSON"
    [ "$(tail -c 1 "$work/$what.json" | od -An -tu1 | tr -d ' ')" = 10 ] \
      || fail "$dir/$name: its end: not written as unibake writes it (json.dumps, indent 2, every value in one form): its lines could be read otherwise than its JSON"
    LC_ALL=C awk -v q='"' "$json_paths" "$work/$what.json" > "$work/$what.paths"
  done
  # shellcheck disable=SC2016  # awk's, not the shell's
  bad=$(awk -F '\t' -v id="\"${want#sha256:}\"" -v where="$sbom_name" '
    $1 == "\"bomFormat\"" { format = $2 } $1 == "\"specVersion\"" { spec = $2 }
    $1 == "\"metadata\"/\"component\"" { subject = $2 ~ /^[{]/ }
    $1 ~ /^"metadata"\/"component"\/"hashes"\/[0-9]+\/"(alg|content)"$/ {
      split($1, at, "/"); if (at[5] == "\"alg\"") alg[at[4]] = $2; else content[at[4]] = $2 }
    END {
      if (format != "\"CycloneDX\"") { print where ": not a CycloneDX document"; exit }
      if (spec !~ /^"1\.([5-9]|[0-9][0-9])"$/) { print where ": CycloneDX " (spec == "" ? "\047\047" : spec) ", not 1.5 or later"; exit }
      if (!subject) { print where ": names no subject (metadata.component)"; exit }
      for (i in alg) if (alg[i] == "\"SHA-256\"") { n++; got = (i in content) ? content[i] : "null" }
      if (n > 1) { print where ": its subject has " n " SHA-256 hashes, not one"; exit }
      if (got != id) { print where ": describes image sha256:" (n ? substr(got, 1, 66) : "(none)") ", not this release\047s sha256:" substr(id, 2, 64) } }' \
    "$work/sbom.paths")
  [ -z "$bad" ] || fail "$dir/$bad"
  # the files the provenance must name: the archive's, the SBOM, the kit
  { cat "$work/parts"; echo "$sbom_name"; [ -z "${kit_name:-}" ] || echo "$kit_name"; } > "$work/required"
  # shellcheck disable=SC2016  # awk's, not the shell's
  bad=$(awk -F '\t' -v id="\"${want#sha256:}\"" -v ref="\"$tag\"" -v where="$provenance_name" '
    FILENAME == ARGV[1] { split($0, f, " "); file["\"" f[1] "\""] = "\"" f[2] "\""; next }
    FILENAME == ARGV[2] { required["\"" $0 "\""] = 1; order[++r] = "\"" $0 "\""; next }
    $1 == "\"_type\"" { type = $2 } $1 == "\"predicateType\"" { predicate_type = $2 }
    $1 == "\"subject\"" { subjects = $2 ~ /^[[]/ } $1 == "\"predicate\"" { predicate = $2 ~ /^[{]/ }
    $1 ~ /^"subject"\/[0-9]+$/ { split($1, at, "/"); if (at[2] + 1 > count) count = at[2] + 1 }
    $1 ~ /^"subject"\/[0-9]+\/"name"$/ && $2 ~ /^"/ { split($1, at, "/"); name[at[2]] = $2; m++ }
    $1 ~ /^"subject"\/[0-9]+\/"digest"\/"sha256"$/ && $2 ~ /^"/ { split($1, at, "/"); digest[at[2]] = $2 }
    END {
      if (type != "\"https://in-toto.io/Statement/v1\"" || predicate_type != "\"https://slsa.dev/provenance/v1\"") {
        print where ": not an in-toto statement with an SLSA provenance v1 predicate"; exit }
      if (!subjects || !predicate) { print where ": has no subjects or no predicate"; exit }
      for (i in name) if (seen[name[i]]++) { print where ": names " substr(name[i], 1, 82) " as a subject more than once"; exit }
      for (i = 0; i < count; i++) if (!(i in name) || !(i in digest)) {
        print where ": its subject " ((i in name) ? substr(name[i], 1, 82) : "#" (i + 1)) " has no sha256 digest (a name and a sha256 each subject must have, to be compared): refused"; exit }
      for (i in name) if (i in digest) sha[name[i]] = digest[i]
      if (sha[ref] != id) { print where ": its image subject is " (ref in sha ? substr(sha[ref], 1, 66) : "none") ", not sha256:" substr(id, 2, 64); exit }
      for (s in sha) {
        if (s == ref) continue
        if (!(s in file)) { print where ": names " substr(s, 1, 82) ", which this release does not hold"; exit }
        if (file[s] != sha[s]) { print where ": the sha256 of " substr(s, 2, length(s) - 2) " differs from the file\047s"; exit } }
      for (i = 1; i <= r; i++) if (!(order[i] in sha)) { print where ": does not name " substr(order[i], 2, length(order[i]) - 2) " as a subject"; exit } }' \
    "$work/listed" "$work/required" "$work/provenance.paths")
  [ -z "$bad" ] || fail "$dir/$bad"
  # each signature file it records is here (a regular file, not a link), as build.py verify checks it
  awk -F '\t' '$1 ~ /^"supply_chain"\/"signatures"\/[0-9]+\/"files"\/[0-9]+$/ { print $2 }' "$work/manifest.paths" > "$work/signed"
  while IFS= read -r signed; do
    file=$(printf '%s\n' "$signed" | sed -n "s/^\"\\($NAME\\)\"\$/\\1/p")
    [ -n "$file" ] || fail "$dir/manifest.json: its supply_chain records a signature file that is not a file's name: $signed"
    [ -f "$file" ] && [ ! -L "$file" ] || fail "$dir/$file: missing (manifest.json records it as a signature of the release)"
  done < "$work/signed"
elif [ -n "$(awk -F '\t' '$1 == "\"supply_chain\"" && $2 != "null" { print; exit }' "$work/manifest.paths")" ]; then
  fail "$dir/manifest.json: its supply_chain record names no SBOM"
fi
# a supply-chain file SHA256SUMS lists that the record leaves out would be checked by nothing (its record,
# null or dropped, and SHA256SUMS re-summed: an SBOM of another image shipped as the release's)
product=$(sed -n 's/^  "product": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
release=$(sed -n 's/^  "release": "\([^"\\]*\)",$/\1/p' "$work/manifest.json")
for what in sbom provenance kit; do
  case "$what" in
    sbom) own=sbom.cdx.json label=SBOM ;;
    provenance) own=provenance.intoto.json label=provenance ;;
    *) own=$product-$release-kit.tar.zst label=kit ;;
  esac
  if grep -qxF -- "$own" "$work/names" && [ -z "$(supply "\"$what\"/\"name\"")" ]; then
    fail "$dir/$own: listed in SHA256SUMS, but manifest.json records no $label (supply_chain.$what): nothing checks \
it against the release"
  fi
done

# a profile released without its smoke gate (its smoke.skip in manifest.json, the gate SKIPPED in
# VALIDATION.json; or every profile when no gate ran, --no-smoke or --no-roundtrip: the "smoke_skipped"
# line of a VALIDATION.json SHA256SUMS lists, read as build.py verify reads it): what the folder's checks
# cannot show, warned of as build.py verify warns of it
# (a JSON string's text, its quotes off, as build.py verify prints it: its escapes decoded, a control character
# as \xNN; with collapse, Python's blanks in a run as one space, none at the ends, at most 300 characters)
# shellcheck disable=SC2016  # awk's, not the shell's
json_text='function hexv(h,   i, v) { for (i = 1; i <= 4; i++) v = v * 16 + index("0123456789abcdef", tolower(substr(h, i, 1))) - 1; return v }
  function utf8(c) {
    if (c < 128) return sprintf("%c", c)
    if (c < 2048) return sprintf("%c%c", 192 + int(c / 64), 128 + c % 64)
    if (c < 65536) return sprintf("%c%c%c", 224 + int(c / 4096), 128 + int(c / 64) % 64, 128 + c % 64)
    return sprintf("%c%c%c%c", 240 + int(c / 262144), 128 + int(c / 4096) % 64, 128 + int(c / 64) % 64, 128 + c % 64)
  }
  function blank(c) { return c == 32 || (c >= 9 && c <= 13) || (c >= 28 && c <= 31) || c == 133 || c == 160 || c == 5760 ||
    (c >= 8192 && c <= 8202) || c == 8232 || c == 8233 || c == 8239 || c == 8287 || c == 12288 }
  function jtext(s, collapse,   n, i, c, e, code, lo, d, out, k, len, pend) {
    for (i = 1; i <= length(s); i++) {
      c = substr(s, i, 1); code = -1; d = c
      if (c >= "\200" && c <= "\277" && n > 0) { ch[n] = ch[n] c; continue }  # (a raw UTF-8 character whole)
      if (c == "\\") { e = substr(s, ++i, 1); d = e
        if (e == "u") { code = hexv(substr(s, i + 1, 4)); i += 4
          if (code >= 55296 && code < 56320 && substr(s, i + 1, 2) == "\\u") { lo = hexv(substr(s, i + 3, 4))
            if (lo >= 56320 && lo < 57344) { code = 65536 + (code - 55296) * 1024 + lo - 56320; i += 6 } } }
        else if (index("bfnrt", e)) code = index("bfnrt", e) == 1 ? 8 : index("bfnrt", e) == 2 ? 12 : index("bfnrt", e) == 3 ? 10 : index("bfnrt", e) == 4 ? 13 : 9 }
      if (code == 10) d = "\\n"; else if (code == 13) d = "\\r"; else if (code == 9) d = "\\t"
      else if (code >= 0 && (code < 32 || (code >= 127 && code < 160))) d = sprintf("\\x%02x", code)
      else if (code >= 55296 && code < 57344) d = sprintf("\\u%04x", code)
      else if (code >= 0) d = utf8(code)
      ch[++n] = d; sp[n] = collapse && (d == " " || (code >= 0 && blank(code)))
    }
    for (k = 1; k <= n; k++) {
      if (!collapse) { out = out ch[k]; continue }
      if (sp[k]) { pend = len > 0; continue }
      if (pend && len < 300) { out = out " "; len++ }
      pend = 0
      if (len >= 300) break
      out = out ch[k]; len++
    }
    return out
  }'
skipped_gates() {
  if [ -f "$work/VALIDATION.json" ]; then
    # shellcheck disable=SC2016  # awk's, not the shell's
    why=$(LC_ALL=C awk -v q='"' "$json_text"'
      BEGIN { x = "[0-9a-fA-F]"
        line = "^  " q "smoke_skipped" q ": " q "([^" q "\\\\\001-\037]|\\\\[" q "\\\\/bfnrt]|\\\\u" x x x x ")*" q ",?$" }
      $0 ~ line { why = $0; sub(/^  "smoke_skipped": "/, "", why); sub(/",?$/, "", why); print jtext(why, 1); exit }' \
      "$work/VALIDATION.json")
    if [ -n "$why" ]; then
      awk -F '\t' '$1 ~ /^"profiles"\/"[^"]*"$/ { print substr($1, 13, length($1) - 13) }' "$work/manifest.paths" |
        LC_ALL=C sort | while IFS= read -r name; do
          shown "warning: profile $name was released without its smoke gate (no gate ran: $why)" >&2
        done
      return 0
    fi
  fi
  # shellcheck disable=SC2016  # awk's, not the shell's
  LC_ALL=C awk -F '\t' "$json_text"'
    $1 ~ /^"profiles"\/"[^"]*"\/"smoke"\/"skip"$/ && $2 != "null" {
      split($1, at, "/"); print substr(at[2], 2, length(at[2]) - 2) "\t" jtext(substr($2, 2, length($2) - 2), 0) }' \
    "$work/manifest.paths" | LC_ALL=C sort |
    while IFS="$(printf '\t')" read -r name why; do
      shown "warning: profile $name was released without its smoke gate (smoke.skip: $why)" >&2
    done
}

# which release this is comes from its manifest, not from the folder's name: said, as build.py verify says it
[ "$load" -eq 1 ] || { skipped_gates; echo "ok: $tag (image $want): sums, zstd and the archive's structure (not loaded)"; exit 0; }

# --- 4. the load, and 5. the image ID -----------------------------------------------------------
# the engine first, as build.py verify --load: none answering would read as a missing base or image
if ! err=$(docker version --format '{{.Server.Version}}' 2>&1 >/dev/null); then
  # named as docker picks it: DOCKER_HOST, else DOCKER_CONTEXT, else the current context (docker context use)
  if [ -n "${DOCKER_HOST:-}" ]; then at="DOCKER_HOST=$DOCKER_HOST"
  elif [ -n "${DOCKER_CONTEXT:-}" ]; then at="DOCKER_CONTEXT=$DOCKER_CONTEXT"
  else
    at=$(docker context inspect --format '{{.Name}} {{.Endpoints.docker.Host}}' 2>/dev/null) || at=""
    case "$at" in ""|"default "*) at="DOCKER_HOST=the default socket" ;; *) at="docker context ${at%% *}, ${at#* }" ;; esac
  fi
  printf '%s\n' "error: cannot reach the Docker engine ($at): $err" >&2
  exit 1
fi
# a hotfix's archive leaves out its base release's layers: without that image the engine's refusal
# would name a missing blob, not what to import (unless the engine holds the hotfix's image itself,
# pulled whole or with its base removed since: it has every layer then)
base=$(hotfix_field base_image_id)
if [ -n "$base" ] && ! docker image inspect "$base" >/dev/null 2>&1 && ! docker image inspect "$want" >/dev/null 2>&1; then
  fail "this hotfix needs image $base (release $(hotfix_field base_release)) in the engine; import that release first (nothing was loaded)"
fi
if have=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null) && [ "$have" != "$want" ]; then
  fail "the engine's $tag is $have, another image: loading would move that tag (nothing was loaded)"
fi
# What the engine holds before the load, for the undo of a load that fails: each tag it set is put
# back where it was (or removed), and each image the load itself brought (the archive's image, by its
# config's digest, IMAGE_ID; any other a tag it set names) that is then left without a tag is
# removed; an image the engine held before, or one another client added meanwhile, is never removed
images() { docker image ls -a --no-trunc --format '{{.ID}} {{.Repository}}:{{.Tag}}'; }
images > "$work/before" || fail "the engine's images cannot be listed (nothing was loaded)"
undone="; what the load added was removed"
undo() {
  { sed -n 's/^Loaded image: //p' "$work/loaded"; echo "$tag"; } | sort -u > "$work/set"
  # the images the load brought: its own, each the engine names in its "Loaded image ID:" lines, and
  # each a tag it set names, where the engine did not hold it before
  { echo "$want"; sed -n 's/^Loaded image ID: //p' "$work/loaded"; } > "$work/brought"
  while IFS= read -r name; do
    now=$(docker image inspect --format '{{.Id}}' "$name" 2>/dev/null) || continue
    echo "$now" >> "$work/brought"
    old=$(awk -v n="$name" '$2 == n { print $1; exit }' "$work/before")
    if [ -n "$old" ]; then
      [ "$now" = "$old" ] || docker tag "$old" "$name" >/dev/null 2>&1 || :
      continue
    fi
    # docker rmi removes an image with its last tag: a tag the load put on an image the engine held
    # without one is first moved to an image another tag names (the held one stays, untagged)
    if awk -v i="$now" '$1 == i { found = 1; exit } END { exit !found }' "$work/before" \
        && [ "$(docker image inspect --format '{{len .RepoTags}}' "$now")" = 1 ]; then
      other=$(awk -v n="$name" '$2 != n && $2 !~ /:<none>$/ { print $2; exit }' "$work/before")
      [ -n "$other" ] && docker tag "$other" "$name" >/dev/null 2>&1 || continue
    fi
    docker rmi "$name" >/dev/null 2>&1 || :
  done < "$work/set"
  images > "$work/after" || return 0
  awk 'FILENAME == ARGV[1] { brought[$1] = 1; next } FILENAME == ARGV[2] { held[$1] = 1; next }
    ($1 in brought) && !($1 in held) && $2 == "<none>:<none>" { print $1 }' \
    "$work/brought" "$work/before" "$work/after" | sort -u > "$work/added"
  removed=1
  while [ "$removed" = 1 ]; do  # an image before the one it is the parent of refuses: another round
    removed=0
    while IFS= read -r id; do
      if docker image inspect "$id" >/dev/null 2>&1 && docker rmi "$id" >/dev/null 2>&1; then removed=1; fi
    done < "$work/added"
  done
  # what is left of the load's own: a tag it set, or an image it brought, not as before
  images | awk 'FILENAME == ARGV[1] { set[$0] = 1; next } FILENAME == ARGV[2] { brought[$1] = 1; next }
    FILENAME == ARGV[3] { held[$1] = 1; held[$1 " " $2] = 1; next }
    !(($1 " " $2) in held) && (($2 in set) || (($1 in brought) && !($1 in held))) { print $2 " (" $1 ")" }' \
    "$work/set" "$work/brought" "$work/before" - | sort -u > "$work/left"
  if [ -s "$work/left" ]; then
    echo "warning: what the failed load left in the engine, not undone: $(tr '\n' ' ' < "$work/left")" >&2
    undone="; what the load left is named above"
  fi
}
echo "== zstd -dc | docker load"
# The tar's last byte is held back until the whole archive was read with the sha256 SHA256SUMS
# lists: read otherwise, the engine gets a cut tar, which it refuses before it adds any image (it
# unpacks the whole stream first); the hash is checked again after the load, and the undo follows
rm -f "$work/last.fifo" && mkfifo "$work/last.fifo"
: > "$work/loaded"
stream | zstd -q -dc 2>/dev/null | {
  tail -c 1 < "$work/last.fifo" > "$work/last" &
  tee "$work/last.fifo" | head -c -1
  wait
  if cmp -s "$work/streamed" "$work/parts.sha256"; then cat "$work/last"; fi
} | { if docker load > "$work/loaded" 2> "$work/load.err"; then echo 0; else echo 1; fi > "$work/load.rc"; }
cat "$work/loaded"
if [ "$(cat "$work/load.rc")" != 0 ]; then
  undo
  unchanged "; docker load refused it"
  fail "docker load refused the archive: $(head -n 1 "$work/load.err")"
fi
cmp -s "$work/streamed" "$work/parts.sha256" || { undo; unchanged "$undone"; }
got=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null) || { undo; fail "the engine has no $tag after the load$undone"; }
[ "$got" = "$want" ] || { undo; fail "the loaded image $tag is $got; IMAGE_ID says $want$undone"; }
skipped_gates
echo "ok: $tag is $got, as IMAGE_ID says"
