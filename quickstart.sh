#!/usr/bin/env bash
# One command on a fresh Debian 12 machine (as root): install modak and what it needs, then plan and
# build the bundled example (an MNIST-style CNN, inference, on this machine's CPU) for real: rendered into
# out/mnist-cnn, built by Podman, labelled and smoke-tested.
set -euo pipefail
cd "$(dirname "$0")"
.ci/provision.sh
JOB=examples/mnist-cnn-cpu/job.yaml
modak plan "$JOB"
export DOCKER_HOST=${DOCKER_HOST:-unix:///run/modak/podman.sock}
modak build "$JOB" -o out/mnist-cnn
