#!/usr/bin/env python3
"""How `ckpt export` (safetensors and torch), `ckpt diff`, `ckpt verify` and `ckpt reshard` scale with the number of tensors.

A checkpoint of N tiny tensors (4 f32 each, 16 bytes) is made with `ckpt import` from a
safetensors file this script writes, then each command is timed (the median of --runs runs).
Linear tools take about the same time per tensor at every N.

usage: python3 bench/many_tensors.py CKPT_TOOL [--counts 500,1000,2000,5000] [--runs 3] [--dir /tmp]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time


def write_safetensors(path, n):
    header, offset = {}, 0
    for i in range(n):
        header[f"t{i}"] = {"dtype": "F32", "shape": [4], "data_offsets": [offset, offset + 16]}
        offset += 16
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(b"".join(struct.pack("<4f", i, -1.0, 0.5, 2.0 * i) for i in range(n)))


def timed(cmd, runs):
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.monotonic() - t0)
    times.sort()
    return times[len(times) // 2]


def timed_into_fresh(cmd, dst, runs):
    """Like timed, for a command that writes `dst`: it is removed before each run."""
    times = []
    for _ in range(runs):
        shutil.rmtree(dst, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool")
    ap.add_argument("--counts", default="500,1000,2000,5000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ckpt-many-", dir=a.dir)
    try:
        print(f"{'tensors':>8} {'export s':>9} {'us/tensor':>9} {'.pt s':>8} {'us/tensor':>9} {'diff s':>8} {'us/tensor':>9} "
              f"{'verify s':>9} {'us/tensor':>9} {'reshard s':>9} {'us/tensor':>9}")
        for n in (int(c) for c in a.counts.split(",")):
            st = os.path.join(work, f"in{n}.safetensors")
            root = os.path.join(work, f"root{n}")
            write_safetensors(st, n)
            subprocess.run([a.tool, "import", st, root], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out = os.path.join(work, f"out{n}.safetensors")
            ex = timed([a.tool, "export", root, out, "--format", "safetensors"], a.runs)
            pt = timed([a.tool, "export", root, os.path.join(work, f"out{n}.pt"), "--format", "torch"], a.runs)
            df = timed([a.tool, "diff", root, root], a.runs)
            vf = timed([a.tool, "verify", root], a.runs)
            dst = os.path.join(work, f"tp2_{n}")
            rs = timed_into_fresh([a.tool, "reshard", root, dst, "--tp", "2"], dst, a.runs)
            print(f"{n:>8} {ex:>9.3f} {ex / n * 1e6:>9.1f} {pt:>8.3f} {pt / n * 1e6:>9.1f} {df:>8.3f} {df / n * 1e6:>9.1f} "
                  f"{vf:>9.3f} {vf / n * 1e6:>9.1f} {rs:>9.3f} {rs / n * 1e6:>9.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
