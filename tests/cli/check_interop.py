#!/usr/bin/python3
"""`ckpt export` and `ckpt import` against the real PyTorch (Debian's python3-torch, which only
/usr/bin/python3 imports): what ckpt exports, torch.load reads with every value exact; what
torch.save writes, ckpt imports and exports back unchanged; a hostile pickle is refused.

    check_interop.py CKPT_TOOL MAKE_CKPT        (exit 77, skipped, without torch)
"""
import argparse
import collections
import json
import math
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
import tempfile

from harness import Harness
import zipfile

try:
    import numpy
    import torch
except ImportError:
    print("torch is not importable from this python: skipped")
    sys.exit(77)
import deepspeed_writer as dsw  # noqa: E402 (it needs torch)

h = Harness(sys.argv[1], sys.argv[2])
run, make, check, case = h.run, h.make, h.check, h.case


# The model tests/cli/make_ckpt.cpp saves: name -> (rows, cols, salt, dtype), and its values.
MODEL = {
    "embed.weight": (64, 16, 1, torch.float32),
    "layers.0.fc1.weight": (48, 16, 2, torch.float32),
    "layers.0.fc2.weight": (16, 48, 3, torch.float32),
    "layers.0.norm.weight": (1, 16, 4, torch.float32),
    "layers.1.fc1.weight": (48, 16, 8, torch.float32),
    "layers.0.fc1.weight_bf16": (48, 16, 7, torch.bfloat16),
    "optimizer.exp_avg.embed.weight": (64, 16, 5, torch.float32),
    "optimizer.exp_avg.layers.0.fc1.weight": (48, 16, 6, torch.float32),
}


def expected(name, iteration=300, seed=1):
    rows, cols, salt, dtype = MODEL[name]
    vals = []
    for g in range(rows * cols):
        x = ((g * 2654435761 + salt * 97 + seed * 13) % 10007) / 10007.0
        vals.append(math.sin(x * 6.283) * 0.02 + iteration * 1e-4)
    # C++ rounds the double to float, then (for bf16) the float to bf16, to nearest even.
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32).to(dtype).reshape(rows, cols)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                                                                      b.contiguous().view(-1).view(torch.uint8) if b.numel() else b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    names = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        raw = bytearray(data[b:e])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[k] = t.view(names[v["dtype"]]).reshape(v["shape"])
    return out, meta


tmp = tempfile.mkdtemp(prefix="ckpt-interop-")
src = os.path.join(tmp, "src")
make(src, "--iterations", "300", "--tp", "2", "--codec", "zstd_bytegroup")


@case
def torch_loads_the_export():
    out = os.path.join(tmp, "model.pt")
    run("export", src, out, "--format", "torch")
    sd = torch.load(out, weights_only=True)
    check(sorted(sd) == sorted(MODEL), list(sd))
    for name in MODEL:
        check(same(expected(name), sd[name]), f"{name} differs")
    # Imported back, it holds the same tensors; the config (a state dict has none) differs.
    root = os.path.join(tmp, "reimported")
    run("import", out, root)
    check(run("diff", src, root, "--no-values", "--no-config").stdout.rstrip().endswith("EQUAL"), "import differs")
    p = run("diff", src, root, "--no-values", expect=1)
    check("config seed: A 1, B (absent)" in p.stdout, p.stdout)


@case
def bf16_model_only_export():
    out = os.path.join(tmp, "model_bf16.pt")
    run("export", src, out, "--format", "torch", "--dtype", "bf16", "--no-optimizer")
    sd = torch.load(out)
    check(sorted(sd) == sorted(n for n in MODEL if not n.startswith("optimizer.")), list(sd))
    for name, t in sd.items():
        check(same(expected(name).to(torch.bfloat16), t), f"{name} differs from torch's own bf16 rounding")


@case
def megatron_layout():
    out = os.path.join(tmp, "model_optim_rng.pt")
    run("export", src, out, "--format", "torch", "--layout", "megatron")
    d = torch.load(out)
    check(d["iteration"] == 300 and d["checkpoint_version"] == 3.0, d.keys())
    check(d["args"] == {"hidden_size": 16, "layers": 1, "seed": 1, "lr": 3e-4, "precision": 'bf16 "mixed"', "bias": True}, d["args"])
    check(sorted(d["model"]) == sorted(n for n in MODEL if not n.startswith("optimizer.")), list(d["model"]))
    check(sorted(d["optimizer"]) == ["exp_avg.embed.weight", "exp_avg.layers.0.fc1.weight"], list(d["optimizer"]))
    check(same(expected("optimizer.exp_avg.embed.weight"), d["optimizer"]["exp_avg.embed.weight"]), "optimizer state differs")


