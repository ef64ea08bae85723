#!/usr/bin/env python3
"""Cross-checks ckpt's .pt reader and writer against real PyTorch.

Usage: check_torch.py PT_TOOL

(a) pt_tool writes .pt files; torch.load (and weights_only=True where torch allows) must read
    back exactly the values built here by the same formulas.
(b) torch.save writes .pt files (every dtype, strided views, shared storages, nn.Parameter,
    nested containers, a module state_dict, pickle protocol 4); pt_tool must read back exactly
    what PyTorch holds, element by element.
(c) hostile and unsupported files (os.system via __reduce__, eval, whole modules, complex
    tensors, huge ints, legacy format, a flipped data byte) must be refused with a clear
    ckpt::error, and nothing in them may run.

Values are compared through a canonical text dump that pt_tool prints the same way (see
`dump`). Exits 77 (skip) when this python cannot import torch.
"""

import argparse
import collections
import enum
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import tempfile
import zipfile

try:
    import numpy  # a dependency of Debian's python3-torch
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
    print(f"skipping: {sys.executable} cannot import torch and numpy ({e})")
    sys.exit(77)

TOOL = sys.argv[1]
failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what)


DT = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool",
}
ALL = list(DT)


def framework_classes():
    """Stand-ins for the classes DeepSpeed and Megatron-LM pickle into checkpoints, under their
    real module names, so that pickle writes the very globals those files hold."""
    import types

    made = {}

    def module(name):
        parts = name.split(".")
        for i in range(1, len(parts)):  # pickle imports the packages above it too
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        m = types.ModuleType(name)
        sys.modules[name] = m
        return m

    ls = module("deepspeed.runtime.fp16.loss_scaler")
    for cls_name in ("DynamicLossScaler", "LossScaler"):
        cls = type(cls_name, (), {"__module__": ls.__name__})
        setattr(ls, cls_name, cls)
        made[cls_name] = cls
    tf = module("deepspeed.utils.tensor_fragment")
    tf.fragment_address = type("fragment_address", (), {"__module__": tf.__name__})
    made["fragment_address"] = tf.fragment_address
    zc = module("deepspeed.runtime.zero.config")
    zc.ZeroStageEnum = enum.IntEnum("ZeroStageEnum", {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3},
                                    module=zc.__name__)
    made["ZeroStageEnum"] = zc.ZeroStageEnum
    me = module("megatron.core.enums")
    me.ModelType = enum.Enum("ModelType", {"encoder_or_decoder": 1, "encoder_and_decoder": 2}, module=me.__name__)
    made["ModelType"] = me.ModelType
    return made


FRAMEWORK_MODULES = {"deepspeed.runtime.fp16.loss_scaler", "deepspeed.utils.tensor_fragment"}
FW = framework_classes()


