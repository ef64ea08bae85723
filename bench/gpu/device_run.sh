#!/usr/bin/env bash
# The one command for a GPU machine (issue 20): runs the real-GPU tests and both GPU proofs from
# the build bench/gpu/prepare.sh made on a CPU machine and carried over (no compiler needed
# there), within 6 minutes (2 with --quick), and writes every result row as soon as it is
# measured to $OUT/results.tsv (tab-separated: status, section, what, value, detail; status is
# ok, FAIL, not-run, figure, info or time), the whole log to $OUT/device_run.log and a Markdown
# table of the rows to $OUT/summary.md. Each program runs under its own time limit, set above
# the NCCL timeout it is given, so a stall is reported by ckpt's watchdog (NCCL_DEBUG=WARN).
#
#   bash bench/gpu/device_run.sh [--quick] [--carry DIR] [--dir CKPT_DIR] [--fake-libs DIR] [-- PROOF_ARGS...]
#
#   --quick        1 GiB largest tensor, 3 repetitions (the first run on a lent machine)
#   --carry DIR    what prepare.sh made (default .gpu-carry): DIR/bin and DIR/lib
#   --dir DIR      local disk for the checkpoints (default /tmp/ckpt-gpu)
#   --fake-libs D  run on the fake CUDA runtime and NCCL of tests/cuda/fake_libs (D holds them),
#                  with CKPT_FAKE_GPUS GPUs (default 1): the whole command, end to end, here
#   PROOF_ARGS     passed to both proofs last (e.g. -- --big-mib 64 --reps 1 on the fakes)
#
# Exit status: 0 when everything ran and passed; 1 when anything failed, timed out or could not
# start; 77 when there is no usable GPU (every program said so).
set -uo pipefail
cd "$(dirname "$0")/../.."

quick=0
carry=.gpu-carry
ckpt_dir=/tmp/ckpt-gpu
fake_libs=""
proof_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --carry) carry=$2; shift ;;
    --dir) ckpt_dir=$2; shift ;;
    --fake-libs) fake_libs=$2; shift ;;
    --) shift; proof_args=("$@"); break ;;
    *) echo "device_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

out=${OUT:-$PWD/build/device-run}
mkdir -p "$out" "$ckpt_dir"
results=$out/results.tsv
log=$out/device_run.log
: >"$results"
: >"$log"
exec > >(tee -a "$log") 2>&1
start=$SECONDS
failed=0
ran=0
skipped=0

row() {  # status section what value detail
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" "${5:-}" | tee -a "$results"
  [ "$1" = FAIL ] && failed=$((failed + 1))
  return 0
}

# Limits per program, in seconds: the sum stays within 2 minutes (--quick) or 6.
if [ $quick -eq 1 ]; then
  limits=(15 20 50 35)
  proof_mode=(--quick)
else
  limits=(20 30 200 110)
  proof_mode=()
fi
row info setup mode "$([ $quick -eq 1 ] && echo quick || echo full)" "limits ${limits[*]} s; carry $carry; checkpoints in $ckpt_dir"

# ----- what was carried ----------------------------------------------------------------------
programs=(test_cuda_runtime test_nccl_real gpu_proof gpu_proof_nccl)
if [ ! -d "$carry/bin" ]; then
  row FAIL setup "prepared build" "" "$carry/bin is missing: run bash bench/gpu/prepare.sh on the CPU machine and carry $carry"
  exit 1
fi
if [ -f "$carry/manifest.txt" ]; then
  row info setup "prepared build" "$(head -1 "$carry/manifest.txt")"
  # The binaries need the glibc they were built against, or a newer one.
  need=$(head -1 "$carry/manifest.txt" | grep -o 'GLIBC_[0-9.]*' | cut -d_ -f2)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    row FAIL setup glibc "$have" "the prepared binaries need glibc $need or newer: prepare them on an older system"
  fi
fi

# ----- the GPU, and the libraries the programs need there ------------------------------------
if [ -n "$fake_libs" ]; then
  export CKPT_FAKE_GPUS=${CKPT_FAKE_GPUS:-1}
  row info setup GPU "fake" "$CKPT_FAKE_GPUS fake GPU(s): the CUDA runtime and NCCL of $fake_libs"
  lib_path=$fake_libs:$carry/lib