@case
def sharded_exports():
    pt = os.path.join(tmp, "pt")
    run("export", src, pt, "--format", "torch", "--max-shard-size", "8KB")
    index = json.load(open(os.path.join(pt, "pytorch_model.bin.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    check(len(shards) > 1 and shards[0] == f"pytorch_model-00001-of-{len(shards):05d}.bin", shards)
    seen = {}
    for s in shards:
        for k, v in torch.load(os.path.join(pt, s)).items():
            check(index["weight_map"][k] == s, (k, s))
            seen[k] = v
    check(sorted(seen) == sorted(MODEL) and index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in seen.values()), index)
    for name in MODEL:
        check(same(expected(name), seen[name]), f"{name} differs")
    st = os.path.join(tmp, "st")
    run("export", src, st, "--format", "safetensors", "--max-shard-size", "8KB")
    index = json.load(open(os.path.join(st, "model.safetensors.index.json")))
    seen = {}
    for s in sorted(set(index["weight_map"].values())):
        tensors, meta = read_safetensors(os.path.join(st, s))
        check(meta.get("ckpt_iteration") == "300" and meta.get("format") == "pt", meta)
        seen.update(tensors)
    check(sorted(seen) == sorted(MODEL), list(seen))
    for name in MODEL:
        check(same(expected(name), seen[name]), f"{name} differs in safetensors")


@case
def torch_save_imports_and_exports_back():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
    lin = torch.nn.Linear(6, 3).to(torch.bfloat16)
    state = {
        "model": {"w": base.t(),                      # non-contiguous
                  "row": base[1],                     # shares base's storage, with an offset
                  "half": torch.linspace(-2, 2, 9, dtype=torch.float16),
                  "lin": lin.state_dict(),            # bf16 parameters
                  "p": torch.nn.Parameter(torch.ones(2, 2, dtype=torch.float64)),
                  "idx": torch.tensor([1, -2, 3], dtype=torch.int64),
                  "mask": torch.tensor([True, False, True]),
                  "layers": [torch.full((2,), float(i)) for i in range(3)]},
        "epoch": 7, "name": "tiny", "lr": 0.25, "note": None,
    }
    f = os.path.join(tmp, "torch_saved.pt")
    torch.save(state, f)
    root = os.path.join(tmp, "imported")
    p = run("import", f, root, "--iteration", "42")
    check("as global_step42" in p.stdout, p.stdout)
    j = json.loads(run("inspect", root, "--json").stdout)
    check(j["iteration"] == 42 and j["config"] == {"epoch": 7, "name": "tiny", "lr": 0.25}, j["config"])
    types = {t["name"]: (t["dtype"], t["shape"]) for t in j["tensors"]}
    check(types["model.w"] == ("f32", [6, 4]) and types["model.lin.weight"] == ("bf16", [3, 6]), types)
    check(types["model.layers.2"] == ("f32", [2]) and types["model.mask"] == ("bool", [3]), types)
    run("verify", root)
    back = os.path.join(tmp, "back.pt")
    run("export", root, back, "--format", "torch")
    sd = torch.load(back)
    flat = {"model.w": base.t(), "model.row": base[1], "model.half": state["model"]["half"],
            "model.lin.weight": lin.weight.detach(), "model.lin.bias": lin.bias.detach(),
            "model.p": state["model"]["p"].detach(), "model.idx": state["model"]["idx"], "model.mask": state["model"]["mask"],
            **{f"model.layers.{i}": t for i, t in enumerate(state["model"]["layers"])}}
    check(sorted(sd) == sorted(flat), sorted(sd))
    for k, v in flat.items():
        check(same(sd[k], v.contiguous()), f"{k} differs after import and export")


@case
def megatron_checkpoint_imports():
    d = {"iteration": 1200, "checkpoint_version": 3.0,
         "args": {"num_layers": 2, "hidden_size": 8, "fp16": False},
         "model": {"language_model": {"embedding": torch.randn(10, 8), "layers.0.w": torch.randn(8, 8)}},
         "optimizer": {"state": {0: {"exp_avg": torch.randn(10, 8), "step": 5}}, "param_groups": [{"lr": 0.1}]},
         "rng_state": [{"random_rng_state": torch.ByteTensor([1, 2, 3])}]}
    f = os.path.join(tmp, "mp_rank_00_model_optim_rng.pt")
    # Megatron's mixed-precision optimizer, as Float16OptimizerWithFloat16Params.state_dict()
    # nests it: the torch optimizer's state_dict, fp32 masters as a list of lists, the scaler.
    mixed = dict(d, optimizer={"optimizer": {"state": {0: {"exp_avg": torch.randn(4), "step": 3}, 1: {"exp_avg": torch.randn(2), "step": 3}},
                                             "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0, 1]}, {"lr": 0.1, "params": []}]},
                               "fp32_from_fp16_params": [[torch.randn(4), torch.randn(2)], []], "grad_scaler": {"scale": 4096.0, "growth_tracker": 7}})
    fm = os.path.join(tmp, "mixed_model_optim_rng.pt")
    torch.save(mixed, fm)
    run("import", fm, os.path.join(tmp, "from_mixed_megatron"))
    outm = os.path.join(tmp, "mixed_again.pt")
    run("export", os.path.join(tmp, "from_mixed_megatron"), outm, "--format", "torch", "--layout", "megatron")
    got, want = torch.load(outm)["optimizer"], mixed["optimizer"]

    def same_tree(a, b, where):
        check(type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), f"{where}: {type(a).__name__} vs {type(b).__name__}")
        if isinstance(a, dict):
            check(sorted(a, key=repr) == sorted(b, key=repr), f"{where}: keys {list(a)} vs {list(b)}")  # (order: load_state_dict ignores it)
            for k in a:
                same_tree(a[k], b[k], f"{where}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            check(len(a) == len(b), f"{where}: length")
            for i, (x, y) in enumerate(zip(a, b)):
                same_tree(x, y, f"{where}[{i}]")
        elif isinstance(a, torch.Tensor):
            check(torch.equal(a, b), f"{where}: tensor")
        else:
            check(a == b, f"{where}: {a!r} vs {b!r}")
    same_tree(got, want, "optimizer")
    torch.save(d, f)
    root = os.path.join(tmp, "from_megatron")
    run("import", f, root)
    j = json.loads(run("inspect", root, "--json").stdout)
    check(j["iteration"] == 1200, j["iteration"])
    check(j["config"] == {"num_layers": 2, "hidden_size": 8, "fp16": False, "optimizer.state.0.step": 5,
                          "optimizer.param_groups.0.lr": 0.1, "ckpt_import.containers": "int-keys optimizer.state\nlist optimizer.param_groups"},
          j["config"])
    names = sorted(t["name"] for t in j["tensors"])
    check(names == ["language_model.embedding", "language_model.layers.0.w", "optimizer.state.0.exp_avg",
                    "rng_state.0.random_rng_state"], names)
    out = os.path.join(tmp, "again.pt")
    run("export", root, out, "--format", "torch", "--layout", "megatron")
    e = torch.load(out)
    check(torch.equal(e["model"]["language_model.embedding"], d["model"]["language_model"]["embedding"]), "embedding")
    # the optimizer as torch's state_dict() has it, which Megatron's load_checkpoint hands to
    # optimizer.load_state_dict: int-keyed state, param_groups a list
    o = e["optimizer"]
    check(list(o) == ["state", "param_groups"] and list(o["state"]) == [0] and o["param_groups"] == [{"lr": 0.1}], o)
    check(torch.equal(o["state"][0]["exp_avg"], d["optimizer"]["state"][0]["exp_avg"]) and o["state"][0]["step"] == 5, "exp_avg, step")
    check("optimizer.state.0.step" not in e["args"] and not any(k.startswith("ckpt_import") for k in e["args"]), e["args"])
    check(e["iteration"] == 1200, e["iteration"])


@case
def safetensors_import_round_trip():
    st = os.path.join(tmp, "model.safetensors")
    run("export", src, st, "--format", "safetensors", "--dtype", "f16")
    root = os.path.join(tmp, "from_st")
    p = run("import", st, root)
    check("iteration 300" in p.stdout, p.stdout)
    tensors, _ = read_safetensors(st)
    out = os.path.join(tmp, "from_st.pt")
    run("export", root, out, "--format", "torch")
    sd = torch.load(out)
    for name in MODEL:
        want = expected(name).to(torch.float16)
        check(same(want, sd[name]) and same(want, tensors[name]), f"{name} differs")


def draws(root, name, n):
    """The next n outputs of RNG value NAME of ROOT, drawn in C++ (make_ckpt --draw)."""
    p = subprocess.run([sys.argv[2], "--draw", root, name, str(n)], capture_output=True, text=True)
    check(p.returncode == 0, f"make_ckpt --draw {name}: {p.stderr.strip()}")
    return [int(x) for x in p.stdout.split()]


@case
def megatron_file_imports_faithfully():
    # Megatron-LM's model_optim_rng.pt (megatron/training/checkpointing.py, read): args as an
    # argparse.Namespace holding a torch dtype, checkpoint_version, the model under "model",
    # rng_state as a list with one dict of Python's, numpy's and torch's RNG states.
    random.seed(123)
    numpy.random.seed(321)
    numpy.random.standard_normal()  # numpy now holds a spare Gaussian
    args = argparse.Namespace(num_layers=2, hidden_size=8, fp16=False, lr=3e-4, tokenizer_type="GPT2BPETokenizer",
                              params_dtype=torch.float16, vocab_file=None)
    d = {"args": args, "checkpoint_version": 3.0, "iteration": 700,
         "model": collections.OrderedDict([("embedding.word_embeddings.weight", torch.randn(10, 8)),
                                           ("decoder.layers.0.mlp.linear_fc1.weight", torch.randn(16, 8))]),
         "optimizer": {"state": {0: {"exp_avg": torch.randn(10, 8), "step": 5}}, "param_groups": [{"lr": 0.1}]},
         "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
                        "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}],
         "num_floating_point_operations_so_far": 1.5e15}
    py_next = [random.getrandbits(32) for _ in range(5)]
    np_next = [int(x) for x in numpy.random.randint(0, 2 ** 32, size=5, dtype=numpy.uint64)]
    folder = os.path.join(tmp, "megatron", "iter_0000700", "mp_rank_00")
    os.makedirs(folder)
    f = os.path.join(folder, "model_optim_rng.pt")
    torch.save(d, f)
    root = os.path.join(tmp, "from_megatron_file")
    p = run("import", f, root)
    check("2 RNG states" in p.stdout, p.stdout)
    check("left out args.vocab_file (None)" in p.stderr or "left out vocab_file (None)" in p.stderr, p.stderr)
    j = json.loads(run("inspect", root, "--json").stdout)
    check(j["iteration"] == 700, j["iteration"])
    c = j["config"]
    check(c["num_layers"] == 2 and c["hidden_size"] == 8 and c["fp16"] is False and c["lr"] == 3e-4, c)
    check(c["tokenizer_type"] == "GPT2BPETokenizer" and c["params_dtype"] == "float16", c)
    check(c["rng_state.0.np_rng_state.has_gauss"] == 1, c)
    check(c["rng_state.0.np_rng_state.cached_gaussian"] == d["rng_state"][0]["np_rng_state"][4], c)
    names = sorted(t["name"] for t in j["tensors"])
    check("embedding.word_embeddings.weight" in names and "decoder.layers.0.mlp.linear_fc1.weight" in names, names)
    check("optimizer.state.0.exp_avg" in names and "rng_state.0.torch_rng_state" in names, names)
    # A C++ engine that loads the states draws what Python and numpy would have drawn next.
    check(draws(root, "rng_state.0.random_rng_state", 5) == py_next, "Python's random does not continue in C++")
    check(draws(root, "rng_state.0.np_rng_state", 5) == np_next, "numpy's RandomState does not continue in C++")


@case
def neox_deepspeed_file_imports_faithfully():
    # GPT-NeoX through DeepSpeed (deepspeed/runtime/engine.py _save_checkpoint and GPT-NeoX's
    # megatron/checkpointing.py, read): weights under "module", DeepSpeed's bookkeeping (a set of
    # sparse module names, param_shapes of torch.Size, global_steps, ds_config) and NeoX's client
    # state: iteration, args as a dict, the RNG states, checkpoint_validation_logits.
    random.seed(5)
    numpy.random.seed(6)
    logits = torch.randn(4, 11)
    module = collections.OrderedDict([("sequential.0.word_embeddings.weight", torch.randn(12, 8)),
                                      ("sequential.2.attention.dense.weight", torch.randn(8, 8))])
    d = {"module": module, "buffer_names": [], "optimizer": None,
         "param_shapes": [collections.OrderedDict([(k, v.shape) for k, v in module.items()])],
         "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None, "lr_scheduler": None,
         "data_sampler": None, "random_ltd": None, "sparse_tensor_module_names": set(), "skipped_steps": 0,
         "global_steps": 200, "global_samples": 6400, "dp_world_size": 1, "mp_world_size": 1,
         "ds_config": {"train_batch_size": 32, "fp16": {"enabled": True}}, "ds_version": "0.16.5",
         "iteration": 200, "args": {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "max_position_embeddings": 64,
                                    "make_vocab_size_divisible_by": 128, "padded_vocab_size": 128,
                                    "tokenizer_type": "HFTokenizer", "model_parallel_size": 1},
         "random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
         "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.ByteTensor(16), "rng_tracker_states": {},
         "checkpoint_validation_logits": logits}
    py_next = [random.getrandbits(32) for _ in range(3)]
    folder = os.path.join(tmp, "neox", "global_step200")
    os.makedirs(folder)
    f = os.path.join(folder, "mp_rank_00_model_states.pt")
    torch.save(d, f)
    root = os.path.join(tmp, "from_neox_file")
    run("import", f, root)
    j = json.loads(run("inspect", root, "--json").stdout)
    check(j["iteration"] == 200, j["iteration"])  # from "iteration", not 0
    names = sorted(t["name"] for t in j["tensors"])
    check("sequential.0.word_embeddings.weight" in names and not any(n.startswith("module.") for n in names), names)
    check("__ckpt.validation_logits" in names and "checkpoint_validation_logits" not in names, names)
    check(j["config"]["hidden_size"] == 8 and j["config"]["global_steps"] == 200 and j["config"]["ds_version"] == "0.16.5", j["config"])
    check(draws(root, "random_rng_state", 3) == py_next, "Python's random does not continue in C++")
    out = os.path.join(tmp, "neox_back.pt")
    run("export", root, out, "--format", "torch")
    sd = torch.load(out)
    check(torch.equal(sd["sequential.2.attention.dense.weight"], module["sequential.2.attention.dense.weight"]), "weights differ")


@case
def iteration_from_the_tag_folder():
    folder = os.path.join(tmp, "plain", "global_step42")
    os.makedirs(folder)
    f = os.path.join(folder, "weights.pt")
    torch.save({"w": torch.ones(3)}, f)
    root = os.path.join(tmp, "from_folder")
    run("import", f, root)
    check(json.loads(run("inspect", root, "--json").stdout)["iteration"] == 42, "iteration not taken from global_step42")


def megatron_global_model(seed):
    """A 4-layer model as whole tensors: name -> (tensor, split dim or -1), Megatron-core names."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)
    m = {"embedding.word_embeddings.weight": (r(32, 8), 0), "decoder.final_layernorm.weight": (r(8), -1),
         "output_layer.weight": (r(32, 8), 0)}
    for L in range(4):
        p = f"decoder.layers.{L}."
        m.update({p + "input_layernorm.weight": (r(8), -1), p + "self_attention.linear_qkv.weight": (r(24, 8), 0),
                  p + "self_attention.linear_qkv.bias": (r(24), 0), p + "self_attention.linear_proj.weight": (r(8, 8), 1),
                  p + "self_attention.linear_proj.bias": (r(8), -1), p + "mlp.linear_fc1.weight": (r(16, 8), 0),
                  p + "mlp.linear_fc2.weight": (r(8, 16), 1)})
    return m


def shard(t, dim, rank, tp):
    return t if dim < 0 else t.chunk(tp, dim)[rank].clone()


def write_megatron(root, model, tp, pp, iteration, bad=None):
    """Megatron-LM's layout, as its save_checkpoint writes it: one model_optim_rng.pt per (tp, pp)
    rank, each stage's layers numbered from 0, the tracker file at the root."""
    per_stage = 4 // pp
    tag = os.path.join(root, f"iter_{iteration:07d}")
    for p in range(pp):
        for t in range(tp):
            sd = collections.OrderedDict()
            for name, (tensor, dim) in model.items():
                layer = name.split(".")[2] if name.startswith("decoder.layers.") else None
                if layer is not None:
                    L = int(layer)
                    if L // per_stage != p:
                        continue
                    name = name.replace(f"layers.{L}.", f"layers.{L - p * per_stage}.")
                elif name.startswith("embedding.") and p != 0 or (name.startswith(("output_layer", "decoder.final")) and p != pp - 1):
                    continue
                sd[name] = shard(tensor, dim, t, tp)
            if bad == "dtype" and (t, p) == (1, 0):
                sd["decoder.layers.0.mlp.linear_fc1.weight"] = sd["decoder.layers.0.mlp.linear_fc1.weight"].half()
            if bad == "replica" and (t, p) == (1, 0):
                sd["decoder.layers.0.input_layernorm.weight"] = sd["decoder.layers.0.input_layernorm.weight"] + 1
            random.seed(100 + t + 10 * p)
            d = {"args": argparse.Namespace(num_layers=4, hidden_size=8, tensor_model_parallel_size=tp,
                                            pipeline_model_parallel_size=pp, params_dtype=torch.float32),
                 "checkpoint_version": 3.0, "iteration": iteration, "model": sd,
                 "optimizer": {"state": {0: {"exp_avg": torch.full((3,), float(t + 10 * p)), "step": 9}}},
                 "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": numpy.random.RandomState(7 + t + 10 * p).get_state(),
                                "torch_rng_state": torch.get_rng_state()}]}
            folder = os.path.join(tag, f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else ""))
            os.makedirs(folder)
            torch.save(d, os.path.join(folder, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    return tag


@case
def megatron_tp2_pp2_checkpoint_imports():
    model = megatron_global_model(1)
    src = os.path.join(tmp, "mlm_tp2pp2")
    write_megatron(src, model, 2, 2, 500)
    root = os.path.join(tmp, "from_mlm_tp2pp2")
    p = run("import", src, root)  # the root: latest_checkpointed_iteration.txt names the tag
    check("tp=2 pp=2, 4 files" in p.stdout and "iteration 500" in p.stdout, p.stdout)
    check("optimizer.state.0.exp_avg is each rank's own" in p.stderr, p.stderr)
    j = json.loads(run("inspect", root, "--json").stdout)
    check(j["topology"]["tp"] == 2 and j["topology"]["pp"] == 2 and j["iteration"] == 500, j["topology"])
    check(j["config"]["num_layers"] == 4 and j["config"]["params_dtype"] == "float32", j["config"])
    shapes = {t["name"]: t["shape"] for t in j["tensors"]}
    for name, (tensor, _) in model.items():
        check(shapes.get(name) == list(tensor.shape), (name, shapes.get(name)))
    check(shapes["optimizer.state.0.exp_avg"] == [4, 3], shapes["optimizer.state.0.exp_avg"])
    run("verify", root)
    # One global tensor per name, equal to the model the shards came from; and again after a
    # reshard to tp=1 in C++ (what a C++ engine resuming at another tp reads).
    for r, label in ((root, "tp=2 pp=2"), (os.path.join(tmp, "mlm_tp1"), "resharded to tp=1")):
        if r != root:
            run("reshard", root, r, "--tp", "1")
        out = os.path.join(tmp, "mlm_export.pt")
        run("export", r, out, "--format", "torch")
        sd = torch.load(out)
        for name, (tensor, _) in model.items():
            check(name in sd and torch.equal(sd[name], tensor), f"{label}: {name} is not the global tensor")
        check(torch.equal(sd["optimizer.state.0.exp_avg"][3], torch.full((3,), 11.0)), f"{label}: per-rank optimizer state")
        os.remove(out)
    # And back: Megatron-LM's layout, per rank, as its load_checkpoint indexes it.
    back = os.path.join(tmp, "mlm_back")
    p = run("export", root, back, "--format", "torch", "--layout", "megatron")
    with open(os.path.join(back, "latest_checkpointed_iteration.txt")) as f:
        check(f.read().strip() == "500", "tracker file")
    for pp in range(2):
        for tp in range(2):
            rel = os.path.join("iter_0000500", f"mp_rank_{tp:02d}_{pp:03d}", "model_optim_rng.pt")
            want, got = torch.load(os.path.join(src, rel)), torch.load(os.path.join(back, rel))
            check(isinstance(got["args"], argparse.Namespace) and got["args"].num_layers == 4 and got["args"].hidden_size == 8,
                  f"{rel}: args {got['args']!r}")
            check(got["checkpoint_version"] == 3.0 and got["iteration"] == 500, f"{rel}: version or iteration")
            # the same keys (in name order: load_state_dict does not depend on the order)
            check(sorted(got["model"].keys()) == sorted(want["model"].keys()), f"{rel}: model keys {list(got['model'].keys())}")
            for k, v in want["model"].items():
                check(torch.equal(got["model"][k], v), f"{rel}: {k} differs")
            go, wo = got["optimizer"], want["optimizer"]
            check(list(go["state"]) == [0] and torch.equal(go["state"][0]["exp_avg"], wo["state"][0]["exp_avg"]) and
                  go["state"][0]["step"] == 9, f"{rel}: optimizer {go}")
            check(not any(k.startswith("optimizer") for k in vars(got["args"])), f"{rel}: optimizer entries in args")
            g, w = got["rng_state"][0], want["rng_state"][0]
            check(g["random_rng_state"] == w["random_rng_state"], f"{rel}: Python's RNG state differs")
            check(torch.equal(g["torch_rng_state"], w["torch_rng_state"]), f"{rel}: torch's RNG state differs")
            gn, wn = g["np_rng_state"], w["np_rng_state"]
            check(gn[0] == "MT19937" and numpy.array_equal(gn[1], wn[1]) and gn[1].dtype == wn[1].dtype and gn[2:] == wn[2:],
                  f"{rel}: numpy's RNG state differs")
            numpy.random.set_state(gn)
            random.setstate(g["random_rng_state"])  # what Megatron's load_checkpoint does with it
    # --dtype applies per rank as it does to one file: floating tensors converted, RNG bytes not
    half = os.path.join(tmp, "mlm_back_bf16")
    run("export", root, half, "--format", "torch", "--layout", "megatron", "--dtype", "bf16")
    h = torch.load(os.path.join(half, "iter_0000500", "mp_rank_01_001", "model_optim_rng.pt"))
    w = torch.load(os.path.join(src, "iter_0000500", "mp_rank_01_001", "model_optim_rng.pt"))
    check(all(v.dtype == torch.bfloat16 and torch.equal(v, w["model"][k].to(torch.bfloat16)) for k, v in h["model"].items()), "bf16 export")
    check(h["rng_state"][0]["torch_rng_state"].dtype == torch.uint8, "the RNG bytes were converted")
    # import of the export gives back the same checkpoint
    again = os.path.join(tmp, "from_mlm_back")
    run("import", back, again)
    check(run("diff", root, again).stdout.rstrip().endswith("EQUAL"), "import of the export differs from the first import")


@case
def megatron_tag_folder_and_tp2_only():
    model = megatron_global_model(2)
    # A tensor the naming rules do not know (an adapter of the user's), split by rows.
    model["decoder.layers.0.adapter.weight"] = (torch.randn(6, 8, generator=torch.Generator().manual_seed(4)), 0)
    src = os.path.join(tmp, "mlm_tp2")
    tag = write_megatron(src, model, 2, 1, 80)
    bad_root = os.path.join(tmp, "from_mlm_nosplit")
    p = run("import", tag, bad_root, expect="nonzero")
    check("decoder.layers.0.adapter.weight" in p.stderr and "--split" in p.stderr, p.stderr)
    check(not os.path.exists(os.path.join(bad_root, "latest")), "a failed import committed")
    root = os.path.join(tmp, "from_mlm_tp2")
    run("import", tag, root, "--split", "*adapter.weight=0")  # one tag folder; --split says how
    out = os.path.join(tmp, "mlm_tp2.pt")
    run("export", root, out, "--format", "torch")
    sd = torch.load(out)
    for n, (t, _) in model.items():
        check(n in sd and torch.equal(sd[n], t), f"tp=2 import: {n} differs from the model")


@case
def megatron_release_and_tag_override():
    # Megatron's tracker may say "release" (a converted checkpoint in release/); --tag picks
    # another tag of the root than the tracker names.
    model = megatron_global_model(5)
    src = os.path.join(tmp, "mlm_release")
    tag = write_megatron(src, model, 2, 1, 60)
    os.rename(tag, os.path.join(src, "release"))
    with open(os.path.join(src, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release\n")
    write_megatron(os.path.join(tmp, "mlm_other"), model, 2, 1, 90)
    shutil.move(os.path.join(tmp, "mlm_other", "iter_0000090"), os.path.join(src, "iter_0000090"))
    root = os.path.join(tmp, "from_release")
    p = run("import", src, root)
    check("release" in p.stdout and "iteration 60" in p.stdout, p.stdout)
    root2 = os.path.join(tmp, "from_tag90")
    p = run("import", src, root2, "--tag", "iter_0000090")
    check("iter_0000090" in p.stdout and "iteration 90" in p.stdout, p.stdout)
    p = run("import", src, os.path.join(tmp, "from_tag_missing"), "--tag", "iter_0000007", expect="nonzero")
    check("iter_0000007" in p.stderr, p.stderr)


@case
def bad_megatron_checkpoints_are_refused():
    model = megatron_global_model(3)
    for bad, needles in (("dtype", ["decoder.layers.0.mlp.linear_fc1.weight", "f32", "f16", "mp_rank_01_000"]),
                         ("replica", ["decoder.layers.0.input_layernorm.weight", "replicated but differs", "mp_rank_01_000"])):
        src = os.path.join(tmp, f"mlm_bad_{bad}")
        write_megatron(src, model, 2, 2, 10, bad=bad)
        root = os.path.join(tmp, f"from_mlm_bad_{bad}")
        p = run("import", src, root, expect="nonzero")
        for n in needles:
            check(n in p.stderr, f"{bad}: message lacks {n!r}: {p.stderr}")
        check(not os.path.exists(os.path.join(root, "latest")), f"{bad}: something was committed")
    src = os.path.join(tmp, "mlm_missing")
    tag = write_megatron(src, model, 2, 2, 10)
    shutil.rmtree(os.path.join(tag, "mp_rank_01_001"))
    p = run("import", src, os.path.join(tmp, "from_mlm_missing"), expect="nonzero")
    check("mp_rank_01_001/model_optim_rng.pt is missing" in p.stderr, p.stderr)
    empty = os.path.join(tmp, "not_a_checkpoint")
    os.makedirs(empty)
    p = run("import", empty, os.path.join(tmp, "from_nothing"), expect="nonzero")
    check("is not a checkpoint ckpt import reads" in p.stderr, p.stderr)


@case
def neox_tp2_checkpoint_imports():
    # GPT-NeoX through DeepSpeed without pipeline parallelism: global_stepN/mp_rank_TT_model_states.pt
    # with the weights under "module", and `latest` naming the tag (ZeRO partitions and pipeline
    # layer files: neox_pipeline_with_zero_imports).
    g = torch.Generator().manual_seed(9)
    whole = {"sequential.0.word_embeddings.weight": (torch.randn(16, 8, generator=g), 0),
             "sequential.2.input_layernorm.weight": (torch.randn(8, generator=g), -1),
             "sequential.2.attention.query_key_value.weight": (torch.randn(24, 8, generator=g), 0),
             "sequential.2.attention.dense.weight": (torch.randn(8, 8, generator=g), 1),
             "sequential.2.attention.dense.bias": (torch.randn(8, generator=g), -1),
             "sequential.2.mlp.dense_h_to_4h.weight": (torch.randn(32, 8, generator=g), 0),
             "sequential.2.mlp.dense_4h_to_h.weight": (torch.randn(8, 32, generator=g), 1),
             "sequential.4.norm.weight": (torch.randn(8, generator=g), -1),
             "sequential.5.final_linear.weight": (torch.randn(16, 8, generator=g), 0)}
    src = os.path.join(tmp, "neox_tp2")
    tag = os.path.join(src, "global_step300")
    os.makedirs(tag)
    neox_args = {"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "max_position_embeddings": 64,
                 "make_vocab_size_divisible_by": 8, "padded_vocab_size": 16, "tokenizer_type": "HFTokenizer", "model_parallel_size": 2}
    logits = torch.randn(2, 16)
    for t in range(2):
        module = collections.OrderedDict((n, shard(x, d, t, 2)) for n, (x, d) in whole.items())
        random.seed(40 + t)
        torch.save({"module": module, "optimizer": None, "global_steps": 300, "skipped_steps": 2, "global_samples": 9600, "iteration": 300,
                    "sparse_tensor_module_names": set(), "mp_world_size": 2, "dp_world_size": 1,
                    "param_shapes": [collections.OrderedDict((n, v.shape) for n, v in module.items())], "ds_version": "0.16.5",
                    "args": neox_args, "random_rng_state": random.getstate(),
                    "np_rng_state": numpy.random.RandomState(50 + t).get_state(), "torch_rng_state": torch.get_rng_state(),
                    "cuda_rng_state": torch.full((16,), t, dtype=torch.uint8),
                    "rng_tracker_states": {"model-parallel-rng": torch.full((16,), 9 + t, dtype=torch.uint8)},
                    "checkpoint_validation_logits": logits},
                   os.path.join(tag, f"mp_rank_{t:02d}_model_states.pt"))
    with open(os.path.join(src, "latest"), "w") as f:
        f.write("global_step300")
    root = os.path.join(tmp, "from_neox_tp2")
    p = run("import", src, root)
    check("GPT-NeoX/DeepSpeed" in p.stdout and "tp=2 pp=1" in p.stdout and "iteration 300" in p.stdout, p.stdout)
    out = os.path.join(tmp, "neox_tp2.pt")
    run("export", root, out, "--format", "torch")
    sd = torch.load(out)
    for n, (x, _) in whole.items():
        check(n in sd and torch.equal(sd[n], x), f"{n} is not the global tensor")
    # And back, as GPT-NeoX's load_checkpoint (through DeepSpeed's) reads it.
    back = os.path.join(tmp, "neox_back")
    run("export", root, back, "--format", "torch", "--layout", "deepspeed")
    with open(os.path.join(back, "latest")) as f:
        check(f.read().strip() == "global_step300", "latest")
    for t in range(2):
        rel = os.path.join("global_step300", f"mp_rank_{t:02d}_model_states.pt")
        want, got = torch.load(os.path.join(src, rel)), torch.load(os.path.join(back, rel))
        check(sorted(got["module"]) == sorted(want["module"]), f"{rel}: module keys")
        for k, v in want["module"].items():
            check(torch.equal(got["module"][k], v), f"{rel}: {k} differs")
        check(got["iteration"] == 300 and got["global_steps"] == 300 and got["skipped_steps"] == 2 and got["mp_world_size"] == 2,
              f"{rel}: counters")
        for k in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "make_vocab_size_divisible_by",
                  "padded_vocab_size", "tokenizer_type", "model_parallel_size"):  # what check_checkpoint_args compares
            check(got["args"].get(k) == want["args"][k], f"{rel}: args[{k!r}] {got['args'].get(k)!r}")
        check(got["random_rng_state"] == want["random_rng_state"], f"{rel}: random_rng_state")
        check(numpy.array_equal(got["np_rng_state"][1], want["np_rng_state"][1]) and got["np_rng_state"][2:] == want["np_rng_state"][2:],
              f"{rel}: np_rng_state")
        for k in ("torch_rng_state", "cuda_rng_state"):
            check(torch.equal(got[k], want[k]), f"{rel}: {k}")
        check(torch.equal(got["rng_tracker_states"]["model-parallel-rng"], want["rng_tracker_states"]["model-parallel-rng"]), f"{rel}: tracker")
        check(isinstance(got["sparse_tensor_module_names"], set) and [tuple(s) for s in got["param_shapes"][0].values()] ==
              [tuple(s) for s in [want["param_shapes"][0][k] for k in got["param_shapes"][0]]], f"{rel}: DeepSpeed's bookkeeping")
        check(same(got["checkpoint_validation_logits"], logits), f"{rel}: checkpoint_validation_logits")
    again = os.path.join(tmp, "from_neox_back")
    run("import", back, again)
    p = run("diff", root, again)  # validation logits included
    check(p.stdout.rstrip().endswith("EQUAL") and "__ckpt.validation_logits" in p.stdout, p.stdout)


@case
def neox_pipeline_with_zero_imports():
    # GPT-NeoX as DeepSpeed's PipelineEngine saves it with ZeRO 1/2: layer files per (layer, tp
    # rank), mp_rank_XX files (XX = stage * tp + tp rank) without the module, and each rank's
    # optimizer cut into dp partitions (deepspeed_writer.py says how).
    model = dsw.neox_pipeline_model(11)
    want = want_all = dsw.expected(model)
    for label, kw in (("zero2", {}), ("zero1-bf16", {"stage": 1, "bf16": True}), ("elastic", {"elastic": True})):
        src = os.path.join(tmp, f"neox_pipe_{label}")
        dsw.write(src, model, 2, 2, 2, 400, **kw)
        root = os.path.join(tmp, f"from_neox_pipe_{label}")
        p = run("import", src, root)
        check("tp=2 pp=2, 22 files" in p.stdout and "iteration 400" in p.stdout, p.stdout)
        check("param_slice_mappings (each partition's own slice bookkeeping" in p.stderr, p.stderr)
        j = json.loads(run("inspect", root, "--json").stdout)
        check(j["topology"]["tp"] == 2 and j["topology"]["pp"] == 2, j["topology"])
        check(j["config"].get("optimizer.zero_partitions") == 2 and j["config"].get("optimizer.clip_grad") == 1.0, j["config"])
        # Every weight and its fp32 master and moments, whole; and again resharded to tp=1 in
        # C++, as an engine resuming at another tp reads it.
        for r in (root, os.path.join(tmp, f"neox_pipe_{label}_tp1")):
            if r != root:
                run("reshard", root, r, "--tp", "1", "--pp", "1")
            out = os.path.join(tmp, "neox_pipe.pt")
            run("export", r, out, "--format", "torch")
            sd = torch.load(out)
            for k, v in want.items():
                check(k in sd and same(sd[k], v), f"{label} {r}: {k} is not the global tensor")
            os.remove(out)
    # And back, as DeepSpeed's PipelineEngine loads it: the same layer files (each layer's
    # state dict per tp rank), mp_rank_XX files with module None and the client state; the
    # optimizer is listed as not written (ZeRO partitions are not exported yet).
    root = os.path.join(tmp, "from_neox_pipe_zero2")
    src_tag = os.path.join(tmp, "neox_pipe_zero2", "global_step400")
    back = os.path.join(tmp, "neox_pipe_back")
    p = run("export", root, back, "--format", "torch", "--layout", "deepspeed")
    check("left out 68 optimizer tensors" in p.stderr and "no_load_optim" in p.stderr, p.stderr)
    with open(os.path.join(back, "latest")) as f:
        check(f.read().strip() == "global_step400", "latest")
    names = sorted(os.listdir(os.path.join(back, "global_step400")))
    want_names = sorted(n for n in os.listdir(src_tag) if not n.startswith("zero_pp_rank"))
    check(names == want_names, names)
    for n in want_names:
        want, got = torch.load(os.path.join(src_tag, n)), torch.load(os.path.join(back, "global_step400", n))
        if n.startswith("layer_"):
            check(list(got) == list(want) or sorted(got) == sorted(want), f"{n}: keys {list(got)}")
            for k, v in want.items():
                check(same(got[k], v), f"{n}: {k} differs")
            continue
        check(got["module"] is None and got["iteration"] == 400 and got["mp_world_size"] == 4 and got["dp_world_size"] == 2, f"{n}: counters")
        check(got["args"] == want["args"] and got["ds_config"] == want["ds_config"], f"{n}: args {got['args']} ds_config {got['ds_config']}")
        check(got["random_rng_state"] == want["random_rng_state"] and torch.equal(got["torch_rng_state"], want["torch_rng_state"]) and
              torch.equal(got["cuda_rng_state"], want["cuda_rng_state"]) and
              numpy.array_equal(got["np_rng_state"][1], want["np_rng_state"][1]), f"{n}: RNG states")
    again = os.path.join(tmp, "from_neox_pipe_back")
    run("import", back, again)
    out = os.path.join(tmp, "neox_pipe_again.pt")
    run("export", again, out, "--format", "torch")
    sd = torch.load(out)
    for k, v in want_all.items():
        if not k.startswith("optimizer."):
            check(k in sd and same(sd[k], v), f"import of the export: {k}")
    # Bad input: a partition missing, one too short for param_shapes, a layer file missing, a
    # layer whose dtype differs between tp ranks, ZeRO 3; nothing is written.
    for bad, needles in (("missing_partition", ["zero_pp_rank_1_mp_rank_03_optim_states.pt is missing"]),
                         ("short", ["zero_pp_rank_0_mp_rank_01_optim_states.pt", "fp32_param of group 0", "param_shapes needs"]),
                         ("missing_layer", ["layer_03-model_01-model_states.pt is missing"]),
                         ("layer_dtype", ["2.attention.dense.weight", "f16", "f32", "layer_02-model_01-model_states.pt"]),
                         ("zero3", ["ZeRO stage 3", "zero_to_fp32.py"])):
        src = os.path.join(tmp, f"neox_pipe_bad_{bad}")
        tag = dsw.write(src, model, 2, 2, 2, 10, bad=bad)
        if bad == "missing_partition":
            os.remove(os.path.join(tag, "zero_pp_rank_1_mp_rank_03_optim_states.pt"))
        if bad == "missing_layer":
            os.remove(os.path.join(tag, "layer_03-model_01-model_states.pt"))
        if bad == "zero3":
            shutil.copy(os.path.join(tag, "mp_rank_00_model_states.pt"), os.path.join(tag, "zero_pp_rank_0_mp_rank_00_model_states.pt"))
        root = os.path.join(tmp, f"from_neox_pipe_bad_{bad}")
        p = run("import", src, root, expect="nonzero")
        for n in needles:
            check(n in p.stderr, f"{bad}: message lacks {n!r}: {p.stderr}")
        check(not os.path.exists(os.path.join(root, "latest")), f"{bad}: something was committed")


def flip_tensor_byte(pt):
    """Flips a byte in the middle of the largest tensor storage of a torch.save archive (its
    CRC-32 stays as it was)."""
    with zipfile.ZipFile(pt) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    at = info.file_size // 2
    with open(pt, "r+b") as f:
        f.seek(info.header_offset + 26)
        n, m = struct.unpack("<HH", f.read(4))
        pos = info.header_offset + 30 + n + m + at
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))


@case
def damaged_tensor_bytes_are_caught_while_streaming():
    # Import reads tensors from the files as it saves them: a flipped byte in a Megatron rank's
    # tensor, or in a ZeRO partition's flat vector, fails the CRC-32 check; nothing is committed.
    model = megatron_global_model(8)
    src = os.path.join(tmp, "mlm_flipped")
    tag = write_megatron(src, model, 2, 1, 20)
    flip_tensor_byte(os.path.join(tag, "mp_rank_01", "model_optim_rng.pt"))
    root = os.path.join(tmp, "from_mlm_flipped")
    p = run("import", src, root, expect="nonzero")
    check("CRC-32 mismatch" in p.stderr and "mp_rank_01/model_optim_rng.pt" in p.stderr, p.stderr)
    check(not os.path.exists(os.path.join(root, "latest")), "a damaged source was committed")
    neox = os.path.join(tmp, "neox_flipped")
    tag = dsw.write(neox, dsw.neox_pipeline_model(12), 2, 2, 2, 30)
    flip_tensor_byte(os.path.join(tag, "zero_pp_rank_1_mp_rank_02_optim_states.pt"))
    root = os.path.join(tmp, "from_neox_flipped")
    p = run("import", neox, root, expect="nonzero")
    check("CRC-32 mismatch" in p.stderr and "zero_pp_rank_1_mp_rank_02_optim_states.pt" in p.stderr, p.stderr)
    check(not os.path.exists(os.path.join(root, "latest")), "a damaged partition was committed")


@case
def safetensors_export_is_aligned_and_keeps_metadata():
    # Mixed dtypes, names in an order that would misalign them: every tensor must start at a
    # multiple of its element size, as safetensors.torch.save_file lays them out; the source's
    # __metadata__ comes back on export.
    tensors = {"a_flag": torch.tensor([True, False, True]), "b_f64": torch.arange(3, dtype=torch.float64),
               "c_i16": torch.arange(5, dtype=torch.int16), "d_f32": torch.ones(7)}
    header, data = {"__metadata__": {"format": "pt", "source": "hub", "revision": "v1"}}, b""
    for k, t in tensors.items():
        raw = t.numpy().tobytes()
        header[k] = {"dtype": {torch.bool: "BOOL", torch.float64: "F64", torch.int16: "I16", torch.float32: "F32"}[t.dtype],
                     "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    src = os.path.join(tmp, "mixed.safetensors")
    with open(src, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    root = os.path.join(tmp, "from_mixed")
    run("import", src, root)
    out = os.path.join(tmp, "mixed_back.safetensors")
    run("export", root, out, "--format", "safetensors")
    with open(out, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        back = json.loads(f.read(n))
    check(back["__metadata__"].get("source") == "hub" and back["__metadata__"].get("revision") == "v1", back["__metadata__"])
    check((8 + n) % 8 == 0, f"data starts at {8 + n}")
    size = {"BOOL": 1, "F64": 8, "I16": 2, "F32": 4}
    for k, e in back.items():
        if k != "__metadata__":
            check(e["data_offsets"][0] % size[e["dtype"]] == 0, f"{k} ({e['dtype']}) starts at {e['data_offsets'][0]}")
    tensors_back, _ = read_safetensors(out)
    for k, t in tensors.items():
        check(torch.equal(tensors_back[k], t), f"{k} differs")


@case
def hostile_pickle_is_refused():
    marker = os.path.join(tmp, "pwned")

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    f = os.path.join(tmp, "evil.pt")
    with zipfile.ZipFile(f, "w") as z:
        z.writestr("evil/data.pkl", pickle.dumps({"w": Evil()}, protocol=2))
        z.writestr("evil/version", "3\n")
    p = run("import", f, os.path.join(tmp, "evil_root"), expect=2)
    check("system" in p.stderr and "evil.pt" in p.stderr, p.stderr)
    check(not os.path.exists(marker), "the pickle ran")
    check(not os.path.exists(os.path.join(tmp, "evil_root", "latest")), "something was committed")


@case
def index_json_rapidjson_cannot_finish_is_refused():
    # A number rapidjson starts and cannot finish (NaN with an exponent) made it throw its own
    # assertion, not a ckpt error naming the file (tools/fuzz.sh found it in metadata.json's reader).
    f = os.path.join(tmp, "nan", "pytorch_model.bin.index.json")
    os.makedirs(os.path.dirname(f))
    with open(f, "w") as out:
        out.write('{"weight_map": NaNE5}')
    p = run("import", f, os.path.join(tmp, "nan_root"), expect=2)
    check("pytorch_model.bin.index.json: not valid JSON" in p.stderr, p.stderr)
    check(not os.path.exists(os.path.join(tmp, "nan_root", "latest")), "something was committed")



@case
def new_dtypes_through_every_path():
    # u16, u32, u64 (numpy has them; torch 1.13 does not) and the two FP8 formats (every bit
    # pattern, NaNs included; compared as raw bytes): safetensors in, checkpoint, safetensors and
    # .pt out, .pt back in, reshard, diff; --dtype refuses FP8.
    arrays = {
        "u16": numpy.array([0, 1, 0x7FFF, 0x8000, 0xFFFF], dtype="<u2"),
        "u32": numpy.array([[0, 1, 2 ** 31], [2 ** 32 - 1, 7, 12345678]], dtype="<u4"),
        "u64": numpy.array([0, 1, 2 ** 53 + 1, 2 ** 63, 2 ** 64 - 1], dtype="<u8"),
        "wide.u32": numpy.arange(8 * 6, dtype="<u4").reshape(8, 6) * 0x01010101,
        "f32": numpy.linspace(-1, 1, 6, dtype="<f4"),
    }
    raw = {k: (a.tobytes(), {"<u2": "U16", "<u4": "U32", "<u8": "U64", "<f4": "F32"}[a.dtype.str], list(a.shape))
           for k, a in arrays.items()}
    raw["fp8.e4m3"] = (bytes(range(256)), "F8_E4M3", [16, 16])
    raw["fp8.e5m2"] = (bytes(range(255, -1, -1)), "F8_E5M2", [256])

    def write(path, tensors):
        header, data = {}, b""
        for k, (b, dt, shape) in tensors.items():
            header[k] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
            data += b
        h = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)

    def read(path):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        header.pop("__metadata__", None)
        return {k: (data[v["data_offsets"][0]:v["data_offsets"][1]], v["dtype"], v["shape"]) for k, v in header.items()}

    src = os.path.join(tmp, "wide.safetensors")
    write(src, raw)
    root = os.path.join(tmp, "wide_root")
    run("import", src, root)
    j = json.loads(run("inspect", root, "--json").stdout)
    types = {t["name"]: t["dtype"] for t in j["tensors"]}
    check(types == {"u16": "u16", "u32": "u32", "u64": "u64", "wide.u32": "u32", "f32": "f32", "fp8.e4m3": "f8_e4m3",
                    "fp8.e5m2": "f8_e5m2"}, types)
    run("verify", root)
    # safetensors out: the same bytes, dtypes and shapes; numpy reads the unsigned ones.
    out = os.path.join(tmp, "wide_back.safetensors")
    run("export", root, out, "--format", "safetensors")
    back = read(out)
    check(back == raw, sorted(k for k in raw if back.get(k) != raw[k]))
    for k, a in arrays.items():
        check(numpy.array_equal(numpy.frombuffer(back[k][0], dtype=a.dtype).reshape(a.shape), a), f"{k} differs in numpy")
    # .pt out as torch >= 2.1 writes these dtypes: _rebuild_tensor_v3 over untyped byte storages.
    # torch 1.13 cannot build them, so the pickle is read here with stand-ins for torch's
    # callables, which record what torch would be asked to build.
    pt = os.path.join(tmp, "wide.pt")
    run("export", root, pt, "--format", "torch")
    calls = []

    class Stub:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args):
            calls.append((self.name, args))
            return (self.name, args)

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            allowed = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor_v3"),
                       ("collections", "OrderedDict"), ("torch.storage", "UntypedStorage"), ("torch", "FloatStorage")}
            if (module, name) in allowed or (module == "torch" and name in ("uint16", "uint32", "uint64", "float8_e4m3fn",
                                                                            "float8_e5m2")):
                return collections.OrderedDict if name == "OrderedDict" else Stub(f"{module}.{name}")
            raise pickle.UnpicklingError(f"{module}.{name}")

        def persistent_load(self, pid):
            return pid

    with zipfile.ZipFile(pt) as z:
        prefix = z.namelist()[0].split("/")[0]
        sd = Recorder(__import__("io").BytesIO(z.read(f"{prefix}/data.pkl"))).load()
        want_dtype = {"u16": "uint16", "u32": "uint32", "u64": "uint64", "wide.u32": "uint32", "fp8.e4m3": "float8_e4m3fn",
                      "fp8.e5m2": "float8_e5m2"}
        check(sorted(sd) == sorted(raw), list(sd))
        for k, (b, dt, shape) in raw.items():
            fn, args = sd[k]
            storage = args[0]
            data = z.read(f"{prefix}/data/{storage[2]}")
            if k == "f32":
                check(fn == "torch._utils._rebuild_tensor_v2" and storage[1].name == "torch.FloatStorage", (k, fn))
                continue
            check(fn == "torch._utils._rebuild_tensor_v3" and len(args) == 7, (k, fn, len(args)))
            check(storage[0] == "storage" and storage[1].name == "torch.storage.UntypedStorage" and storage[4] == len(b),
                  (k, storage))
            check(args[6].name == f"torch.{want_dtype[k]}", (k, args[6].name))
            check(args[1] == 0 and list(args[2]) == shape and data == b, f"{k}: offset, shape or bytes differ")
    # ... and ckpt reads its own .pt back to the same checkpoint.
    again = os.path.join(tmp, "wide_again")
    run("import", pt, again)
    check(run("diff", root, again, "--no-config").stdout.rstrip().endswith("EQUAL"), "the .pt round trip differs")
    # A tp change: the u32 weight split by rows over 2 ranks, bit-exact after.
    split = os.path.join(tmp, "wide_tp2")
    run("reshard", root, split, "--tp", "2", "--split", "wide.u32=0")
    t = {x["name"]: x for x in json.loads(run("inspect", split, "--json").stdout)["tensors"]}
    check(t["wide.u32"]["shards"] == 2 and t["wide.u32"]["dtype"] == "u32", t["wide.u32"])
    check(run("diff", root, split, "--no-values").stdout.rstrip().endswith("EQUAL"), "reshard differs")
    # diff tells FP8 bit patterns apart (one NaN made a finite value) and u64s beyond 2^53.
    changed = dict(raw)
    e4 = bytearray(raw["fp8.e4m3"][0])
    e4[0x7F] = 0x7E  # NaN -> 448
    changed["fp8.e4m3"] = (bytes(e4), "F8_E4M3", [16, 16])
    u = arrays["u64"].copy()
    u[2] -= 1  # 2^53: the same double as 2^53 + 1, other bits
    changed["u64"] = (u.tobytes(), "U64", [5])
    other = os.path.join(tmp, "wide_changed.safetensors")
    write(other, changed)
    other_root = os.path.join(tmp, "wide_changed_root")
    run("import", other, other_root)
    p = run("diff", root, other_root, expect=1)
    rows = {l.split()[0]: l.split()[-1] for l in p.stdout.splitlines() if l and l.split()[0] in raw}
    check(rows.get("fp8.e4m3") == "DIFFERENT" and rows.get("u64") == "DIFFERENT" and rows.get("u16") == "equal", p.stdout)
    # --dtype converts floating tensors and refuses FP8 ones, naming the tensor and both dtypes.
    p = run("export", root, os.path.join(tmp, "wide_bf16.safetensors"), "--format", "safetensors", "--dtype", "bf16",
            expect=2)
    check("fp8.e4m3" in p.stderr and "f8_e4m3" in p.stderr and "bf16" in p.stderr, p.stderr)
    check(not os.path.exists(os.path.join(tmp, "wide_bf16.safetensors")), "a partial export was left")


shutil.rmtree(tmp)
h.finish()