def dump(o):
    """Canonical text of a value; pt_tool's dump() prints the same for the same value. The
    classes of plain data ckpt reconstructs are named first, as pt_tool names them."""
    if isinstance(o, argparse.Namespace):
        return "@argparse.Namespace:" + dump(vars(o))
    if isinstance(o, enum.Enum):
        # Pickled by name (getattr(Enum, 'NAME') in Python 3.11; signal.SIGTERM as the module's
        # constant) or by value (Enum(value)).
        p = pickle.dumps(o, protocol=2)
        by_name = b"getattr" in p or f"{type(o).__module__}\n{o.name}\n".encode() in p
        return "@" + type(o).__module__ + "." + type(o).__qualname__ + ":" + dump(o.name if by_name else o.value)
    if type(o).__module__ in FRAMEWORK_MODULES:
        return "@" + type(o).__module__ + "." + type(o).__qualname__ + ":" + dump(vars(o))
    if isinstance(o, (set, frozenset)):
        return "@" + type(o).__name__ + ":" + dump(list(o))  # in iteration order, as pickled
    if isinstance(o, collections.defaultdict):
        return "@collections.defaultdict:" + dump(dict(o))
    if isinstance(o, torch.Size):
        return "@torch.Size:" + dump(tuple(o))
    if isinstance(o, torch.dtype):
        return "@torch.dtype:" + dump(str(o).split(".", 1)[1])
    if isinstance(o, numpy.ndarray):
        return ("@numpy.ndarray:(@numpy.dtype:" + dump(o.dtype.str) + "," + dump(tuple(o.shape)) + "," +
                dump(numpy.ascontiguousarray(o).tobytes()) + ")")
    if isinstance(o, numpy.generic):
        return dump(o.item())  # a numpy scalar reads as the Python number it holds
    if o is None:
        return "N"
    if isinstance(o, bool):
        return "T" if o else "F"
    if isinstance(o, int):
        return f"i{o}"
    if isinstance(o, float):
        return "f" + struct.pack(">d", o).hex()
    if isinstance(o, str):
        return "s" + o.encode("utf-8").hex()
    if isinstance(o, bytes):
        return "b" + o.hex()
    if isinstance(o, list):
        return "[" + ",".join(dump(x) for x in o) + "]"
    if isinstance(o, tuple):
        return "(" + ",".join(dump(x) for x in o) + ")"
    if isinstance(o, dict):
        return "{" + ",".join(dump(k) + ":" + dump(v) for k, v in o.items()) + "}"
    if isinstance(o, torch.Tensor):
        raw = o.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return "t" + DT[o.dtype] + ":" + "x".join(str(d) for d in o.shape) + ":" + raw.hex()
    raise TypeError(f"cannot dump {type(o)}")


def make(dt, shape, seed):
    """Element i of a tensor with seed s: the same formula as pt_tool's make()."""
    n = 1
    for d in shape:
        n *= d
    ks = [((i * 7 + seed * 13) % 251) - 125 for i in range(n)]
    if dt in (torch.float64, torch.float32):
        vals = [k / 3.0 for k in ks]
    elif dt in (torch.float16, torch.bfloat16):
        vals = [k * 0.5 for k in ks]
    elif dt == torch.int64:
        vals = [k * (1 << 46) for k in ks]
    elif dt == torch.int32:
        vals = [k * 16777259 for k in ks]
    elif dt == torch.int16:
        vals = [k * 257 for k in ks]
    elif dt == torch.int8:
        vals = ks
    elif dt == torch.uint8:
        vals = [k + 125 for k in ks]
    else:
        vals = [k % 3 == 0 for k in ks]
    return torch.tensor(vals, dtype=dt).reshape(shape)


def first_difference(a, b):
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at character {i}: ...{a[max(0, i - 40):i + 40]}... vs ...{b[max(0, i - 40):i + 40]}..."


def compare(label, got, want):
    check(got == want, f"{label}: values differ; " + first_difference(got, want) if got != want else label)


# ---- (a) ckpt writes, torch reads -------------------------------------------------------

def weights_only_tree():
    tensors = collections.OrderedDict()
    for seed, dt in enumerate(ALL, start=1):
        tensors[DT[dt]] = make(dt, (3, 5), seed)
    return {
        "tensors": tensors,
        "scalar": make(torch.float64, (), 40),
        "empty": make(torch.float32, (0,), 41),
        "empty2d": make(torch.int64, (2, 0), 42),
        "nested": {"a": [1, -2, "three", True, False, None], "b": {"c": [[], {}]}},
        "ints": [0, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, 4294967296,
                 1 << 62, -(1 << 63), (1 << 63) - 1],
        "unicode": "h\u00e9llo \u2603",
        "tuple": (1, (2, 3), (), "x", None),
    }


def every_tree():
    root = weights_only_tree()
    root["floats"] = [0.0, -0.0, 0.1, 1.5, -2.25e-300, 1e300, 3.0, float("inf")]
    root["bytes"] = [b"\x00\xff abc\x80", b""]
    root["keys"] = {1: "one", -5: "minus five", (1, "a"): "tuple key", None: "none key", 2.5: "float key"}
    root["long_list"] = [i * 3 for i in range(2500)]
    root["many_strings"] = {f"key{i}": [i, f"v{i}"] for i in range(300)}
    base = make(torch.float32, (4, 6), 50)
    root["views"] = {"base": base, "t": base.t(), "slice": base[1:3, 2:5], "grad": base}
    root["inline"] = make(torch.bfloat16, (2, 2), 51)
    return root


