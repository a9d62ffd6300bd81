#!/bin/sh
# Rebuild the prebuilt NVSHMEM tarball (a stand-in): compile in the builder image, then pack lib/ with its
# soname link and a header, with fixed times and owners. Then: python build.py lock --config <this>/profiles
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib" "$tmp/include"
docker run --rm --network none -v "$here/src:/src:ro" -v "$tmp/lib:/out" localhost/unibake-demo-builder:bookworm \
  cc -O2 -shared -fPIC -ffile-prefix-map=/src=. -Wl,-soname,libnvshmem_host.so.3 -o /out/libnvshmem_host.so.3 \
  /src/nvshmem_host.c
ln -s libnvshmem_host.so.3 "$tmp/lib/libnvshmem_host.so"
printf 'int nvshmem_my_pe(void);\n' >"$tmp/include/nvshmem.h"
tar --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner -C "$tmp" -czf \
  "$here/nvshmem-3.2.5+cuda12-roce.tar.gz" lib include
