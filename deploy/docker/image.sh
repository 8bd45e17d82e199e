#!/usr/bin/env bash
# Builds tensorgate's container image and runs commands against it, on a machine with a Docker
# engine or one where this script can start Debian's (`make image` and `make image-test` call it).
#
#   image.sh build [docker build options]   the CPU image, tagged tensorgate:<pyproject version>
#   image.sh run COMMAND...                 COMMAND with the engine up; DOCKER and TENSORGATE_IMAGE
#                                           name the client and the image
#
# The engine: one that answers is used as it is. Otherwise, as root on Debian, the script
# installs docker.io (and debootstrap), starts dockerd without a bridge or iptables rules, and
# stops that dockerd, by its pid, when it exits. Every build and container uses the host network,
# so no container network is ever created.
#
# The base: PYTHON_IMAGE names the image the Dockerfile builds on. Left empty, it is a local
# Debian base made by base.sh (no registry needed), imported once and cached: the tar file under
# $TENSORGATE_IMAGE_CACHE (default ~/.cache/tensorgate-image), the image in the engine, both named
# by a digest of base.sh and of this machine's CA bundle and apt sources. Pass
# PYTHON_IMAGE=python:3.11-slim-bookworm to build on the official image instead (needs Docker Hub).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n 1)
image=${IMAGE:-tensorgate:$version}
cache=${TENSORGATE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tensorgate-image}
dockerd_pid=

log() { echo "image.sh: $*" >&2; }

apt_install() {
  local missing=()
  for package in "$@"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "needs ${missing[*]}: install them (Debian) or start a Docker engine yourself"
    exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
}

# A client that builds with BuildKit (the Dockerfile bind-mounts one stage into another): one with
# buildx, or a classic one (before 23) with DOCKER_BUILDKIT=1. Debian's docker.io is the latter.
pick_client() {
  local candidate
  for candidate in ${DOCKER:-} docker /usr/bin/docker; do
    command -v "$candidate" >/dev/null || continue
    if "$candidate" buildx version >/dev/null 2>&1; then
      DOCKER=$(command -v "$candidate")
      return
    fi
    local major
    major=$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1 || true)
    if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then
      DOCKER=$(command -v "$candidate")
      return
    fi
  done
  DOCKER=
}

stop_engine() {
  [ -n "$dockerd_pid" ] || return 0
  log "stopping the dockerd this script started (pid $dockerd_pid)"
  kill -TERM "$dockerd_pid" 2>/dev/null || true
  for _ in $(seq 300); do
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$dockerd_pid" 2>/dev/null; then
    log "dockerd $dockerd_pid did not stop within 30 s; killing it"
    kill -KILL "$dockerd_pid" 2>/dev/null || true
  fi
  wait "$dockerd_pid" 2>/dev/null || true
  dockerd_pid=
}

start_engine() {
  pick_client
  if [ -n "$DOCKER" ] && "$DOCKER" info >/dev/null 2>&1; then
    return
  fi
  apt_install docker.io
  pick_client
  [ -n "$DOCKER" ] || { log "no Docker client that builds with BuildKit"; exit 1; }
  if "$DOCKER" info >/dev/null 2>&1; then
    return
  fi
  mkdir -p "$cache"
  log "starting dockerd (log: $cache/dockerd.log)"
  dockerd --bridge=none --iptables=false >"$cache/dockerd.log" 2>&1 &
  dockerd_pid=$!
  trap stop_engine EXIT
  trap 'exit 130' INT TERM
  for _ in $(seq 600); do
    "$DOCKER" info >/dev/null 2>&1 && return
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 30 "$cache/dockerd.log" >&2
  log "dockerd did not answer within 60 s"
  exit 1
}

# The local base: made once, then taken from the engine or, on an engine that lost it, from the
# cached tar file.
local_base() {
  local key inputs=("$here/base.sh")
  for input in /etc/ssl/certs/ca-certificates.crt /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    [ -f "$input" ] && inputs+=("$input")
  done
  key=$(cat "${inputs[@]}" | sha256sum | cut -c1-12)
  base_image=tensorgate-base:bookworm-$key
  if "$DOCKER" image inspect "$base_image" >/dev/null 2>&1; then
    return
  fi
  local tarball=$cache/base-bookworm-$key.tar
  if [ ! -f "$tarball" ]; then
    if [ "$(id -u)" != 0 ]; then
      log "the local base is made with debootstrap, as root; or build on the official image:"
      log "  make image PYTHON_IMAGE=python:3.11-slim-bookworm"
      exit 1
    fi
    apt_install debootstrap
    mkdir -p "$cache"
    log "making the local base (debootstrap, a few minutes; cached in $tarball)"
    nice bash "$here/base.sh" "$tarball"
  fi
  log "importing $tarball as $base_image"
  "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$tarball" "$base_image" >/dev/null
}

build() {
  local python_image=${PYTHON_IMAGE:-}
  if [ -z "$python_image" ]; then
    local_base
    python_image=$base_image
  fi
  log "building $image on $python_image"
  local started=$SECONDS
  DOCKER_BUILDKIT=1 nice "$DOCKER" build --network host -f "$here/Dockerfile" \
    --build-arg PYTHON_IMAGE="$python_image" -t "$image" "$@" "$root"
  local size
  size=$("$DOCKER" image inspect -f '{{.Size}}' "$image")
  log "built $image: $((size / 1000000)) MB, in $((SECONDS - started)) s"
  cat >&2 <<EOF
image.sh: the gpu and cann variants are not built here (they need NVIDIA's CUDA libraries or
  Huawei's CANN toolkit, and a device to test them on). Elsewhere, from the repository root:
    docker build -f deploy/docker/Dockerfile --build-arg VARIANT=gpu -t tensorgate:$version-gpu .
    docker build -f deploy/docker/Dockerfile --build-arg VARIANT=cann \\
      --build-arg PYTHON_IMAGE=<an image with CANN and CPython 3.11> \\
      --build-arg RUNTIME_IMAGE=<the same image> -t tensorgate:$version-cann .
EOF
}

case "${1:-}" in
  build)
    shift
    start_engine
    build "$@"
    ;;
  run)
    shift
    [ $# -gt 0 ] || { log "usage: image.sh run COMMAND..."; exit 2; }
    start_engine
    "$DOCKER" image inspect "$image" >/dev/null 2>&1 || { log "no image $image: run make image first"; exit 1; }
    # Not exec: this shell stops the dockerd it started once the command ends.
    status=0
    DOCKER=$DOCKER TENSORGATE_IMAGE=$image "$@" || status=$?
    exit "$status"
    ;;
  *)
    log "usage: image.sh build [docker build options] | image.sh run COMMAND..."
    exit 2
    ;;
esac
