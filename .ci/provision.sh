#!/usr/bin/env bash
# Provision what modak's tests and quickstart need on a fresh Debian 12 machine (run as root):
# Python packages, Podman with a Docker-compatible API socket, a local Debian base image, a local registry
# (docker-registry on 127.0.0.1:5000, plain HTTP), a second one that requires a login (127.0.0.1:5001, htpasswd,
# plain HTTP), a single-node Slurm (munge, slurmctld, slurmd) and Apptainer (.ci/apptainer where the host cannot
# install it).
# Idempotent: each step checks whether it is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

MODAK_PODMAN_SOCKET=${MODAK_PODMAN_SOCKET:-/run/modak/podman.sock}
BASE_IMAGE=${MODAK_BASE_IMAGE:-localhost/debian-base:bookworm}
MODAK_REGISTRY_PORT=${MODAK_REGISTRY_PORT:-5000}
# The registry that requires a login: test credentials, for loopback only (tests/test_build.py has the same defaults).
MODAK_AUTH_REGISTRY_PORT=${MODAK_AUTH_REGISTRY_PORT:-5001}
MODAK_AUTH_REGISTRY_USER=${MODAK_AUTH_REGISTRY_USER:-modak-push}
MODAK_AUTH_REGISTRY_PASSWORD=${MODAK_AUTH_REGISTRY_PASSWORD:-Zq7-modak-registry-secret-w9pL}

log() { printf '[provision] %s\n' "$*" >&2; }

python_packages() {
  # torch first, pinned: the local CPU wheel. An unpinned torch would pull the CUDA build.
  python3 -m pip install -q torch==2.13.0
  python3 -m pip install -q -e ".[test,torch,runtimes,serve,docs]"
}

apt_packages() {
  install_missing podman buildah runc debootstrap uidmap slirp4netns fuse-overlayfs libjemalloc2
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

opera() {
  # xOpera (TOSCA orchestrator) for the TOSCA integration tests, in its own venv: `pip install opera` fails on
  # Python 3.11 (opera 0.7.0 pins pyyaml<=5.4.1), so its dependencies come first and opera without them.
  local venv=${MODAK_OPERA_VENV:-/opt/modak-opera}
  if [ -x "$venv/bin/opera" ] && [ -x "$venv/bin/ansible-playbook" ] && "$venv/bin/opera" --version >/dev/null 2>&1; then
    return 0
  fi
  log "installing xOpera 0.7.0 into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "pyyaml>=6" "ansible-core>=2.16,<2.20" "shtab>=1.5.5"
  "$venv/bin/pip" install -q --no-deps opera==0.7.0 opera-tosca-parser==0.2.2
  "$venv/bin/opera" --version >/dev/null
}

install_missing() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

registries_conf() {
  # The local registries speak plain HTTP on loopback: tell Podman (and buildah, skopeo) they are insecure.
  # Runs before podman_service: a running service keeps the registries.conf it read first.
  mkdir -p /etc/containers/registries.conf.d
  local conf=/etc/containers/registries.conf.d/50-modak-local-registry.conf text port
  text="# Written by modak's .ci/provision.sh: the local test registries (docker-registry on loopback, no TLS)."
  for port in "$MODAK_REGISTRY_PORT" "$MODAK_AUTH_REGISTRY_PORT"; do
    text+=$'\n\n[[registry]]\n'"location = \"localhost:$port\""$'\ninsecure = true\n\n[[registry]]\n'
    text+="location = \"127.0.0.1:$port\""$'\ninsecure = true'
  done
  if [ "$(cat "$conf" 2>/dev/null)" != "$text" ]; then
    printf '%s\n' "$text" > "$conf"
  fi
}

registry() {
  # Debian's docker-registry (distribution 2.8) on 127.0.0.1:$MODAK_REGISTRY_PORT only, no TLS.
  install_missing docker-registry
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true  # the package's own one listens on all interfaces
  fi
  mkdir -p /etc/modak /var/lib/modak-registry
  cat > /etc/modak/registry.yml <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /var/lib/modak-registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$MODAK_REGISTRY_PORT
CONF
  if ! curl -sf "http://127.0.0.1:$MODAK_REGISTRY_PORT/v2/" >/dev/null 2>&1; then
    log "starting docker-registry on 127.0.0.1:$MODAK_REGISTRY_PORT"
    nohup docker-registry serve /etc/modak/registry.yml >/var/log/modak-registry.log 2>&1 </dev/null &
    for _ in $(seq 50); do
      curl -sf "http://127.0.0.1:$MODAK_REGISTRY_PORT/v2/" >/dev/null 2>&1 && break
      sleep 0.2
    done
    curl -sf "http://127.0.0.1:$MODAK_REGISTRY_PORT/v2/" >/dev/null || { log "docker-registry did not start"; return 1; }
  fi
}

auth_registry() {
  # A second docker-registry (distribution 2.8) on 127.0.0.1:$MODAK_AUTH_REGISTRY_PORT that requires a login:
  # htpasswd (bcrypt) with the test credentials above. Plain HTTP on loopback: distribution allows basic auth
  # without TLS, and modak pushes to loopback registries with tlsVerify=false.
  install_missing docker-registry apache2-utils
  local port=$MODAK_AUTH_REGISTRY_PORT users=/etc/modak/auth-registry.htpasswd
  mkdir -p /etc/modak /var/lib/modak-auth-registry
  if ! htpasswd -vb "$users" "$MODAK_AUTH_REGISTRY_USER" "$MODAK_AUTH_REGISTRY_PASSWORD" >/dev/null 2>&1; then
    htpasswd -Bbc "$users" "$MODAK_AUTH_REGISTRY_USER" "$MODAK_AUTH_REGISTRY_PASSWORD" 2>/dev/null
  fi
  cat > /etc/modak/auth-registry.yml <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /var/lib/modak-auth-registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
auth:
  htpasswd:
    realm: modak-test
    path: $users
CONF
  local login=(-sf -u "$MODAK_AUTH_REGISTRY_USER:$MODAK_AUTH_REGISTRY_PASSWORD" "http://127.0.0.1:$port/v2/")
  if ! curl "${login[@]}" >/dev/null 2>&1; then
    if curl -s "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; then
      log "something on 127.0.0.1:$port refuses the test credentials (a registry started with other ones?): stop it"
      return 1
    fi
    log "starting docker-registry with htpasswd auth on 127.0.0.1:$port"
    nohup docker-registry serve /etc/modak/auth-registry.yml >/var/log/modak-auth-registry.log 2>&1 </dev/null &
    for _ in $(seq 50); do
      curl "${login[@]}" >/dev/null 2>&1 && break
      sleep 0.2
    done
    curl "${login[@]}" >/dev/null || { log "docker-registry with auth did not start"; return 1; }
  fi
}

slurm() {
  # A single-node Slurm: munge, slurmctld and slurmd on this host; jobs run as the user who submits them.
  install_missing slurmctld slurmd slurm-client munge iproute2  # iproute2: the two-node test's namespaces
  local host cpus state=/var/spool/modak-slurm conf
  host=$(hostname -s)
  cpus=$(nproc)
  mkdir -p "$state/ctld" "$state/d" /etc/slurm /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey -c >/dev/null 2>&1
  fi
  chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    munged --force
  fi
  conf="# Written by modak's .ci/provision.sh: a single-node Slurm for tests.
ClusterName=local
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=/var/log/modak-slurmctld.log
SlurmdLogFile=/var/log/modak-slurmd.log
ReturnToService=2
MinJobAge=3600
NodeName=$host CPUs=$cpus RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP"
  if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$conf" ]; then
    printf '%s\n' "$conf" > /etc/slurm/slurm.conf
  fi
  # By their pid files: other Slurm daemons may run here (tests/test_two_nodes.py starts a cluster of its own).
  if ! kill -0 "$(cat "$state/slurmctld.pid" 2>/dev/null)" 2>/dev/null; then
    log "starting slurmctld"
    nohup slurmctld -D >/dev/null 2>&1 </dev/null &
  fi
  if ! kill -0 "$(cat "$state/slurmd.pid" 2>/dev/null)" 2>/dev/null; then
    log "starting slurmd"
    nohup slurmd -D >/dev/null 2>&1 </dev/null &
  fi
  for _ in $(seq 100); do
    sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)' && return 0
    sleep 0.3
  done
  log "Slurm reports no usable node: $(sinfo -h -N -o '%N %T %E' 2>&1)"
  return 1
}

