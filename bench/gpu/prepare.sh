#!/usr/bin/env bash
# Builds, on a CPU machine with the CUDA toolkit and NCCL's headers, exactly what a GPU machine
# needs to run bench/gpu/device_run.sh with no compiler there (issue 20), and checks it:
#
#   bash bench/gpu/prepare.sh [--carry DIR] [--from-build BUILD_DIR]
#
# DIR (default .gpu-carry, ignored by git) receives bin/ (test_cuda_runtime, test_nccl_real,
# gpu_proof, gpu_proof_nccl, linked with a static C++ runtime) and lib/ (the shared libraries
# they need that a GPU machine's image may lack: the proofs' kernels, the CUDA runtime they were
# built against, zstd, xxHash; never glibc, the C++ runtime, the CUDA driver or NCCL, which the
# GPU machine provides), and manifest.txt (commit, files, sizes, checksums, the newest glibc symbol version
# needed). It fails when DIR and the repository's tracked files together pass the 64 MiB a
# device run carries. Then it runs device_run.sh on the carried files against the fake CUDA
# runtime and NCCL (tests/cuda/fake_libs), at one fake GPU and at two, so a broken preparation
# is found here, not on the lent machine.
#
# --from-build BUILD_DIR collects from an existing build (configured with -Dgpu_carry=true for
# the static C++ runtime) instead of building build-gpu-carry.
set -euo pipefail
cd "$(dirname "$0")/../.."

carry=.gpu-carry
from_build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --carry) carry=$2; shift ;;
    --from-build) from_build=$2; shift ;;
    *) echo "prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

export PATH=/usr/local/cuda/bin:$PATH
targets=(tests/cuda/test_cuda_runtime tests/cuda/test_nccl_real bench/gpu_proof bench/gpu_proof_nccl
         tests/cuda/fake_libs/cudart tests/cuda/fake_libs/nccl tests/cuda/fake_libs/gpu_proof_kernels)
if [ -z "$from_build" ]; then
  build=${BUILD_DIR:-build-gpu-carry}
  command -v meson >/dev/null || { echo "prepare.sh: meson is missing (bash tools/dev.sh test installs what ckpt builds with)" >&2; exit 1; }
  opts=(-Dcuda=enabled -Dgpu_carry=true -Dtests=true -Dbench=true -Dexamples=false -Dtools=false -Ds3=disabled -Dmpi=disabled
        -Dwerror=true -Doptimization=2 -Ddebug=false)
  if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" "${opts[@]}" >/dev/null
  else
    meson setup "$build" "${opts[@]}" >/dev/null
  fi
  meson compile -C "$build" "${targets[@]}"
else
  build=$from_build
fi

rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib"
cp "$build/tests/cuda/test_cuda_runtime" "$build/tests/cuda/test_nccl_real" "$build/bench/gpu_proof" "$build/bench/gpu_proof_nccl" "$carry/bin/"
cp "$build/bench/libgpu_proof_kernels.so" "$carry/lib/"

# The shared libraries they load, less those the GPU machine must provide itself.
# (The kernels' library takes only CXXABI_1.3 symbols from the C++ runtime, which every
# libstdc++ has: the machine's own, likely newer, must not be shadowed by this one's.)
provided='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libnccl\.so|libcuda\.so|libstdc\+\+\.so|libgcc_s\.so|libgpu_proof_kernels\.so)'
for f in "$carry"/bin/* "$carry/lib/libgpu_proof_kernels.so"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $provided ]] && continue
  cp -L "$path" "$carry/lib/$name"
done

# Nothing in bin/ may still need the C++ runtime of this machine (prepare's -Dgpu_carry).
for f in "$carry"/bin/*; do
  if readelf -d "$f" | grep NEEDED | grep -q 'libstdc++'; then
    echo "prepare.sh: $f links libstdc++ dynamically: configure $build with -Dgpu_carry=true" >&2
    exit 1
  fi
done

glibc=$(for f in "$carry"/bin/* "$carry"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
{
  echo "ckpt $(git describe --always --dirty 2>/dev/null || echo unknown), prepared $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME"); needs $glibc or newer"
  (cd "$carry" && find bin lib -type f -printf '%s\t%p\n' | sort -k2 | while IFS=$'\t' read -r size path; do
    printf '%s\t%s\t%s\n' "$path" "$size" "$(sha256sum "$path" | cut -c1-16)"
  done)
} >"$carry/manifest.txt"

# A device run carries the tracked files, untracked ones git does not ignore, and DIR.
carried=$(du -sb "$carry" | cut -f1)
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=$( (git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1) || echo 0)
total=$((carried + tracked + ${untracked:-0}))
limit=$((64 << 20))
printf 'prepare.sh: %s is %.1f MiB; with the repository %.1f MiB of the %d MiB a device run carries\n' \
  "$carry" "$(echo "$carried / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)" 64
if [ "$total" -gt "$limit" ]; then
  echo "prepare.sh: too large to carry" >&2
  exit 1
fi

# The carried files, run end to end here on the fake CUDA runtime and NCCL: at one GPU (the
# multi-rank parts must say not-run) and at two (they run).
check_dir=$(mktemp -d /tmp/ckpt-prepare.XXXXXX)
trap 'rm -rf "$check_dir"' EXIT
for gpus in 1 2; do
  if ! CKPT_FAKE_GPUS=$gpus OUT=$check_dir/out$gpus bash bench/gpu/device_run.sh --quick --carry "$carry" --dir "$check_dir/ckpt" \
       --fake-libs "$build/tests/cuda/fake_libs" -- --big-mib 64 --reps 1 >"$check_dir/log$gpus" 2>&1; then
    cat "$check_dir/log$gpus"
    echo "prepare.sh: device_run.sh failed on the fakes at $gpus GPU(s)" >&2
    exit 1
  fi
done
echo "prepare.sh: device_run.sh --quick ran end to end on the fakes at 1 and 2 GPUs; carry $carry to the GPU machine:"
echo "  run(command: 'bash bench/gpu/device_run.sh --quick', carry: ['$carry'])"
