#!/usr/bin/env bash
# One command on a fresh Debian 12 machine (as root): install modak and what it needs, then plan and
# render the bundled example (an MNIST-style CNN, inference, on this machine's CPU) into out/mnist-cnn.
set -euo pipefail
cd "$(dirname "$0")"
.ci/provision.sh
JOB=examples/mnist-cnn-cpu/job.yaml
modak plan "$JOB"
modak render "$JOB" -o out/mnist-cnn