apptainer_install() {
  # Apptainer (Debian unstable's 1.4): a site's native apptainer or singularity is used as it is. Otherwise, as on
  # Debian 12, whose glibc is too old for it, a debootstrapped sid root with Apptainer becomes the Podman image
  # $MODAK_APPTAINER_IMAGE, and .ci/apptainer (installed as /usr/local/bin/apptainer) runs it with the mounts a
  # build or run needs.
  local image=${MODAK_APPTAINER_IMAGE:-localhost/apptainer:sid} wrapper=/usr/local/bin/apptainer native
  native=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vx /usr/local/bin | paste -sd: -) \
    command -v apptainer singularity 2>/dev/null | head -n 1 || true)
  if [ -n "$native" ]; then
    log "using the installed $native"
    return 0
  fi
  if ! podman image exists "$image"; then
    log "building $image: Apptainer from Debian sid, with debootstrap (about 2 minutes)"
    local root
    root=$(mktemp -d /var/tmp/modak-apptainer-root.XXXXXX)
    debootstrap --variant=minbase \
      --include=apptainer,squashfs-tools,squashfuse,fuse3,fuse2fs,gocryptfs,ca-certificates \
      sid "$root" http://deb.debian.org/debian >/var/log/modak-debootstrap-sid.log 2>&1
    cp /etc/hosts "$root/etc/hosts"  # `apptainer build` needs it
    tar -C "$root" -c . | podman import - "$image" >/dev/null
    rm -rf "$root"
  fi
  if ! cmp -s .ci/apptainer "$wrapper"; then
    install -m 0755 .ci/apptainer "$wrapper"
  fi
  "$wrapper" --version >/dev/null
}

chromium() {
  # A headless browser for tests/test_report.py (the HTML report is opened and its plots checked) and
  # tests/test_docs.py (Playwright drives it: executable_path, no `playwright install` download).
  install_missing chromium chromium-driver
}

main() {
  python_packages
  apt_packages
  podman_config
  registries_conf
  podman_service
  base_image
  registry
  auth_registry
  slurm
  opera
  apptainer_install
  chromium
  log "ready: DOCKER_HOST=unix://$MODAK_PODMAN_SOCKET, base image $BASE_IMAGE"
}

if [ "$#" -gt 0 ]; then "$@"; else main; fi