def megatron_tree():
    layers, hidden, vocab = 2, 8, 16
    seed = 100
    params = []
    for l in range(layers):
        p = f"layers.{l}."
        params += [(p + "input_layernorm.weight", (hidden,)),
                   (p + "attention.query_key_value.weight", (3 * hidden, hidden)),
                   (p + "attention.dense.weight", (hidden, hidden)),
                   (p + "mlp.dense_h_to_4h.weight", (4 * hidden, hidden)),
                   (p + "mlp.dense_4h_to_h.weight", (hidden, 4 * hidden))]
    encoder = collections.OrderedDict()
    for name, shape in params:
        encoder[name] = make(torch.bfloat16, shape, seed)
        seed += 1
    encoder["final_layernorm.weight"] = make(torch.bfloat16, (hidden,), seed)
    seed += 1
    model = collections.OrderedDict(language_model={
        "embedding": {"word_embeddings": collections.OrderedDict(weight=make(torch.bfloat16, (vocab, hidden), seed))},
        "encoder": encoder})
    state = {i: {"exp_avg": make(torch.float32, shape, 200 + i),
                 "exp_avg_sq": make(torch.float32, shape, 300 + i),
                 "step": 1000} for i, (_, shape) in enumerate(params)}
    fp32 = [make(torch.float32, shape, 400 + i) for i, (_, shape) in enumerate(params)]
    optimizer = {
        "optimizer": {"state": state,
                      "param_groups": [{"lr": 0.0003, "betas": (0.9, 0.95), "eps": 1e-08, "weight_decay": 0.01,
                                        "amsgrad": False, "params": list(range(len(params)))}]},
        "fp32_from_fp16_params": [fp32],
    }
    mt = tuple((i * 2654435761) % 4294967296 for i in range(625))
    rng = [{"random_rng_state": (3, mt, None),
            "torch_rng_state": make(torch.uint8, (816,), 500),
            "cuda_rng_tracker": {"model-parallel-rng": make(torch.uint8, (816,), 501)}}]
    return {
        "iteration": 1000,
        "args": {"num_layers": layers, "hidden_size": hidden, "lr": 0.0003, "fp16": False, "bf16": True,
                 "tokenizer_type": "GPT2BPETokenizer", "rotary_pct": 0.25, "vocab_file": None, "seq_length": 16},
        "checkpoint_version": 3.0,
        "model": model,
        "optimizer": optimizer,
        "rng_state": rng,
    }


def check_zip_layout(path):
    """Every entry's data starts at a multiple of 64 and its CRC-32 is right."""
    with zipfile.ZipFile(path) as z:
        check(z.testzip() is None, f"{path}: zipfile reports a bad CRC")
        with open(path, "rb") as f:
            for info in z.infolist():
                f.seek(info.header_offset)
                local = f.read(30)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                data = info.header_offset + 30 + name_len + extra_len
                check(data % 64 == 0, f"{path}: {info.filename} data at offset {data} is not 64-byte aligned")
                check(info.compress_type == zipfile.ZIP_STORED, f"{path}: {info.filename} is compressed")
        names = z.namelist()
        return names


