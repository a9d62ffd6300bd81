#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: the Python venv, a Docker engine that answers, and the
# local base images the demo product and the tests build on (nothing can be pulled here).
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
  setsid nohup dockerd >"$log" 2>&1 </dev/null &
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

main() {
  setup_venv
  [ "${1:-}" = --venv ] && return 0
  apt_install zstd
  setup_engine
  setup_busybox_image
  debootstrap_image "$DEMO_BASE_IMAGE" python3
  # a second toolchain (g++) and make: kernels built by a command or a Makefile target
  debootstrap_image "$DEMO_BUILDER_IMAGE" python3,gcc,g++,make,libc6-dev 'command -v g++ && command -v make'

  say "ready: $(docker version --format 'engine {{.Server.Version}}') at ${DOCKER_HOST:-the default socket}"
}

main "$@"
