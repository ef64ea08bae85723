#!/usr/bin/env bash
# Installs ckpt into a temporary prefix and builds tests/consumer/consumer.cpp against the
# installed copy, the way a user's project would find it, then runs the program.
#
#   run.sh pkg-config|cmake|cmake-subdirectory|cmake-fetchcontent <source root> <meson> <version> <c++ compiler command...>
#
# The last two build tests/consumer/in_tree without installing anything: add_subdirectory of
# the checkout, and FetchContent of an archive of it (file:// URL, no network).
#
# Set CKPT_KEEP_TMP=1 to keep the temporary directory for a look after a failure.
set -u -o pipefail

mode=${1:?mode: pkg-config or cmake}
source_root=${2:?source root}
meson=${3:?meson executable}
version=${4:?project version}
shift 4
cxx=("$@")
[ ${#cxx[@]} -gt 0 ] || cxx=(c++)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-consumer-$mode.XXXXXX") || exit 1
if [ -n "${CKPT_KEEP_TMP:-}" ]; then
  echo "keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix=$tmp/prefix

fail() {
  echo "FAIL [$mode]: $1" >&2
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    echo "---- last lines of $2 ----" >&2
    tail -n 60 "$2" >&2
  fi
  exit 1
}

step() { echo "[$mode] $*"; }

# add_subdirectory and FetchContent take ckpt in as source, through its top-level
# CMakeLists.txt, with nothing installed.
case "$mode" in
  cmake-subdirectory|cmake-fetchcontent)
    command -v cmake >/dev/null || fail "cmake is not installed"
    how=${mode#cmake-}
    args=(-DCKPT_HOW="$how")
    if [ "$how" = subdirectory ]; then
      args+=(-DCKPT_SOURCE="$source_root")
      expected_include=$source_root/include
    else
      # What a release archive holds of the tree; FetchContent downloads and unpacks it.
      tar -C "$source_root" -czf "$tmp/ckpt.tar.gz" --transform 's,^,ckpt/,' CMakeLists.txt meson.build include ||
        fail "cannot pack $source_root"
      args+=(-DCKPT_URL="file://$tmp/ckpt.tar.gz")
      expected_include=$tmp/cmake-build/_deps/ckpt-src/include
    fi
    step "cmake -S $here/in_tree ${args[*]}"
    # No build type: -O0 without -g (debug information makes these compiles half as slow again,
    # and the test only needs the programs to build, link and run).
    cmake -S "$here/in_tree" -B "$tmp/cmake-build" "${args[@]}" -DCMAKE_CXX_COMPILER="${cxx[-1]}" -DCMAKE_BUILD_TYPE= \
      >"$tmp/cmake.log" 2>&1 || fail "cmake configure with $how failed" "$tmp/cmake.log"
    grep -- "-- ckpt" "$tmp/cmake.log"
    got=$(sed -n 's/^-- ckpt::ckpt headers: //p' "$tmp/cmake.log")
    [ "$(realpath "$got")" = "$(realpath "$expected_include")" ] || fail "ckpt::ckpt's headers are $got, not $expected_include" "$tmp/cmake.log"
    # FetchContent makes the same targets from the same CMakeLists.txt as add_subdirectory, which
    # builds every program below; through FetchContent, building the plain consumer shows the
    # fetched archive is complete and its targets work.
    targets=()
    [ "$how" = fetchcontent ] && targets=(--target consumer)
    # Two jobs: the programs and ckpt::impl build side by side.
    cmake --build "$tmp/cmake-build" --parallel 2 "${targets[@]}" >"$tmp/compile.log" 2>&1 ||
      fail "the consumer does not build through $how / ckpt::ckpt" "$tmp/compile.log"
    run_dir=$tmp/checkpoint
    mkdir -p "$run_dir"
    step "run consumer"
    "$tmp/cmake-build/consumer" "$run_dir" || fail "the consumer built through $how ran and failed (exit $?)"
    if [ "$how" = subdirectory ]; then
      separate_dir=$tmp/checkpoint-separate
      mkdir -p "$separate_dir"
      "$tmp/cmake-build/consumer_separate" "$separate_dir" || fail "consumer_separate (ckpt::impl, CKPT_SEPARATE_COMPILATION) built through $how failed"
    fi
    if [ "$how" = subdirectory ]; then
      if [ -x "$tmp/cmake-build/consumer_interop" ]; then
        "$tmp/cmake-build/consumer_interop" "$run_dir" || fail "consumer_interop (ckpt::interop) built through $how failed"
      else
        grep -q "interop TRUE" "$tmp/cmake.log" && fail "ckpt::interop was found, but consumer_interop was not built" "$tmp/cmake.log"
      fi
      # It links every optional target found; it runs without a GPU (the CUDA call only fails).
      "$tmp/cmake-build/consumer_parts" || fail "consumer_parts (the optional targets) built through $how failed"
    fi
    echo "PASS [$mode]"
    exit 0
    ;;
esac

# 1. Install, as a packager or a user would, into a prefix of our own (headers only: nothing
#    is compiled, as the benchmarks, tests, examples and the ckpt tool are off).
step "meson setup + install into $prefix"
"$meson" setup "$tmp/build" "$source_root" --prefix="$prefix" -Dtests=false -Dexamples=false -Dbench=false -Dtools=false \
  >"$tmp/setup.log" 2>&1 || fail "meson setup of $source_root failed" "$tmp/setup.log"
"$meson" install -C "$tmp/build" >"$tmp/install.log" 2>&1 || fail "meson install failed" "$tmp/install.log"
[ -f "$prefix/include/ckpt/ckpt.hpp" ] || fail "the install has no $prefix/include/ckpt/ckpt.hpp"

# 2. Build the consumer against the installed copy.
run_dir=$tmp/checkpoint
mkdir -p "$run_dir"
case "$mode" in
  pkg-config)
    pc=$(find "$prefix" -name ckpt.pc -print -quit)
    [ -n "$pc" ] || fail "no ckpt.pc anywhere under $prefix"
    pc_dir=$(dirname "$pc")
    export PKG_CONFIG_PATH=$pc_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    step "pkg-config file $pc"
    got=$(pkg-config --modversion ckpt 2>&1) || fail "pkg-config --modversion ckpt: $got"
    [ "$got" = "$version" ] || fail "pkg-config says ckpt $got, the project is $version"
    flags=$(pkg-config --cflags --libs ckpt 2>&1) || fail "pkg-config --cflags --libs ckpt: $flags"
    step "pkg-config --cflags --libs ckpt: $flags"
    read -r -a flag_words <<<"$flags"  # pkg-config output is a word list
    cmd=("${cxx[@]}" -std=c++20 "$here/consumer.cpp" -o "$tmp/consumer" -MD -MF "$tmp/consumer.d" "${flag_words[@]}")
    step "${cmd[*]}"
    "${cmd[@]}" >"$tmp/compile.log" 2>&1 || fail "the consumer does not build through pkg-config" "$tmp/compile.log"
    # A ckpt installed elsewhere (say /usr/include) must not stand in for the one under test.
    grep -qF "$prefix/include/ckpt/ckpt.hpp" "$tmp/consumer.d" ||
      fail "the consumer did not include $prefix/include/ckpt/ckpt.hpp" "$tmp/consumer.d"
    ;;
  cmake)
    command -v cmake >/dev/null || fail "cmake is not installed"
    step "cmake -S $here -DCMAKE_PREFIX_PATH=$prefix"
    cmake -S "$here" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCKPT_EXPECTED_PREFIX="$prefix" \
      -DCMAKE_CXX_COMPILER="${cxx[-1]}" -DCMAKE_BUILD_TYPE= >"$tmp/cmake.log" 2>&1 ||
      fail "cmake configure with find_package(ckpt) failed" "$tmp/cmake.log"
    grep -- "-- ckpt " "$tmp/cmake.log"
    cmake --build "$tmp/cmake-build" >"$tmp/compile.log" 2>&1 ||
      fail "the consumer does not build through find_package(ckpt) / ckpt::ckpt" "$tmp/compile.log"
    cp "$tmp/cmake-build/consumer" "$tmp/consumer"
    ;;
  *)
    fail "unknown mode '$mode' (pkg-config or cmake)"
    ;;
esac

# 3. Run it.
step "run consumer"
"$tmp/consumer" "$run_dir" || fail "the consumer built through $mode ran and failed (exit $?)"
echo "PASS [$mode]"
