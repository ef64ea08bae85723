#!/usr/bin/env bash
# The GPU proof (issue 8): builds bench/gpu/gpu_proof and runs it (NCCL on every GPU present,
# the rest on GPU 0), within 8 minutes on
# one H200: round trips of device tensors of every dtype from 1 byte to 4 GiB (to disk and
# back, and into host memory), ordering with the user's stream, save_async with the tensor
# overwritten at once, NCCL at one rank per GPU (collectives, gather_to_root save, scattered
# load, save_async), then throughput against cudaMemcpy and a raw write. Prints one table.
#   bash bench/gpu/run.sh [DIR]   (DIR: local disk for the checkpoints, default /tmp/ckpt-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-gpu}
dir=${1:-/tmp/ckpt-gpu}
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -x "$build/bench/gpu_proof" ]; then
  meson setup "$build" -Dcuda=enabled -Dtests=false -Dexamples=false -Dtools=false -Ds3=disabled -Dmpi=disabled >/dev/null
  meson compile -C "$build" bench/gpu_proof
fi
mkdir -p "$dir"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 480 "$build/bench/gpu_proof" "$dir" --big-gib "${BIG_GIB:-4}"
