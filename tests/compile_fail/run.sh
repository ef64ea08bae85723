#!/usr/bin/env bash
# Compiles one snippet with -fsyntax-only and checks the outcome its header announces:
#
#   // expect: compiles          the snippet must compile (a positive control)
#   // expect: <text>            it must fail, and the first error the compiler reports must
#                                contain <text> (several `// expect:` lines: all of them)
#
#   run.sh <snippet.cpp> <compiler command...> -- <flags...>
#
# The first error, not just any: a user reads the first one, so that is where ckpt's
# "add this member" message has to be.
set -u -o pipefail

snippet=${1:?snippet}
shift
cxx=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  cxx+=("$1")
  shift
done
[ $# -gt 0 ] && shift
flags=("$@")
[ ${#cxx[@]} -gt 0 ] || cxx=(c++)
name=$(basename "$snippet")

mapfile -t expects < <(sed -n 's@^// expect: *@@p' "$snippet" | sed 's/[[:space:]]*$//')
if [ ${#expects[@]} -eq 0 ]; then
  echo "FAIL $name: no '// expect: ...' line at the top of the snippet" >&2
  exit 1
fi

err=$(mktemp "${TMPDIR:-/tmp}/ckpt-compile-fail.XXXXXX") || exit 1
trap 'rm -f "$err"' EXIT
# -Wfatal-errors: the compiler stops at the first error, the one checked, instead of going on
# through the templates after it (docs/performance.md, "CI's time on 2026-12-05's slower machine").
cmd=("${cxx[@]}" "${flags[@]}" -fsyntax-only -Wfatal-errors "$snippet")
echo "${cmd[*]}"
"${cmd[@]}" >"$err" 2>&1
rc=$?

if [ "${expects[0]}" = "compiles" ]; then
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: the positive control does not compile (exit $rc); the compile-fail tests prove nothing until it does:" >&2
    head -n 40 "$err" >&2
    exit 1
  fi
  echo "PASS $name: compiles"
  exit 0
fi

if [ $rc -eq 0 ]; then
  echo "FAIL $name: compiled, but must not (expected: ${expects[*]})" >&2
  exit 1
fi

# clang quotes a static_assert message and escapes its quotes: undo that before comparing.
first=$(grep -m1 -E '(^|[: ])(fatal )?error:' "$err" | sed 's/\\"/"/g')
status=0
for text in "${expects[@]}"; do
  if [[ "$first" != *"$text"* ]]; then
    status=1
    if sed 's/\\"/"/g' "$err" | grep -qF -- "$text"; then
      echo "FAIL $name: the expected message is there but is not the first error" >&2
    else
      echo "FAIL $name: the compiler never says what the snippet expects" >&2
    fi
    echo "  expected: $text" >&2
    echo "  first error: ${first:-<none>}" >&2
  fi
done
if [ $status -ne 0 ]; then
  echo "---- compiler output (first 40 lines) ----" >&2
  head -n 40 "$err" >&2
  exit 1
fi
echo "PASS $name: fails with: ${expects[*]}"
