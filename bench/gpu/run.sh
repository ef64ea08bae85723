#!/usr/bin/env bash
# The GPU proof, the old way in: prepares the carried build if it is not there (which needs a
# compiler, the CUDA toolkit and ckpt's build dependencies), then runs the one device command.
# On a lent GPU machine run bench/gpu/device_run.sh directly, from a build prepared on the CPU
# machine with bench/gpu/prepare.sh (docs/performance.md, "GPU").
#
#   bash bench/gpu/run.sh [--quick] [device_run.sh's other options]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .gpu-carry/bin ] || bash bench/gpu/prepare.sh
exec bash bench/gpu/device_run.sh "$@"
