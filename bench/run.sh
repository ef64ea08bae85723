#!/usr/bin/env bash
# Runs every benchmark and rewrites docs/performance.md and docs/img/*.png from the results.
#   bash bench/run.sh [BUILD_DIR] [report.py options, e.g. --runs 5 --gib 1 --dir /var/tmp]
# BUILD_DIR defaults to build (configured with the default -Dbench=true). The torch peer and the
# plots need Debian's python3-torch and python3-matplotlib, the deep-queue baselines fio and the
# HDF5 peer libhdf5-dev, installed here when missing (root).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
if ! /usr/bin/python3 -c 'import torch, matplotlib' 2>/dev/null; then
  apt-get install -y -q python3-torch python3-matplotlib >/dev/null
fi
# fio gives the deep-queue baselines of save_vs_raw, libhdf5-dev the HDF5 peer (issue 24).
command -v fio >/dev/null || apt-get install -y -q fio >/dev/null
dpkg -s libhdf5-dev >/dev/null 2>&1 || apt-get install -y -q libhdf5-dev >/dev/null
# Benchmarks measure what a user's default build gets: -O2, header-only. (tools/dev.sh test
# builds the same directory at -Og with separate compilation, to compile faster.)
meson setup --reconfigure "$build" >/dev/null  # finds the peers installed above
meson configure "$build" -Doptimization=2 -Dseparate_compilation=false >/dev/null
meson compile -C "$build" >/dev/null
/usr/bin/python3 bench/report.py --build "$build" "$@"
