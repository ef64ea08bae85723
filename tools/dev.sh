#!/usr/bin/env bash
# The README's two commands, runnable on a fresh Debian 12 machine (as root, or with sudo):
#
#   bash tools/dev.sh demo   # install what is missing, build, run the crash-and-resume example
#   bash tools/dev.sh test   # install what is missing, build with -Werror, run the whole suite
#
# and, for CI (.ci/run) and by hand:
#
#   bash tools/dev.sh sanitize   # the unit suite and crash campaign under ASan+UBSan, and the
#                                # threaded and async tests (the GPU fakes' too) under TSan
#                                # (build-asan, build-tsan)
#
# BUILD_DIR (default: build) chooses the build directory.
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}

# Debian packages ckpt builds and tests with. cmake is how Meson finds cereal and doctest,
# which ship no pkg-config files. python3-torch is the real torch.load/torch.save the interop
# tests check ckpt's .pt and safetensors files against (run from /usr/bin/python3).
# libcurl4-openssl-dev and libssl-dev are what ckpt::s3 is built on (requests and SigV4; MD5 and
# SHA-256); awscli is the independent client the S3 tests cross-check against, and npm installs
# the S3-compatible server they run against (s3rver, pinned in tests/s3/package-lock.json).
# libtorch-dev and libeigen3-dev are the engines the adapters in include/ckpt/adapters serve.
packages=(g++ meson ninja-build pkg-config cmake libcereal-dev doctest-dev libxxhash-dev libzstd-dev libopenmpi-dev openmpi-bin
          zlib1g-dev libcli11-dev python3-torch libcurl4-openssl-dev libssl-dev awscli
          libtorch-dev libeigen3-dev)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# s3rver, from npm, into tests/s3/node_modules (ignored by git). Node and npm come from Debian
