#!/usr/bin/env bash
# bench/gpu/device_run.sh end to end on this machine (issue 20): the binaries made for the GPU
# machine, run on the fake CUDA runtime and NCCL (tests/cuda/fake_libs), checked for what the
# command must do there.
#
#   bash tests/cuda/device_run_on_fakes.sh BUILD_DIR CASE
#
# CASE:
#   one-gpu   everything passes; the parts that need two ranks say not-run, never ok
#   two-gpus  the same parts run, at world 2, and pass
#   failure   a planted CUDA failure in gpu_proof: its section reports it with the error text,
#             the next sections and gpu_proof_nccl still run, and the command exits 1
#   stall     a send that never arrives: the NCCL watchdog reports it within its timeout, naming
#             the operation, the proof goes on, and the command exits 1
set -uo pipefail
build=$(cd "$1" && pwd)
case_name=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/ckpt-device-run.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A carry folder as prepare.sh lays it out, of this build's binaries.
mkdir -p "$work/carry/bin" "$work/carry/lib"
for b in tests/cuda/test_cuda_runtime tests/cuda/test_nccl_real bench/gpu_proof bench/gpu_proof_nccl; do
  ln -s "$build/$b" "$work/carry/bin/"
done
ln -s "$build/bench/libgpu_proof_kernels.so" "$work/carry/lib/"

gpus=1
unset CKPT_FAKE_FAIL CKPT_FAKE_NCCL_DROP_SEND
case $case_name in
  one-gpu) ;;
  two-gpus) gpus=2 ;;
  failure) export CKPT_FAKE_FAIL=copy_async:200 ;;
  stall) gpus=2; export CKPT_FAKE_NCCL_DROP_SEND=gpu_proof_nccl:1 ;;  # rank 1's part of the first gather never arrives
  *) echo "unknown case $case_name" >&2; exit 2 ;;
esac
rc=0
CKPT_FAKE_GPUS=$gpus OUT=$work/out bash "$repo/bench/gpu/device_run.sh" --quick --carry "$work/carry" --dir "$work/ckpt" \
  --fake-libs "$build/tests/cuda/fake_libs" -- --big-mib 32 --reps 1 || rc=$?
results=$work/out/results.tsv

failures=0
expect() {  # description, then a command that must succeed
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAILED: $what"
    failures=$((failures + 1))
  fi
}
has() { grep -qP "$1" "$results"; }
hasnt() { ! grep -qP "$1" "$results"; }
count() { grep -cP "$1" "$results"; }

expect "results.tsv and summary.md were written" test -s "$results" -a -s "$work/out/summary.md"
expect "every program started (four exit rows)" test "$(count '^\S+\t\S+\texit\t')" -eq 4
case $case_name in
  one-gpu | two-gpus)
    expect "exit status 0 (it was $rc)" test "$rc" -eq 0
    expect "no FAIL row" hasnt '^FAIL\t'
    expect "gpu_proof measured its 13 figures (four staging, three raw writers, the save, three raw readers, the load, save_async)" test "$(count '^figure\tthroughput\t')" -eq 13
    expect "bounded join checked" has '^ok\tbounded join\tncclCommInitRank for a world of two whose second rank never comes'
    expect "give_up checked" has '^ok\tbounded join\ta rank that gives up'
    expect "the contract checked on the real runtime's code" has '^ok\tcontract\tsave leaves nothing in the caller.s last-error slot'
    expect "test_nccl_real's non-blocking join" has '^ok\ttest_nccl_real\tnon-blocking ncclCommInitRank completes'
    ;;
esac
case $case_name in
  one-gpu)
    expect "collectives said to run at world 1" has '^ok\tcollectives\tbarrier, broadcast, all_gather, all_reduce_max, gather \(world 1\)'
    expect "point to point not run at one GPU" has '^not-run\tpoint to point\t'
    expect "the streamed gather and scattered load not run at one GPU" has '^not-run\tgather_to_root\tthe streamed gather and the scattered load'
    expect "no multi-rank part said ok at world 1" hasnt '^ok\t(point to point|gather_to_root\tonly rank 0)'
    expect "the cross-GPU user stream not run at one GPU" has '^not-run\tcontract\ta user stream on another GPU'
    ;;
  two-gpus)
    expect "collectives at world 2" has '^ok\tcollectives\tbarrier, broadcast, all_gather, all_reduce_max, gather \(world 2\)'
    expect "point to point ran at world 2" has '^ok\tpoint to point\t20 MiB GPU tensor from rank 0 to rank 1.*\(world 2\)'
    expect "only rank 0 read storage" has '^ok\tgather_to_root\tonly rank 0 read storage.*\(world 2\)'
    expect "a user stream on cuda:1 with the tensor on cuda:0" has '^ok\tcontract\ta user stream on cuda:1, the tensor on cuda:0'
    ;;
  failure)
    expect "exit status 1 (it was $rc)" test "$rc" -eq 1
    expect "a section reports the planted failure with its text" has '^FAIL\t[^\t]+\tsection ended by a ckpt::error\t\tio: cuda::device_copy: cudaMemcpyAsync'
    expect "the throughput section still ran" has '^time\tthroughput\tsection took'
    expect "gpu_proof_nccl still ran and passed" has '^done\tsummary\tgpu_proof_nccl\tpassed'
    ;;
  stall)
    expect "exit status 1 (it was $rc)" test "$rc" -eq 1
    expect "the watchdog reports the stall, naming the operation" has '^FAIL\t.*no answer within 15 s'
    expect "the stall was not left to the program's time limit" hasnt 'killed at its limit'
    expect "the sections after it ran, and passed" has '^ok\tgather_to_root\tonly rank 0 read storage'
    ;;
esac
if [ $failures -gt 0 ]; then
  echo "--- results.tsv"
  cat "$results"
  echo "--- device_run.log (last 60 lines)"
  tail -60 "$work/out/device_run.log"
  exit 1
fi
echo "device_run.sh on the fakes ($case_name): every check passed"
