#!/bin/sh
# Verify a downloaded release with nothing but POSIX sh, sha256sum, zstd and docker:
#   1. sha256sum -c SHA256SUMS          every file is what the release published
#   2. zstd -t                          the archive (or its parts, in order) decompresses cleanly
#   3. zstd -dc | docker load           the image loads (DOCKER_HOST picks the engine)
#   4. the loaded image ID equals the one in IMAGE_ID
# Usage: scripts/verify-release.sh RELEASE_DIR [--no-load]
# Exit: 0 all passed; 3 a check failed; 2 bad usage.
set -eu

usage() { echo "usage: verify-release.sh RELEASE_DIR [--no-load]" >&2; exit 2; }
fail() { echo "error: $*" >&2; exit 3; }

[ "$#" -ge 1 ] || usage
dir=$1
load=1
if [ "${2:-}" = "--no-load" ]; then load=0; elif [ "$#" -gt 1 ]; then usage; fi
[ -d "$dir" ] || { echo "error: $dir: not a folder" >&2; exit 2; }
cd "$dir"
[ -f SHA256SUMS ] || fail "$dir/SHA256SUMS is missing: not a complete release folder"
[ -f IMAGE_ID ] || fail "$dir/IMAGE_ID is missing: not a complete release folder"

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
