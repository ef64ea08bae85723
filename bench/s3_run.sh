#!/usr/bin/env bash
# S3 throughput: ckpt's save to and load from s3rver on 127.0.0.1 with 1, 4 and 8 requests in
# flight, against `aws s3 cp` of the same files in the same run. Prints a markdown table.
#   bash bench/s3_run.sh [BUILD_DIR] [--mib 1024] [--runs 3]
# Needs what `bash tools/dev.sh test` installs (s3rver in tests/s3/node_modules, awscli).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
meson compile -C "$build" bench/s3_throughput >/dev/null
/usr/bin/python3 tests/s3/harness.py -- "$build/bench/s3_throughput" "$@"
