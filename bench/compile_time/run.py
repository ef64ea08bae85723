#!/usr/bin/env python3
"""How much a translation unit pays to use ckpt (issue 23, point 4).

Compiles, at -O2 with the compiler CI uses, in interleaved rounds so that the machine's noise
falls on every case alike:

  baseline        #include <bits/stdc++.h>
  include         #include <ckpt/ckpt.hpp>
  include_sep     the same with CKPT_SEPARATE_COMPILATION
  program         a small program that saves and loads one Checkpointable type (header-only)
  program_sep     the same program with CKPT_SEPARATE_COMPILATION (its TU only)
  library         the one TU that includes ckpt/impl/src.hpp (compiled once per build)

and prints each median as a ratio to the baseline's median of the same run. The time is the
compiler's CPU time (user + system): on a shared machine it does not count the time the
compiler spent waiting for a core, which wall-clock time would. With --write, the
table replaces the section between the compile-time markers in docs/performance.md.

    python3 bench/compile_time/run.py [--runs 3] [--cxx c++] [--write]
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CASES = [
    ("baseline", "baseline.cpp", []),
    ("include", "include_only.cpp", []),
    ("include_sep", "include_only.cpp", ["-DCKPT_SEPARATE_COMPILATION"]),
    ("program", "small_program.cpp", []),
    ("program_sep", "small_program.cpp", ["-DCKPT_SEPARATE_COMPILATION"]),
    ("library", "../../include/ckpt/impl/ckpt_impl.cpp", ["-DCKPT_SEPARATE_COMPILATION"]),
]
LABELS = {
    "baseline": "`#include <bits/stdc++.h>` (the baseline)",
    "include": "`#include <ckpt/ckpt.hpp>`, header-only",
    "include_sep": "`#include <ckpt/ckpt.hpp>` with `CKPT_SEPARATE_COMPILATION`",
    "program": "small program that saves and loads one type, header-only",
    "program_sep": "the same program with `CKPT_SEPARATE_COMPILATION`",
    "library": "the library TU (`ckpt/impl/src.hpp`, once per build)",
}
TARGETS = {"include": 1.0, "program": 3.0, "program_sep": 1.5}


def compile_once(cxx, src, extra, out_dir):
    cmd = [cxx, "-std=c++20", "-O2", "-I" + os.path.join(ROOT, "include"), *extra, "-c", os.path.join(HERE, src),
           "-o", os.path.join(out_dir, "out.o")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"compile failed: {' '.join(cmd)}\n{done.stderr[-4000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    ap.add_argument("--write", action="store_true", help="rewrite the table in docs/performance.md")
    args = ap.parse_args()
    times = {name: [] for name, _, _ in CASES}
    out_dir = tempfile.mkdtemp(prefix="ckpt-compile-time-")
    try:
        for _ in range(args.runs):
            for name, src, extra in CASES:
                times[name].append(compile_once(args.cxx, src, extra, out_dir))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    base = statistics.median(times["baseline"])
    version = subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    lines = [
        f"Compiler: {version}, -O2, CPU seconds (user + system), medians of {args.runs} interleaved runs; "
        f"the baseline took {base:.2f} s.",
        "",
        "| translation unit | median CPU (s) | / baseline | target |",
        "|---|---:|---:|---:|",
    ]
    for name, _, _ in CASES:
        med = statistics.median(times[name])
        target = TARGETS.get(name)
        verdict = "" if target is None else f"≤ {target:g}× ({'met' if med / base <= target else 'missed'})"
        lines.append(f"| {LABELS[name]} | {med:.2f} | {med / base:.2f} | {verdict} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        path = os.path.join(ROOT, "docs", "performance.md")
        text = open(path).read()
        begin, end = "<!-- compile-time:begin -->", "<!-- compile-time:end -->"
        if begin not in text:
            sys.exit(f"{path} has no {begin} marker")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        open(path, "w").write(head + begin + "\n" + table + "\n" + end + tail)


if __name__ == "__main__":
    main()
