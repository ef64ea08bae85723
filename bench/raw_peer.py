#!/usr/bin/python3
"""The disk's own limit for the torch peers' bytes: fio writing (O_DIRECT, libaio, 16 requests in
flight, then fsync) and reading back from a dropped cache a file the size of the state
bench/torch_peer.py saves. report.py runs it in the same rotation as the peers, so that
torch.save's time over this one is the most any writer of those bytes could reach against
torch.save in that round (issue 24: ckpt's target there is 3x). Prints "name seconds" lines.

    /usr/bin/python3 bench/raw_peer.py --dir /var/tmp --workload fp32 --gib 1
"""
import argparse
import json
import os
import subprocess
import time

from torch_peer import drop_cache, element_counts


def state_bytes(workload, gib):
    n = sum(element_counts(int(gib * 1024**3)))
    return n * 4 if workload == "fp32" else n * (2 + 4 + 4)  # bf16 weights, fp32 exp_avg and exp_avg_sq


def fio_seconds(path, size, rw, block):
    """fio's own job runtime (its start-up and the file's layout left out), in seconds."""
    out = subprocess.run(["fio", "--name=deep", f"--filename={path}", f"--size={size}", f"--rw={rw}", f"--bs={block}",
                          "--direct=1", "--ioengine=libaio", "--iodepth=16", "--end_fsync=1", "--output-format=json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["job_runtime"] / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--workload", default="fp32")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--pause", type=float, default=3.0, help="seconds of quiet before the write and before the read")
    a = ap.parse_args()
    size = state_bytes(a.workload, a.gib)
    path = os.path.join(a.dir, f"raw-peer-{os.getpid()}.bin")
    try:
        # The fastest of fio's 1 MiB and 4 MiB blocks, each written to a new file from a settled
        # disk, as save_vs_raw's deep-queue baseline.
        write = read = float("inf")
        for block in ("1M", "4M"):
            if os.path.exists(path):
                os.remove(path)
            os.sync()
            time.sleep(a.pause)
            write = min(write, fio_seconds(path, size, "write", block))
        for block in ("1M", "4M"):
            drop_cache(path)
            os.sync()
            time.sleep(a.pause)
            read = min(read, fio_seconds(path, size, "read", block))
        print("raw_save_s", write, flush=True)
        print("raw_load_cold_s", read, flush=True)
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
