#!/usr/bin/python3
"""Peak memory of `ckpt import` and `ckpt export --layout megatron` on a Megatron-LM tp=2
checkpoint of SIZE GiB (default 2.1), written here with torch the way Megatron's
save_checkpoint lays it out; then of exporting it as one safetensors file and importing that;
then of importing a GPT-NeoX pipeline with ZeRO 2 partitions (tests/cli/deepspeed_writer.py). Prints the source's size, its largest tensor and each command's
peak RSS (from /usr/bin/time -f %M), and the ratio of that to the source.

    bench/import_memory.py CKPT_TOOL [--gib 2.1] [--zero-hidden 2048] [--dir DIR]
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile

import torch

ap = argparse.ArgumentParser()
ap.add_argument("tool")
ap.add_argument("--gib", type=float, default=2.1)
ap.add_argument("--dir", default=None)
ap.add_argument("--zero-hidden", type=int, default=2048, help="hidden size of the NeoX/ZeRO source")
a = ap.parse_args()

work = tempfile.mkdtemp(prefix="ckpt-import-memory-", dir=a.dir)
try:
    # 8 layers of a wide MLP: each rank holds half of every fc1 (rows) and fc2 (columns).
    layers, hidden = 8, 1024
    per_layer = a.gib * 2**30 / layers  # bytes of fp32, both ranks together
    ffn = int(per_layer / 4 / hidden / 2 / 2) * 2
    src = os.path.join(work, "src")
    tag = os.path.join(src, "iter_0000100")
    largest = 0
    total = 0
    for t in range(2):
        sd = collections.OrderedDict()
        g = torch.Generator().manual_seed(t)
        for L in range(layers):
            fc1 = torch.empty(ffn // 2, hidden).uniform_(generator=g)
            fc2 = torch.empty(hidden, ffn // 2).uniform_(generator=g)
            sd[f"decoder.layers.{L}.mlp.linear_fc1.weight"] = fc1
            sd[f"decoder.layers.{L}.mlp.linear_fc2.weight"] = fc2
            sd[f"decoder.layers.{L}.input_layernorm.weight"] = torch.ones(hidden)
            largest = max(largest, fc1.numel() * 4)
            total += (fc1.numel() + fc2.numel() + hidden) * 4
        folder = os.path.join(tag, f"mp_rank_{t:02d}")
        os.makedirs(folder)
        torch.save({"iteration": 100, "checkpoint_version": 3.0, "model": sd}, os.path.join(folder, "model_optim_rng.pt"))
        del sd
    with open(os.path.join(src, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("100")
    print(f"source: Megatron-LM tp=2, {total / 2**30:.2f} GiB in {2 * 3 * layers} tensors, the largest {largest / 2**20:.0f} MiB")
    print("| command | peak RSS | / source |")
    print("|---|---:|---:|")

    def measure(label, *args):
        p = subprocess.run(["/usr/bin/time", "-f", "%M", a.tool, *args], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{label} failed: {p.stderr}")
        kib = int(p.stderr.strip().splitlines()[-1])
        print(f"| `{label}` | {kib / 1024:.0f} MiB | {kib * 1024 / total:.3f} |")

    root = os.path.join(work, "root")
    measure("ckpt import SRC ROOT", "import", src, root)
    measure("ckpt export ROOT OUT --format torch --layout megatron", "export", root, os.path.join(work, "back"), "--format", "torch",
            "--layout", "megatron")
    shutil.rmtree(os.path.join(work, "back"))
    st = os.path.join(work, "model.safetensors")
    measure("ckpt export ROOT model.safetensors", "export", root, st, "--format", "safetensors")
    shutil.rmtree(src)
    measure("ckpt import model.safetensors ROOT2", "import", st, os.path.join(work, "root2"))
    shutil.rmtree(os.path.join(work, "root2"))
    os.remove(st)
    shutil.rmtree(root)

    # GPT-NeoX through DeepSpeed's PipelineEngine with ZeRO 2 (tests/cli/deepspeed_writer.py):
    # tp=2 pp=2 dp=2, the optimizer state cut into partitions.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "cli"))
    import deepspeed_writer as dsw
    neox = os.path.join(work, "neox")
    dsw.write(neox, dsw.neox_pipeline_model(1, hidden=a.zero_hidden, vocab=4 * a.zero_hidden), 2, 2, 2, 100)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(neox) for f in fs)
    print(f"\nsource: GPT-NeoX pipeline tp=2 pp=2 with ZeRO 2 over dp=2, hidden {a.zero_hidden}: {size / 2**30:.2f} GiB in "
          f"{sum(len(fs) for _, _, fs in os.walk(neox))} files")
    print("| command | peak RSS | / source |")
    print("|---|---:|---:|")
    total = size
    measure("ckpt import SRC ROOT", "import", neox, os.path.join(work, "neox_root"))
finally:
    shutil.rmtree(work)
