#!/usr/bin/env bash
# Provision what modak's tests and quickstart need on a fresh Debian 12 machine (run as root):
# Python packages, Podman with a Docker-compatible API socket, and a local Debian base image.
# Idempotent: each step checks whether it is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

MODAK_PODMAN_SOCKET=${MODAK_PODMAN_SOCKET:-/run/modak/podman.sock}
BASE_IMAGE=${MODAK_BASE_IMAGE:-localhost/debian-base:bookworm}

log() { printf '[provision] %s\n' "$*" >&2; }

python_packages() {
  # torch first, pinned: the local CPU wheel. An unpinned torch would pull the CUDA build.
  python3 -m pip install -q torch==2.13.0
  python3 -m pip install -q -e ".[test,torch]"
}

apt_packages() {
  local missing=()
  for pkg in podman buildah runc debootstrap uidmap slirp4netns fuse-overlayfs libjemalloc2; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

podman_config() {
  # crun fails on this machine kind (cgroups in hybrid mode); default rlimits exceed the hard limits.
  mkdir -p /etc/containers
  if ! grep -q 'runtime = "runc"' /etc/containers/containers.conf 2>/dev/null; then
    cat > /etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
CONF
  fi
}

podman_service() {
  mkdir -p "$(dirname "$MODAK_PODMAN_SOCKET")"
  if ! curl -sf --unix-socket "$MODAK_PODMAN_SOCKET" http://d/_ping >/dev/null 2>&1; then
    log "starting podman system service on $MODAK_PODMAN_SOCKET"
    rm -f "$MODAK_PODMAN_SOCKET"
    nohup podman system service --time=0 "unix://$MODAK_PODMAN_SOCKET" >/var/log/modak-podman.log 2>&1 &
    for _ in $(seq 50); do
      curl -sf --unix-socket "$MODAK_PODMAN_SOCKET" http://d/_ping >/dev/null 2>&1 && break
      sleep 0.2
    done
  fi
}

base_image() {
  if ! podman image exists "$BASE_IMAGE"; then
    log "building $BASE_IMAGE with debootstrap (about 2 minutes)"
    local rootfs
    rootfs=$(mktemp -d /var/tmp/modak-rootfs.XXXXXX)
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/var/log/modak-debootstrap.log 2>&1
    tar -C "$rootfs" -c . | podman import - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
  fi
}

main() {
  python_packages
  apt_packages
  podman_config
  podman_service
  base_image
  log "ready: DOCKER_HOST=unix://$MODAK_PODMAN_SOCKET, base image $BASE_IMAGE"
}

if [ "$#" -gt 0 ]; then "$@"; else main; fi