else
  if command -v nvidia-smi >/dev/null; then
    while IFS= read -r gpu; do row info setup GPU "$gpu"; done < <(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)
  else
    row info setup GPU "" "no nvidia-smi on this machine"
  fi
  # NCCL: where the system keeps it, CUDA's folder, or a Python wheel's (PyTorch's nvidia-nccl).
  find_nccl() {
    local d
    for d in $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF}' | xargs -r -n1 dirname) \
             /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
      [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }
    done
    for py in python3 /usr/bin/python3; do
      d=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null) &&
        [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }
    done
    d=$(timeout 20 find / -xdev -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)
    [ -n "$d" ] && dirname "$d"
  }
  nccl_dir=$(find_nccl)
  if [ -n "$nccl_dir" ]; then
    row info setup NCCL "$nccl_dir/libnccl.so.2"
  else
    row FAIL setup NCCL "" "libnccl.so.2 not found (ldconfig, CUDA's folder, Python's nvidia.nccl, a search of /): the NCCL parts cannot run"
  fi
  # Carried libraries first (the CUDA runtime they were built with); then NCCL's folder.
  lib_path=$carry/lib${nccl_dir:+:$nccl_dir}
fi
export LD_LIBRARY_PATH=$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# ----- the programs, each under its limit ----------------------------------------------------
run_program() {  # index name args...
  local i=$1 name=$2
  shift 2
  local bin=$carry/bin/$name limit=${limits[$i]}
  if [ ! -x "$bin" ]; then
    row FAIL "$name" "start" "" "$bin is missing from the prepared build"
    return
  fi
  local missing
  missing=$(ldd "$bin" 2>&1 | awk '/not found/{print $1}' | tr '\n' ' ')
  if [ -n "$missing" ]; then
    row FAIL "$name" "start" "" "shared libraries not found: $missing(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    return
  fi
  echo "== $name (limit $limit s): $bin $*"
  local t0=$SECONDS rc=0 text
  text=$(mktemp)
  timeout --kill-after=5 "$limit" "$bin" "$@" 2>&1 | tee "$text" || rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  # The tests print "what: ok" / "what: FAILED" lines; the proofs write their own rows.
  if [[ $name == test_* ]]; then
    while IFS= read -r line; do
      case "$line" in
        *": ok") row ok "$name" "${line%: ok}" ;;
        *": FAILED") row FAIL "$name" "${line%: FAILED}" ;;
      esac
    done <"$text"
  fi
  case $rc in
    0) ran=$((ran + 1)); row ok "$name" "exit" "0" "${took} s" ;;
    77) skipped=$((skipped + 1)); row not-run "$name" "exit" "77" "no usable GPU: $(tail -1 "$text")" ;;
    124 | 137) ran=$((ran + 1)); row FAIL "$name" "exit" "$rc" "killed at its limit of $limit s: a stall (see the log for NCCL's warnings)" ;;
    *) ran=$((ran + 1)); row FAIL "$name" "exit" "$rc" "after ${took} s: $(tail -1 "$text")" ;;
  esac
  rm -f "$text"
}

run_program 0 test_cuda_runtime
run_program 1 test_nccl_real
run_program 2 gpu_proof "$ckpt_dir" "${proof_mode[@]}" --results "$results" "${proof_args[@]}"
run_program 3 gpu_proof_nccl "$ckpt_dir" "${proof_mode[@]}" --results "$results" "${proof_args[@]}"

# ----- the summary ----------------------------------------------------------------------------
# The proofs count their own FAIL rows in their exit status; count them here too.
proof_fails=$(awk -F'\t' '$1 == "FAIL"' "$results" | wc -l)
{
  echo "| status | section | what | value | detail |"
  echo "|---|---|---|---|---|"
  awk -F'\t' '{ gsub(/\|/, "\\|"); printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$results"
} >"$out/summary.md"
echo "device_run: $proof_fails failed row(s), $ran program(s) ran, $skipped without a GPU, in $((SECONDS - start)) s; rows in $results"
if [ "$proof_fails" -gt 0 ]; then exit 1; fi
if [ $ran -eq 0 ]; then exit 77; fi
if [ $skipped -gt 0 ]; then exit 1; fi
exit 0
