#!/usr/bin/env python3
"""Header-only and separately compiled ckpt write byte-identical checkpoints (issue 23).

    check.py HEADER_ONLY_BINARY SEPARATE_BINARY

Each binary saves the same state under a root of its own; every file under the two roots must
be identical, byte for byte, and each binary must load the other's checkpoint.
"""
import filecmp
import os
import subprocess
import sys
import tempfile


def run(binary, *args):
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAIL: {os.path.basename(binary)} {' '.join(args)} exited {done.returncode}\n{done.stdout}{done.stderr}")


def files_under(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def main():
    header_only, separate = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "header_only"), os.path.join(tmp, "separate")
        run(header_only, "save", a)
        run(separate, "save", b)
        fa, fb = files_under(a), files_under(b)
        if fa != fb:
            sys.exit(f"FAIL: the two modes wrote different files:\n  header-only: {fa}\n  separate:    {fb}")
        differ = [f for f in fa if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False)]
        if differ:
            sys.exit(f"FAIL: these files differ between the two modes: {differ}")
        run(header_only, "load", b)
        run(separate, "load", a)
        print(f"PASS: {len(fa)} files identical byte for byte; each mode loads the other's checkpoint")


if __name__ == "__main__":
    main()
