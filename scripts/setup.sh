#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: the Python venv, a Docker engine that answers, and the
# local base images the demo product and the tests build on (nothing can be pulled here), for
# linux/amd64 and, under emulation (qemu-user registered with binfmt_misc), linux/arm64.
#
#   scripts/setup.sh            everything
#   scripts/setup.sh --venv     only the Python environment (enough for unit tests)
#
# Environment: UNIBAKE_VENV (default .venv), DEBIAN_MIRROR (default: the host's apt source),
# UNIBAKE_DOCKERD_LOG (default /var/log/unibake-dockerd.log).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${UNIBAKE_VENV:-$ROOT/.venv}
BUSYBOX_IMAGE=localhost/unibake-busybox:1
DEMO_BASE_IMAGE=localhost/unibake-demo-base:bookworm
DEMO_BUILDER_IMAGE=localhost/unibake-demo-builder:bookworm
SUITE=bookworm
BUSYBOX_ARM64_IMAGE=localhost/unibake-busybox:1-arm64
DEMO_BASE_ARM64_IMAGE=localhost/unibake-demo-base:bookworm-arm64
DEMO_BUILDER_ARM64_IMAGE=localhost/unibake-demo-builder:bookworm-arm64
BINFMT=/proc/sys/fs/binfmt_misc