# when the machine has none.
install_s3rver() {
  [ -f tests/s3/node_modules/s3rver/bin/s3rver.js ] && return
  if ! command -v npm >/dev/null; then
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  (cd tests/s3 && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
}

# Runs each argument as a command line, as many at a time as the machine has cores, and prints
# each one's output when it ends; fails if any failed. The sanitizer runs below each keep about
# one core busy, so two cores run them in about half the time one after another takes
# (docs/performance.md, "CI's time on 2026-12-05's slower machine"). Give the longest first: a
# command starts when one ends.
run_side_by_side() {
  local slots
  slots=$(nproc)
  local logs
  logs=$(mktemp -d /tmp/ckpt-sanitize.XXXXXX)
  local -A command_of=() log_of=() start_of=()
  local status=0 n=0 pid done_pid rc
  finish_one() {
    rc=0
    wait -n -p done_pid || rc=$?
    echo "---- ${command_of[$done_pid]} (exit $rc, $((SECONDS - start_of[$done_pid])) s)"
    cat "${log_of[$done_pid]}"
    [ "$rc" -eq 0 ] || status=1
    unset "command_of[$done_pid]"
  }
  for cmd in "$@"; do
    while [ "${#command_of[@]}" -ge "$slots" ]; do finish_one; done
    n=$((n + 1))
    bash -c "$cmd" >"$logs/$n.log" 2>&1 &
    pid=$!
    command_of[$pid]=$cmd
    log_of[$pid]=$logs/$n.log
    start_of[$pid]=$SECONDS
  done
  while [ "${#command_of[@]}" -gt 0 ]; do finish_one; done
  rm -rf "$logs"
  return $status
}

configure() {
  if [ -f "$build_dir/build.ninja" ]; then
    meson setup --reconfigure "$build_dir" "$@" >/dev/null
  else
    meson setup "$build_dir" "$@" >/dev/null
  fi
}

case "${1:-}" in
  demo)
    install_missing
    configure -Dtests=false
    meson compile -C "$build_dir" train_resume
    demo_dir=$(mktemp -d /tmp/ckpt-demo.XXXXXX)
    trap 'rm -rf "$demo_dir"' EXIT
    # Trains once without interruption and once with a SIGKILL mid-run followed by a resume
    # from `latest`, then checks both end bit-for-bit identical. Exits non-zero if not.
    "$build_dir/examples/train_resume" --check "$demo_dir"
    ;;
  test)
    install_missing
    install_s3rver
    # What the suite needs, compiled as cheaply as it can be: without debug information (-g
    # nearly doubles the compile time of ckpt's template-heavy tests), at -Og (g++ compiles it
    # with less CPU than at -O1, and the suite, bound by I/O and sleeps rather than by ckpt's own
    # loops, runs about as fast: docs/performance.md, "CI's time"), and with separate
    # compilation (ckpt_impl, docs/architecture.md: ckpt's type-independent parts compiled once
    # instead of in every test). tests/separate, the consumer and compile-fail tests and the
    # fuzzers build the header-only way. bench/run.sh reconfigures for -O2, header-only.
    configure -Dtests=true -Dexamples=true -Dwerror=true -Doptimization=g -Ddebug=false -Dseparate_compilation=true
    meson compile -C "$build_dir"
    status=0
    # One test more than the cores: several of them wait (on timeouts, mpirun, s3rver) more than
    # they compute (docs/performance.md, "CI's time on 2026-12-05's slower machine").
    meson test -C "$build_dir" --print-errorlogs --num-processes $(($(nproc) + 1)) || status=$?
    # One closing line in the plain "N passed, N failed" form, from Meson's own log.
    log="$build_dir/meson-logs/testlog.json"
    passed=$(grep -c '"result": "OK"' "$log" || true)
    failed=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
    skipped=$(grep -c '"result": "SKIP"' "$log" || true)
    echo "tests: $passed passed, $failed failed, $skipped skipped"
    exit $status
    ;;
  sanitize)
    # clang: it compiles ckpt's templates under the sanitizers about twice as fast as g++.
    packages+=(clang-14 libclang-rt-14-dev)
    install_missing
    export CC=clang-14 CXX=clang++-14
    status=0
    # -O0: clang builds these far faster than at -O1 (-Og is -O1 to clang), which outweighs
    # their slower runs (docs/performance.md, "CI's time"); unoptimised code hides no access
    # from the sanitizers.
    common=(-Db_lundef=false -Dwerror=true -Dbench=false -Dexamples=false -Dmpi=disabled
            -Doptimization=0 -Ddebug=false -Dcpp_args=-gline-tables-only)
    # Both build the separate way: faster, and the same code as header-only. Each then runs its
    # programs side by side, longest first (run_side_by_side).
    # ASan + UBSan: the whole unit suite (corruption, fault and mutation campaigns included),
    # the S3 client (signing, retries, listings and errors on a loopback listener) and the whole
    # S3 suite against s3rver (it runs under TSan below too), a shorter crash campaign, the
    # system-call routing tests (O_DIRECT reads and writes straight into and out of the caller's
    # memory and a load's buffers, bounce buffers, truncation and damage on those paths) and the
    # interop tests (hostile pickles, zip archives and safetensors headers). Only these targets
    # are built: benchmarks, examples and the MPI tests add nothing a sanitizer would see that
    # the unit suite does not.
    build_dir=${ASAN_BUILD_DIR:-build-asan}
    configure -Db_sanitize=address,undefined -Dseparate_compilation=true "${common[@]}"
    install_s3rver
    meson compile -C "$build_dir" tests/unit tests/crash/crash_campaign tests/torch/torch_pt tests/safetensors/test_safetensors \
      tests/s3/test_s3_signing tests/s3/test_s3 tests/page_copy_routing
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tools/ubsan.supp
    export SANITIZE_BUILD=$build_dir
    run_side_by_side \
      '"$SANITIZE_BUILD"/tests/unit --no-intro --minimal' \
      '/usr/bin/python3 tests/s3/harness.py -- "$SANITIZE_BUILD"/tests/s3/test_s3 --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/crash/crash_campaign --trials 40 --mode both' \
      '"$SANITIZE_BUILD"/tests/page_copy_routing --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/torch/torch_pt --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/safetensors/test_safetensors --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/s3/test_s3_signing --no-intro --minimal' || status=1
    [ $status -eq 0 ] && echo "sanitize: ASan+UBSan clean (unit suite, interop tests, S3 client and suite, 40 crash trials, system-call routing)"
    # TSan: the tests that run threads: the S3 suite, the save pipeline, parallel loads and
    # save_async (the threaded unit tests), parallel load workers reading into disjoint parts of
    # one tensor and the writer's queue (the routing tests), and the GPU policies on their fakes
    # (every fake stream and fake NCCL rank is a thread).
    build_dir=${TSAN_BUILD_DIR:-build-tsan}
    configure -Db_sanitize=thread -Dseparate_compilation=true "${common[@]}"
    meson compile -C "$build_dir" tests/unit_threads tests/s3/test_s3 tests/cuda/test_device_copy tests/cuda/test_nccl \
      tests/page_copy_routing
    export TSAN_OPTIONS=halt_on_error=1 SANITIZE_BUILD=$build_dir
    run_side_by_side \
      '/usr/bin/python3 tests/s3/harness.py -- "$SANITIZE_BUILD"/tests/s3/test_s3 --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/unit_threads --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/page_copy_routing --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/cuda/test_device_copy --no-intro --minimal' \
      '"$SANITIZE_BUILD"/tests/cuda/test_nccl --no-intro --minimal' || status=1
    [ $status -eq 0 ] && echo "sanitize: TSan clean (threaded and async tests, system-call routing, S3 tests, device_copy and NCCL on their fakes)"
    exit $status
    ;;
  *)
    echo "usage: bash tools/dev.sh demo|test|sanitize" >&2
    exit 2
    ;;
esac