def part_a(tmp):
    out = os.path.join(tmp, "ckpt_written")
    os.makedirs(out)
    r = subprocess.run([TOOL, "write", out], capture_output=True, text=True)
    check(r.returncode == 0, f"pt_tool write failed: {r.stderr}")
    if r.returncode != 0:
        return
    torch2 = int(torch.__version__.split(".")[0]) >= 2
    for name, expected, top, has_floats in [("weights_only.pt", weights_only_tree(), "archive", False),
                                            ("zip64.pt", weights_only_tree(), "archive", False),
                                            ("every.pt", every_tree(), "archive", True),
                                            ("model_optim_rng.pt", megatron_tree(), "model_optim_rng", True)]:
        path = os.path.join(out, name)
        names = check_zip_layout(path)
        for rec in ("data.pkl", "version", "byteorder"):
            check(f"{top}/{rec}" in names, f"{name}: no {top}/{rec} record")
        loaded = torch.load(path)
        compare(f"(a) torch.load {name}", dump(loaded), dump(expected))
        # torch 1.13's weights_only unpickler has no BINFLOAT opcode and no _codecs.encode, so
        # it refuses any pickle holding a float or bytes, whoever wrote it.
        if torch2 or not has_floats:
            safe = torch.load(path, weights_only=True)
            compare(f"(a) torch.load(weights_only=True) {name}", dump(safe), dump(expected))
        if name == "every.pt":
            v = loaded["views"]
            ptr = lambda t: t.storage().data_ptr()  # noqa: E731
            check(ptr(v["t"]) == ptr(v["base"]) and ptr(v["slice"]) == ptr(v["base"]),
                  "(a) views of one storage came back as separate storages")
            check(v["slice"].storage_offset() == 8 and v["t"].stride() == (1, 6), "(a) view layout lost")
            check(v["grad"].requires_grad and not v["base"].requires_grad, "(a) requires_grad lost")
            check(type(loaded["tensors"]) is collections.OrderedDict, "(a) OrderedDict came back as a plain dict")
        if name == "model_optim_rng.pt":
            check(type(loaded["model"]) is collections.OrderedDict, "(a) model is not an OrderedDict")
            check(loaded["model"]["language_model"]["encoder"]["layers.0.input_layernorm.weight"].dtype == torch.bfloat16,
                  "(a) bf16 weight changed dtype")


# ---- (b) torch writes, ckpt reads -------------------------------------------------------

