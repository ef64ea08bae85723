#!/usr/bin/python3
"""The Python peer: torch.save (+ fsync) and torch.load of the same tensors bench/save_load
builds (same names, shapes, dtypes; values from N(0, 0.02)). Prints "name seconds" lines.

    /usr/bin/python3 bench/torch_peer.py --dir /var/tmp --workload fp32 --gib 1
"""
import argparse
import os
import time

import torch


def element_counts(total_fp32_bytes):
    # Mirrors element_counts() in bench/save_load.cpp.
    weight = [4.0 if i % 8 == 0 else (1.0 if i % 8 < 4 else 0.5) for i in range(200)]
    s = sum(weight)
    return [int(w / s * total_fp32_bytes / 4) // 1024 * 1024 for w in weight]


def make_state(workload, gib):
    torch.manual_seed(0)
    state = {}
    for i, n in enumerate(element_counts(int(gib * 1024**3))):
        base = f"layers.{i // 8}.w{i % 8}"
        t = torch.randn(n // 1024, 1024) * 0.02
        if workload == "fp32":
            state[base] = t
        else:
            state[base] = t.to(torch.bfloat16)
            state[f"optimizer.{base}.exp_avg"] = torch.randn(n // 1024, 1024) * 0.02
            state[f"optimizer.{base}.exp_avg_sq"] = torch.randn(n // 1024, 1024) * 0.02
    return state


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--workload", default="fp32")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--pause", type=float, default=3.0, help="seconds of quiet before the save and before the cold load")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    state = make_state(a.workload, a.gib)
    path = os.path.join(a.dir, f"torch-peer-{os.getpid()}.pt")
    try:
        os.sync()
        time.sleep(a.pause)  # start from a settled disk, as the peers do (report.py rotates their order)
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        print("torch_save_s", time.perf_counter() - t0, flush=True)
        drop_cache(path)
        os.sync()
        time.sleep(a.pause)  # the disk slows down for seconds after a burst of writes
        t0 = time.perf_counter()
        back = torch.load(path)
        print("torch_load_cold_s", time.perf_counter() - t0, flush=True)
        del back
        t0 = time.perf_counter()
        back = torch.load(path)
        print("torch_load_warm_s", time.perf_counter() - t0, flush=True)
        assert torch.equal(back["layers.0.w0"], state["layers.0.w0"])
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
