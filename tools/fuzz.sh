#!/usr/bin/env bash
# Fuzzes ckpt's parsers with libFuzzer: builds each target in tests/fuzz/ with clang-14
# (-fsanitize=fuzzer,address,undefined) and runs it for FUZZ_SECONDS (default 60; all
# targets at once) from the
# committed seed corpus (tests/fuzz/corpus/<target>). A crash, a sanitizer report, an input
# that allocates over 1 GiB or a timeout fails the run; the input is left in
# $FUZZ_DIR/crashes/<target>/ and belongs in tests/fuzz/regressions/<target>/ once fixed (the
# unit suite replays those). Prints, per target, the executions run.
#
#   bash tools/fuzz.sh [target...]      (targets: index metadata latest pickle pt safetensors s3_xml;
#                                        default all)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
out=${FUZZ_DIR:-build-fuzz}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(index metadata latest pickle pt safetensors s3_xml)

need=()
for p in clang-14 libclang-rt-14-dev libcereal-dev libxxhash-dev libzstd-dev zlib1g-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$out"
# UB is reported through UBSAN_OPTIONS (halt_on_error) so that tools/ubsan.supp can exempt code
# that is not ckpt's. The `builtin` check is off: its only finding is rapidjson's clz(0) (see
# tools/ubsan.supp), which this clang does not let a suppression silence; ckpt calls no such
# builtin.
flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize=builtin -Iinclude)

# Build every target, then fuzz them all at once (each fuzzer is one process; the time limit
# is wall-clock, so they share the cores and take FUZZ_SECONDS in all).
for t in "${targets[@]}"; do
  clang++-14 "${flags[@]}" "tests/fuzz/fuzz_$t.cpp" -o "$out/fuzz_$t" -lzstd -lxxhash -lz &
done
wait_all() {
  local rc=0
  for job in $(jobs -p); do wait "$job" || rc=1; done
  return $rc
}
wait_all || { echo "fuzz: building the targets failed"; exit 1; }

declare -A pid
for t in "${targets[@]}"; do
  rm -rf "$out/corpus/$t" "$out/crashes/$t"
  mkdir -p "$out/corpus/$t" "$out/crashes/$t"
  seeds=("tests/fuzz/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && seeds+=("tests/fuzz/regressions/$t")
  # New inputs go to the working corpus in $out; the committed seeds are only read.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions="$PWD/tools/ubsan.supp" \
    "$out/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -timeout=10 -print_final_stats=1 -artifact_prefix="$out/crashes/$t/" \
      "$out/corpus/$t" "${seeds[@]}" >"$out/fuzz_$t.log" 2>&1 &
  pid[$t]=$!
done
status=0
for t in "${targets[@]}"; do
  log="$out/fuzz_$t.log"
  if wait "${pid[$t]}"; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz $t: $runs executions in ${seconds} s, no crash"
  else
    echo "fuzz $t: FAILED; the input is in $out/crashes/$t/, the report in $log:"
    tail -40 "$log"
    status=1
  fi
done
exit $status