def read_with_tool(path):
    r = subprocess.run([TOOL, "read", path], capture_output=True, text=True)
    check(r.returncode == 0, f"(b) pt_tool read {os.path.basename(path)} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def part_b(tmp):
    torch.manual_seed(0)
    base = make(torch.float32, (4, 6), 60)
    views = {
        "base": base,
        "t": base.t(),                  # transposed: strides (1, 6)
        "slice": base[1:3, 2:5],        # storage offset 8, strides (6, 1)
        "step": base[:, ::2],           # stride 2 in the last dimension
        "col": base[:, 1],              # offset 1, stride 6
        "flat": base.view(-1)[5:10],    # another view of the same storage
        "expand": torch.arange(3.0).expand(4, 3),  # stride 0
        "param": torch.nn.Parameter(make(torch.float32, (3,), 61)),
        "bf16_t": make(torch.bfloat16, (3, 5), 62).t(),
        "f16_slice": make(torch.float16, (6,), 63)[2:],
    }
    dtypes = {DT[dt]: make(dt, (2, 3), seed) for seed, dt in enumerate(ALL, start=70)}
    dtypes["scalar"] = make(torch.float64, (), 80)
    dtypes["scalar_i64"] = torch.tensor(7)
    dtypes["empty"] = torch.empty(0)
    dtypes["empty2d"] = torch.empty(3, 0, dtype=torch.int16)
    containers = {
        "list": [1, 2.5, "x", None, True, (1, 2, (3,))],
        "dict": {1: "a", (1, 2): "b", "n": {"deep": [[[]]]}},
        "bytes": [b"\x00\xffabc", b""],
        "big": 2 ** 62, "neg": -(2 ** 63),
        "floats": [0.1, -0.0, float("inf"), 1e-310],
        "od": collections.OrderedDict(b=1, a=2),
        "unicode": "\u00fcber \U0001f600",
        "long": list(range(1500)),
    }
    # What GPT-NeoX, DeepSpeed and Megatron-LM put beside the tensors (their save code, read):
    # args as an argparse.Namespace (with a torch dtype in it), DeepSpeed's set of sparse
    # module names, ZeRO's param_shapes (OrderedDicts of torch.Size), Python's and numpy's RNG
    # states, numpy scalars in logged values, and a defaultdict.
    scaler = FW["DynamicLossScaler"]()
    scaler.__dict__.update(cur_scale=65536.0, cur_iter=3, last_overflow_iter=-1, scale_factor=2.0, scale_window=1000,
                           min_scale=1, delayed_shift=1, cur_hysteresis=1, consecutive_hysteresis=False, raise_error_at_min_scale=True,
                           dynamic=True, dtype=torch.float16)
    fragment = FW["fragment_address"]()
    fragment.__dict__.update(numel=24, start=8)
    random.seed(7)
    numpy.random.seed(11)
    numpy.random.standard_normal()  # a cached gaussian in the state
    frameworks = {
        "args": argparse.Namespace(hidden_size=1024, lr=3e-4, fp16=True, tokenizer_type="GPT2BPETokenizer", vocab_file=None,
                                   layers=[1, 2], params_dtype=torch.float16, seq_length=2048),
        "sparse_tensor_module_names": set(),
        "names": {"transformer.layers.0", "word_embeddings", "final_norm"},
        "frozen": frozenset({3, 1, 2}),
        "dd": collections.defaultdict(list, {"x": [1], "y": []}),
        "param_shapes": [collections.OrderedDict([("w", torch.Size([4, 6])), ("b", torch.Size([6])), ("s", torch.Size([]))])],
        "random_rng_state": random.getstate(),
        "np_rng_state": numpy.random.get_state(),
        "np_scalars": [numpy.float32(1.5), numpy.float64(-2.25), numpy.int64(-7), numpy.uint8(200), numpy.bool_(True),
                       numpy.int32(5), numpy.float16(0.5), numpy.uint64(2 ** 63 - 1)],
        "np_arrays": [numpy.arange(6, dtype=numpy.int16).reshape(2, 3), numpy.zeros((0,), dtype=numpy.float32),
                      numpy.array([True, False]), numpy.arange(4, dtype=">u4"), numpy.arange(6.0).reshape(3, 2).T],
        "torch_rng_state": torch.get_rng_state(),
        "dtypes": [torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.uint8, torch.bool],
        "iteration": 200,
        # DeepSpeed's ZeRO optimizer file: the loss scaler object, the stage enum, fragment
        # addresses; Megatron's model type enum in its args
        "loss_scaler": scaler,
        "zero_stage": FW["ZeroStageEnum"].gradients,
        "param_slice_mappings": [collections.OrderedDict([("w", fragment)])],
        "model_type": FW["ModelType"].encoder_or_decoder,
        "exit_signal": signal.SIGTERM,
    }
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.BatchNorm1d(3))
    cases = {
        "views.pt": (views, 2),
        "dtypes.pt": (dtypes, 2),
        "containers.pt": (containers, 2),
        "module.pt": (net.state_dict(), 2),
        "module_bf16.pt": (net.to(torch.bfloat16).state_dict(), 2),
        "proto4.pt": ({"views": views, "containers": containers}, 4),
        "frameworks.pt": (frameworks, 2),
        "frameworks_proto4.pt": (frameworks, 4),
    }
    for name, (obj, proto) in cases.items():
        path = os.path.join(tmp, name)
        torch.save(obj, path, pickle_protocol=proto)
        compare(f"(b) pt_tool read {name}", read_with_tool(path), dump(obj))


# ---- (c) hostile and unsupported files ----------------------------------------------------

class Plain:
    """An instance of a class of the writer's own: pickled by NEWOBJ and BUILD, refused by name."""

    def __init__(self):
        self.x = 1