TMPDIRS=()
cleanup() { [ ${#TMPDIRS[@]} -eq 0 ] || rm -rf "${TMPDIRS[@]}"; }
trap cleanup EXIT

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'error: setup: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" = 0 ]; }

apt_install() {
  # Installs Debian packages when missing; only root can.
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  is_root || die "missing Debian packages: ${missing[*]} (install them as root: apt-get install ${missing[*]})"
  say "installing ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

setup_venv() {
  local stamp="$VENV/.requirements.sha256" want
  want=$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  say "creating the Python environment in $VENV"
  # (a .venv of an older python3 would be refused by build.py, which would send the user back here)
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "unibake needs Python 3.11 or newer; python3 here is $(python3 --version 2>&1): put a newer one first on PATH"
  python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements.txt" \
    || die "pip install -r requirements.txt failed"
  echo "$want" >"$stamp"
}

setup_engine() {
  if docker info >/dev/null 2>&1; then return 0; fi
  command -v docker >/dev/null 2>&1 || apt_install docker.io
  if ! command -v dockerd >/dev/null 2>&1; then
    is_root || die "no Docker engine answers and dockerd is not installed: install docker.io (or Docker Engine) and start it"
    apt_install docker.io
  fi
  docker info >/dev/null 2>&1 && return 0
  is_root || die "no Docker engine answers on ${DOCKER_HOST:-the default socket}: start dockerd (needs root), or set DOCKER_HOST"
  local log=${UNIBAKE_DOCKERD_LOG:-/var/log/unibake-dockerd.log}
  say "starting dockerd in the background (log: $log)"
  # The daemon outlives this script: it must not inherit our descriptors (a `flock` held on fd 3 by
  # whoever ran us would otherwise stay held for the daemon's whole life).
  (for fd in /proc/self/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"; done
   exec setsid nohup dockerd >"$log" 2>&1 </dev/null) &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  tail -n 20 "$log" >&2 || true
  die "dockerd did not answer within 60 s (see $log)"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

setup_busybox_image() {
  image_exists "$BUSYBOX_IMAGE" && return 0
  apt_install busybox-static
  local bb=/bin/busybox tmp
  file_is_static() { ! ldd "$1" >/dev/null 2>&1; }
  file_is_static "$bb" || die "$bb is not statically linked (install busybox-static)"
  tmp=$(mktemp -d); TMPDIRS+=("$tmp")
  mkdir -p "$tmp/rootfs/bin" "$tmp/rootfs/etc" "$tmp/rootfs/tmp" "$tmp/rootfs/root"
  cp "$bb" "$tmp/rootfs/bin/busybox"
  for applet in $("$bb" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$tmp/rootfs/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$tmp/rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/rootfs/etc/group"
  chmod 1777 "$tmp/rootfs/tmp"
  say "importing $BUSYBOX_IMAGE"
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$tmp/rootfs" -c . \
    | docker import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$BUSYBOX_IMAGE" >/dev/null
}

debian_mirror() {
  # The mirror the host's apt already uses; never written into the project.
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' \
        | grep -v -- '-security' | head -n 1 || true)
  if [ -z "$uri" ]; then
    uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' \
          | grep -v -- '-security' | head -n 1 || true)
  fi
  [ -n "$uri" ] || die "no Debian mirror found in the host's apt sources: set DEBIAN_MIRROR"
  echo "$uri"
}

debootstrap_image() {
  # $1 image name, $2 comma-separated packages to include, $3 a command it must pass (else it is rebuilt)
  local name=$1 include=$2 probe=${3:-} tmp cache old=""
  if image_exists "$name"; then
    if [ -z "$probe" ] || docker run --rm --network none "$name" sh -c "$probe" >/dev/null 2>&1; then
      return 0
    fi
    say "$name lacks what it needs now ($probe): building it again"
    old=$(docker image inspect --format '{{.Id}}' "$name")
  fi
  is_root || die "building $name needs root (debootstrap): run this script as root"
  apt_install debootstrap
  cache=${UNIBAKE_CACHE:-$ROOT/.cache}/debootstrap
  mkdir -p "$cache"
  tmp=$(mktemp -d); TMPDIRS+=("$tmp")
  say "debootstrap $SUITE minbase with $include for $name (about a minute)"
  debootstrap --variant=minbase --include="$include" --cache-dir="$cache" \
    "$SUITE" "$tmp/rootfs" "$(debian_mirror)" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -n 20 "$tmp/debootstrap.log" >&2; die "debootstrap failed for $name"; }
  rm -rf "$tmp/rootfs/var/cache/apt/archives/"*.deb "$tmp/rootfs/var/lib/apt/lists/"* \
         "$tmp/rootfs/var/log/"*.log "$tmp/rootfs/debootstrap"
  say "importing $name"
  tar --numeric-owner -C "$tmp/rootfs" -c . \
    | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["/bin/bash"]' - "$name" >/dev/null
  # the image it replaces goes, unless build cache still grows from it (then it goes with that cache)
  if [ -n "$old" ]; then docker rmi "$old" >/dev/null 2>&1 || true; fi
}

setup_emulation() {
  # arm64 programs run here under qemu-user, registered with the host kernel's binfmt_misc (one
  # registration for every engine on the host, scratch ones too). The F flag opens the emulator
  # once, at registration, so containers and chroots need no copy of it.
  [ "$(uname -m)" = aarch64 ] && return 0
  if [ -e "$BINFMT/qemu-aarch64" ] && grep -qx enabled "$BINFMT/qemu-aarch64"; then return 0; fi
  is_root || die "arm64 images need qemu-user-static registered with binfmt_misc: run this script as root"
  apt_install qemu-user-static
  if [ ! -e "$BINFMT/register" ]; then
    say "mounting binfmt_misc on $BINFMT"
    mount -t binfmt_misc binfmt_misc "$BINFMT" || die "cannot mount binfmt_misc on $BINFMT"
  fi
  if [ ! -e "$BINFMT/qemu-aarch64" ]; then
    say "registering qemu-aarch64 with binfmt_misc"
    cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$BINFMT/register" || die "cannot register qemu-aarch64 with binfmt_misc"
  fi
  echo 1 >"$BINFMT/qemu-aarch64"
  grep -q '^flags: .*F' "$BINFMT/qemu-aarch64" \
    || die "qemu-aarch64 is registered without the F flag: containers would not find the emulator"
}

load_rootfs_image() {
  # $1 image name, $2 the rootfs as one layer tar, $3 architecture, $4 variant, $5 PATH, $6 CMD (JSON).
  # docker import records the engine's own architecture (Engine 20.10 ignores --platform), so the
  # image is loaded from a save-format tar whose config names the platform.
  local name=$1 layer=$2 arch=$3 variant=$4 path=$5 cmd=$6 dir diff
  dir=$(dirname "$layer")
  diff=$(sha256sum "$layer" | cut -d' ' -f1)
  printf '{"architecture":"%s","variant":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=%s"],"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"scripts/setup.sh: %s"}]}' \
    "$arch" "$variant" "$path" "$cmd" "$diff" "$name" >"$dir/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["%s"]}]' "$name" "$(basename "$layer")" >"$dir/manifest.json"
  say "loading $name ($arch)"
  tar -C "$dir" -c manifest.json config.json "$(basename "$layer")" | docker load >/dev/null
}

apt_download_arm64() {
  # $1 package, $2 folder: Debian's arm64 build of a package, downloaded (not installed).
  if [ "$(dpkg --print-architecture)" != arm64 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    is_root || die "downloading arm64 packages needs root (dpkg --add-architecture arm64)"
    say "adding the arm64 architecture to dpkg"
    dpkg --add-architecture arm64
    apt-get update -qq >/dev/null
  fi
  (cd "$2" && { apt-get download -qq -o APT::Sandbox::User=root "$1:arm64" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get download -qq -o APT::Sandbox::User=root "$1:arm64" >/dev/null; }; }) \
    || die "cannot download $1:arm64"
}

setup_busybox_arm64_image() {
  image_exists "$BUSYBOX_ARM64_IMAGE" && return 0
  local tmp bb
  tmp=$(mktemp -d); TMPDIRS+=("$tmp")
  apt_download_arm64 busybox-static "$tmp"
  dpkg-deb -x "$tmp"/busybox-static_*_arm64.deb "$tmp/deb"
  bb=$tmp/deb/bin/busybox
  mkdir -p "$tmp/rootfs/bin" "$tmp/rootfs/etc" "$tmp/rootfs/tmp" "$tmp/rootfs/root" "$tmp/layer"
  cp "$bb" "$tmp/rootfs/bin/busybox"
  for applet in $("$bb" --list); do  # the arm64 busybox itself, so this also proves the emulation works
    [ "$applet" = busybox ] || ln -sf busybox "$tmp/rootfs/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$tmp/rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/rootfs/etc/group"
  chmod 1777 "$tmp/rootfs/tmp"
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$tmp/rootfs" -cf "$tmp/layer/layer.tar" .
  load_rootfs_image "$BUSYBOX_ARM64_IMAGE" "$tmp/layer/layer.tar" arm64 v8 /bin '["/bin/sh"]'
}

debootstrap_arm64_images() {
  # The demo's arm64 base (minbase + python3) and builder (the same + gcc, g++, make). debootstrap
  # --arch=arm64 runs its second stage under emulation (about 5 minutes here); the builder is that
  # rootfs plus apt-get install in a chroot (under 2 minutes), not a second debootstrap.
  local probe='command -v g++ && command -v make' old=()
  if image_exists "$DEMO_BASE_ARM64_IMAGE" && image_exists "$DEMO_BUILDER_ARM64_IMAGE"; then
    docker run --rm --network none "$DEMO_BUILDER_ARM64_IMAGE" sh -c "$probe" >/dev/null 2>&1 && return 0
    say "$DEMO_BUILDER_ARM64_IMAGE lacks what it needs now ($probe): building the arm64 images again"
    old=("$(docker image inspect --format '{{.Id}}' "$DEMO_BASE_ARM64_IMAGE")"
         "$(docker image inspect --format '{{.Id}}' "$DEMO_BUILDER_ARM64_IMAGE")")
  fi
  is_root || die "building the arm64 base images needs root (debootstrap, chroot): run this script as root"
  apt_install debootstrap
  local tmp cache root
  cache=${UNIBAKE_CACHE:-$ROOT/.cache}/debootstrap
  mkdir -p "$cache"
  tmp=$(mktemp -d); TMPDIRS+=("$tmp")
  say "debootstrap --arch=arm64 $SUITE minbase with python3, under emulation (about 5 minutes)"
  debootstrap --arch=arm64 --variant=minbase --include=python3 --cache-dir="$cache" \
    "$SUITE" "$tmp/base" "$(debian_mirror)" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -n 20 "$tmp/debootstrap.log" >&2; die "debootstrap --arch=arm64 failed"; }
  cp -a "$tmp/base" "$tmp/builder"
  say "adding gcc, g++ and make to the arm64 builder, under emulation (about 2 minutes)"
  { chroot "$tmp/builder" apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive chroot "$tmp/builder" apt-get install -y -qq --no-install-recommends gcc g++ make libc6-dev
  } >"$tmp/apt.log" 2>&1 || { tail -n 20 "$tmp/apt.log" >&2; die "apt-get install gcc g++ make in the arm64 builder failed"; }
  mkdir -p "$tmp/layers"
  for part in base builder; do
    rm -rf "$tmp/$part/var/cache/apt/archives/"*.deb "$tmp/$part/var/lib/apt/lists/"* \
           "$tmp/$part/var/log/"*.log "$tmp/$part/debootstrap"
    : >"$tmp/$part/etc/resolv.conf"  # the build host's resolver; the engine supplies one at run time
    mkdir -p "$tmp/layers/$part"
    tar --numeric-owner -C "$tmp/$part" -cf "$tmp/layers/$part/layer.tar" .
  done
  local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  load_rootfs_image "$DEMO_BASE_ARM64_IMAGE" "$tmp/layers/base/layer.tar" arm64 v8 "$path" '["/bin/bash"]'
  load_rootfs_image "$DEMO_BUILDER_ARM64_IMAGE" "$tmp/layers/builder/layer.tar" arm64 v8 "$path" '["/bin/bash"]'
  # the images they replace go, unless build cache still grows from them (then they go with that cache)
  if [ ${#old[@]} -gt 0 ]; then docker rmi "${old[@]}" >/dev/null 2>&1 || true; fi
}

main() {
  setup_venv
  [ "${1:-}" = --venv ] && return 0
  apt_install zstd gpg gpgv minisign  # zstd for archives; gpg, gpgv and minisign sign and verify releases
  # the registry tests: the distribution registry, bcrypt htpasswd, a CA made with openssl, relays into netns
  apt_install docker-registry apache2-utils openssl socat
  setup_engine
  setup_busybox_image
  debootstrap_image "$DEMO_BASE_IMAGE" python3
  # a second toolchain (g++) and make: kernels built by a command or a Makefile target
  debootstrap_image "$DEMO_BUILDER_IMAGE" python3,gcc,g++,make,libc6-dev 'command -v g++ && command -v make'
  setup_emulation
  setup_busybox_arm64_image
  debootstrap_arm64_images
  say "ready: $(docker version --format 'engine {{.Server.Version}}') at ${DOCKER_HOST:-the default socket}"
}

main "$@"
