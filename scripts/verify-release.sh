#!/bin/sh
# Verify a downloaded release with nothing but POSIX sh, sha256sum, zstd and docker:
#   0. with --key: the signature of SHA256SUMS (gpgv for an armoured OpenPGP key, minisign for a
#      minisign public key), before anything else
#   1. sha256sum -c SHA256SUMS          every file is what the release published
#   2. zstd -t                          the archive (or its parts, in order) decompresses cleanly
#   3. zstd -dc | docker load           the image loads (DOCKER_HOST picks the engine)
#   4. the loaded image ID equals the one in IMAGE_ID
# Usage: scripts/verify-release.sh RELEASE_DIR [--no-load] [--key PUBKEY]
# Exit: 0 all passed; 3 a check failed (a signature absent or wrong too); 2 bad usage.
set -eu

usage() { echo "usage: verify-release.sh RELEASE_DIR [--no-load] [--key PUBKEY]" >&2; exit 2; }
fail() { echo "error: $*" >&2; exit 3; }

[ "$#" -ge 1 ] || usage
dir=$1
shift
load=1
key=
while [ "$#" -gt 0 ]; do
  case "$1" in
    --no-load) load=0; shift ;;
    --key) [ "$#" -ge 2 ] || usage; key=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ -d "$dir" ] || { echo "error: $dir: not a folder" >&2; exit 2; }
if [ -n "$key" ]; then
  [ -f "$key" ] || { echo "error: --key $key: no such file" >&2; exit 2; }
  key=$(cd "$(dirname "$key")" && pwd)/$(basename "$key")
fi
cd "$dir"
[ -f SHA256SUMS ] || fail "$dir/SHA256SUMS is missing: not a complete release folder"
[ -f IMAGE_ID ] || fail "$dir/IMAGE_ID is missing: not a complete release folder"

if [ -n "$key" ]; then
  if grep -q -- "-----BEGIN PGP PUBLIC KEY BLOCK-----" "$key"; then
    echo "== gpgv SHA256SUMS.asc SHA256SUMS"
    [ -f SHA256SUMS.asc ] || fail "$dir: SHA256SUMS is not signed (no SHA256SUMS.asc)"
    home=$(mktemp -d)
    trap 'rm -rf "$home"' EXIT
    gpg --batch --quiet --homedir "$home" --dearmor --output "$home/publisher.gpg" "$key" \
      || { echo "error: --key $key: gpg cannot read it" >&2; exit 2; }
    gpgv --homedir "$home" --keyring "$home/publisher.gpg" SHA256SUMS.asc SHA256SUMS \
      || fail "$dir: SHA256SUMS.asc is not a good signature of SHA256SUMS by $key"
  elif head -n 1 "$key" | grep -q "^untrusted comment:"; then
    echo "== minisign -Vm SHA256SUMS"
    [ -f SHA256SUMS.minisig ] || fail "$dir: SHA256SUMS is not signed (no SHA256SUMS.minisig)"
    minisign -V -p "$key" -m SHA256SUMS -x SHA256SUMS.minisig \
      || fail "$dir: SHA256SUMS.minisig is not a good signature of SHA256SUMS by $key"
  else
    echo "error: --key $key: neither an armoured OpenPGP public key nor a minisign public key" >&2
    exit 2
  fi
fi

echo "== sha256sum -c SHA256SUMS"
sha256sum -c SHA256SUMS || fail "$dir: files differ from SHA256SUMS (see the lines above)"

# The archive is NAME.tar.zst, or NAME.tar.zst.part-000, -001, ... in that order.
parts=$(ls -- *.tar.zst.part-* 2>/dev/null | LC_ALL=C sort || true)
[ -n "$parts" ] || parts=$(ls -- *.tar.zst 2>/dev/null || true)
[ -n "$parts" ] || fail "$dir: no .tar.zst archive"

echo "== zstd -t $(echo $parts)"
# shellcheck disable=SC2086
cat -- $parts | zstd -q -t || fail "$dir: the archive does not decompress (corrupted or truncated)"

[ "$load" -eq 1 ] || { echo "ok: sums and zstd (not loaded)"; exit 0; }

echo "== zstd -dc | docker load"
# shellcheck disable=SC2086
out=$(cat -- $parts | zstd -dc | docker load) || fail "docker load refused the archive"
printf '%s\n' "$out"
ref=$(printf '%s\n' "$out" | sed -n -e 's/^Loaded image: //p' -e 's/^Loaded image ID: //p' | tail -n 1)
[ -n "$ref" ] || fail "docker load did not say what it loaded"
want=$(cat IMAGE_ID)
got=$(docker image inspect --format '{{.Id}}' "$ref") || fail "the engine has no $ref after the load"
[ "$got" = "$want" ] || fail "the loaded image $ref is $got; IMAGE_ID says $want"
echo "ok: $ref is $got, as IMAGE_ID says"
