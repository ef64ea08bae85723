#!/usr/bin/env bash
# The README's two commands, runnable on a fresh Debian 12 machine (as root, or with sudo):
#
#   bash tools/dev.sh demo   # install what is missing, build, run the crash-and-resume example
#   bash tools/dev.sh test   # install what is missing, build with -Werror, run the whole suite
#
# BUILD_DIR (default: build) chooses the build directory.
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}

# Debian packages ckpt builds and tests with. cmake is how Meson finds cereal and doctest,
# which ship no pkg-config files.
packages=(g++ meson ninja-build pkg-config cmake libcereal-dev doctest-dev libxxhash-dev libzstd-dev libopenmpi-dev openmpi-bin)

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
    configure -Dtests=true -Dexamples=true -Dwerror=true
    meson compile -C "$build_dir"
    status=0
    meson test -C "$build_dir" --print-errorlogs --num-processes 2 || status=$?
    # One closing line in the plain "N passed, N failed" form, from Meson's own log.
    log="$build_dir/meson-logs/testlog.json"
    passed=$(grep -c '"result": "OK"' "$log" || true)
    failed=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
    skipped=$(grep -c '"result": "SKIP"' "$log" || true)
    echo "tests: $passed passed, $failed failed, $skipped skipped"
    exit $status
    ;;
  *)
    echo "usage: bash tools/dev.sh demo|test" >&2
    exit 2
    ;;
esac