class Reduce:
    """Pickles as a call of `fn(*args)`: what a malicious checkpoint would contain."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def refused(path, *needles):
    r = subprocess.run([TOOL, "read", path], capture_output=True, text=True)
    name = os.path.basename(path)
    check(r.returncode == 1, f"(c) {name}: expected exit code 1 (refused), got {r.returncode}; {r.stderr.strip()}")
    for n in needles:
        check(n in r.stderr, f"(c) {name}: message lacks {n!r}: {r.stderr.strip()}")


def part_c(tmp):
    # Protocol 2 pickles name modules as Python 2 did (fix_imports): builtins is __builtin__,
    # subprocess is commands; the messages quote the names as the file has them.
    marker = os.path.join(tmp, "pwned")
    cases = [
        ("os_system.pt", {"x": Reduce(os.system, (f"touch {marker}",))}, ["'posix.system' is not allowed"]),
        ("eval.pt", {"x": Reduce(eval, (f"open({marker!r}, 'w')",))}, ["'__builtin__.eval' is not allowed"]),
        # getattr is only read on the frameworks' enums; here the import is refused first
        ("getattr.pt", [Reduce(getattr, (Reduce(__import__, ("os",)), "system"))], ["'__builtin__.__import__' is not allowed"]),
        ("getattr_class.pt", [Reduce(getattr, (argparse.Namespace, "__init__"))], ["only allowed on the frameworks' enums"]),
        ("popen.pt", Reduce(subprocess.Popen, (["touch", marker],)), ["'commands.Popen' is not allowed"]),
        ("whole_module.pt", torch.nn.Linear(2, 2), ["'torch.nn.modules.linear.Linear' is not allowed"]),
        ("complex.pt", {"w": {"c": torch.zeros(2, dtype=torch.complex64)}},
         ["['w']['c']", "ComplexFloatStorage", "does not support"]),
        ("bigint.pt", {"big": 2 ** 70}, ["does not fit in 64 bits"]),
        # The classes of plain data are data only: what they hold is checked like the rest.
        ("namespace.pt", {"args": argparse.Namespace(x=Reduce(os.system, (f"touch {marker}",)))}, ["'posix.system' is not allowed"]),
        ("set_of_calls.pt", {"s": {Reduce(eval, ("1",))}}, ["'__builtin__.eval' is not allowed"]),
        ("object_array.pt", {"a": numpy.array([1, "x"], dtype=object)}, ["numpy dtype 'O8' is not a numeric dtype"]),
        ("structured.pt", {"a": numpy.zeros(2, dtype=[("x", "<i4"), ("y", "<f4")])}, ["is not a numeric dtype"]),
        ("defaultdict_factory.pt", {"d": collections.defaultdict(os.getcwd)}, ["'posix.getcwd' is not allowed"]),
        ("instance.pt", {"o": Plain()}, ["'__main__.Plain' is not allowed"]),
        ("random_state.pt", {"r": numpy.random.RandomState(0)}, ["is not allowed"]),
    ]
    for name, obj, needles in cases:
        path = os.path.join(tmp, name)
        torch.save(obj, path)
        refused(path, *needles)

    # A pickle calling os.system, placed by hand in a zip laid out like torch's.
    path = os.path.join(tmp, "handmade.pt")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(Reduce(os.system, (f"touch {marker}",)), protocol=2))
        z.writestr("archive/version", "3\n")
    refused(path, "archive/data.pkl", "'posix.system' is not allowed")

    path = os.path.join(tmp, "legacy.pt")
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    refused(path, "legacy", "_use_new_zipfile_serialization=False")

    # One flipped byte in a tensor's data must fail the CRC-32 check.
    path = os.path.join(tmp, "flipped.pt")
    torch.save({"w": torch.arange(16.0)}, path)
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + 5
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    refused(path, "CRC-32 mismatch", info.filename)

    path = os.path.join(tmp, "text.pt")
    with open(path, "w") as f:
        f.write("not a checkpoint\n")
    refused(path, "not a PyTorch .pt file")

    check(not os.path.exists(marker), "(c) a hostile pickle ran code: the marker file exists")


with tempfile.TemporaryDirectory() as tmp:
    part_a(tmp)
    part_b(tmp)
    part_c(tmp)

if failures:
    print(f"{len(failures)} of {checks} checks failed")
    sys.exit(1)
print(f"all {checks} torch interop checks passed")
