#!/usr/bin/env bash
# Runs the benchmarks and prints their tables (docs/performance.md records a run of it).
#   bash bench/run.sh [BUILD_DIR]      (default: build; configure and compile it first)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
meson compile -C "$build" commit_scale save_scaling >/dev/null

echo "## Commit and load planning at scale (bench/commit_scale, 1000 tensors, medians of 3)"
"$build/bench/commit_scale" --tensors 1000 --ranks 256,512,1024,2048,4096 --runs 3

echo
echo "## Aggregate save throughput vs one process writing the same bytes raw (bench/save_scaling, 512 MiB, medians of 5)"
mpi=(mpirun --oversubscribe)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
for np in 1 2 4; do
  OMPI_MCA_btl=self,vader "${mpi[@]}" -np "$np" "$build/bench/save_scaling" --mib 512 --runs 5
done
