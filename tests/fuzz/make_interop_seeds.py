#!/usr/bin/python3
"""Writes the seed corpus of the interop fuzz targets (pickle, pt, safetensors) with the real
torch.save and a safetensors writer that follows the published format. Run from the
repository root with Debian's python (it has torch):

    /usr/bin/python3 tests/fuzz/make_interop_seeds.py tests/fuzz/corpus
"""
import argparse
import collections
import io
import json
import os
import random
import struct
import sys
import zipfile

import numpy
import torch

out = sys.argv[1]
for d in ("pickle", "pt", "safetensors"):
    os.makedirs(os.path.join(out, d), exist_ok=True)

base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
states = {
    "state_dict": collections.OrderedDict([("w", base), ("b", torch.zeros(4, dtype=torch.bfloat16))]),
    "views": {"t": base.t(), "row": base[1], "step": base[:, ::2], "half": torch.ones(2, dtype=torch.float16)},
    "megatron": {"iteration": 7, "args": {"lr": 0.5, "name": "x", "flag": True}, "model": {"w": base},
                 "optimizer": {"state": {0: {"exp_avg": torch.zeros(3), "step": 1}}, "param_groups": [{"lr": 0.5}]},
                 "rng": [torch.ByteTensor([1, 2, 3])], "none": None},
    "dtypes": {str(t): torch.zeros(2, dtype=t) for t in (torch.float64, torch.int64, torch.int32, torch.int16,
                                                         torch.int8, torch.uint8, torch.bool)},
    "param": {"p": torch.nn.Parameter(torch.ones(2, 2))},
    # The plain data GPT-NeoX, DeepSpeed and Megatron-LM save beside the tensors (issue 21).
    "frameworks": {"args": argparse.Namespace(lr=0.5, params_dtype=torch.float16, layers=[1, 2]),
                   "sparse_tensor_module_names": {"emb"}, "frozen": frozenset({1}),
                   "dd": collections.defaultdict(list, {"x": [1]}),
                   "param_shapes": [collections.OrderedDict([("w", torch.Size([3, 4]))])],
                   "random_rng_state": random.getstate(), "np_rng_state": numpy.random.RandomState(0).get_state(),
                   "np": [numpy.float32(1.5), numpy.int64(-3), numpy.bool_(True), numpy.arange(4, dtype=numpy.int16),
                          numpy.arange(6.0).reshape(3, 2).T]},
}
for name, obj in states.items():
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    open(os.path.join(out, "pt", name + ".pt"), "wb").write(data)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        open(os.path.join(out, "pickle", name + ".pkl"), "wb").write(z.read(pkl))

NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
         torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for k, t in tensors.items():
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[k] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


seeds = {
    "small": safetensors({"w": base, "b": torch.zeros(4, dtype=torch.bfloat16)}, {"format": "pt"}),
    "every_dtype": safetensors({NAMES[t]: torch.zeros(3, dtype=t) for t in NAMES}),
    "scalar_and_empty": safetensors({"s": torch.tensor(1.5), "e": torch.zeros(0, 3)}),
}
for name, b in seeds.items():
    open(os.path.join(out, "safetensors", name + ".safetensors"), "wb").write(b)
