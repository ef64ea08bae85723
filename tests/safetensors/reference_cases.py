#!/usr/bin/python3
"""Replays the reference implementation's own test cases against ckpt's safetensors support.

The reference is huggingface/safetensors: the Rust crate's tests (safetensors/src/tensor.rs),
the Python bindings' tests (bindings/python/tests/test_simple.py, test_pt_comparison.py) and
the attacks/ scripts, plus edge cases read from the crate's validation code (Metadata::validate,
read_metadata, the serde types). Nothing of theirs is copied: each case is rebuilt here with
struct and json from what the test does, and states the reference's verdict, accept (with these
tensors and metadata) or reject. Every case then runs through

  - the library: `st_tool dump FILE` (safetensors_file), compared tensor by tensor, byte by byte;
  - the tool: `ckpt import FILE ROOT`, then `ckpt export ROOT OUT --format safetensors`, whose
    file is read back here and compared with the case's tensors;
  - for the reference's serialization tests, the writer: `st_tool copy FILE OUT` must produce
    the reference writer's bytes exactly.

A case where ckpt refuses what the reference accepts is a disagreement unless it is one of the
deliberate stricter rules of STRICTER, each of which docs/cli.md must list (by its id, in
backticks) with its reason. The script prints one line per case that is not plain agreement,
then `reference cases: N agree, M stricter-by-design (listed), K disagree`, and fails on any
disagreement, on a refusal that is not a clean ckpt::error naming the file, or on a stricter
rule that docs/cli.md does not list.

    reference_cases.py ST_TOOL CKPT_TOOL CLI_DOC        (exit 77, skipped, without numpy)
"""

import json
import os
import pickle
import random
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

try:
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipping: cannot import numpy ({e})")
    sys.exit(77)

ST_TOOL, CKPT, CLI_DOC = sys.argv[1:4]

# The reference's Dtype enum, in its order (by alignment), with each element's size in bits.
REF_DTYPES = [("BOOL", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("U8", 8), ("I8", 8), ("F8_E5M2", 8),
              ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8), ("I16", 16), ("U16", 16),
              ("F16", 16), ("BF16", 16), ("I32", 32), ("U32", 32), ("F32", 32), ("C64", 64), ("F64", 64),
              ("I64", 64), ("U64", 64)]
RANK = {n: i for i, (n, _) in enumerate(REF_DTYPES)}
BITS = dict(REF_DTYPES)
CKPT_DTYPES = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64",
               "U64"}

# ckpt's deliberate departures from the reference: id -> what ckpt does and why. docs/cli.md
# (the safetensors import section) must list each id in backticks.
STRICTER = {
    "unrepresentable-dtype": "F4, F6_*, F8_E8M0, the FNUZ FP8 formats and C64 have no ckpt dtype: refused as a "
                             "mismatch naming the tensor, rather than carried as opaque bytes",
    "duplicate-key": "a tensor name or metadata key given twice: the reference keeps the last, other readers the "
                     "first; ckpt refuses an ambiguous file",
    "unsafe-name": "ckpt import only: a tensor name ckpt's names forbid (empty, '/', '..', control characters, "
                   "an empty segment, the reserved __ckpt prefix) becomes no checkpoint path",
    "no-tensors": "ckpt import only: a file without tensors gives no checkpoint (the library reads it); a model "
                  "of nothing is the wrong file far more often than an intent",
}

tmp = tempfile.mkdtemp(prefix="ckpt-st-reference-")
counter = [0]


def fresh(suffix=""):
    counter[0] += 1
    return os.path.join(tmp, f"c{counter[0]:04d}{suffix}")


# ---- building files -------------------------------------------------------------------------


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return (n * BITS[dtype] + 7) // 8


def pattern(n, seed, dtype="U8"):
    """n bytes that depend on the seed (0 and 1 only for BOOL, which the reference writes so)."""
    r = random.Random(seed)
    if dtype == "BOOL":
        return bytes(r.randint(0, 1) for _ in range(n))
    return bytes(r.randrange(256) for _ in range(n))


def frame(header, data=b""):
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def ref_serialize(tensors, metadata=None):
    """The reference writer's bytes (serialize): tensors sorted by dtype alignment, descending,
    then by name; compact JSON (serde_json) with __metadata__ first; padded with spaces to 8."""
    order = sorted(tensors, key=lambda n: (-RANK[tensors[n][0]], n.encode()))
    head, data = "{", b""
    if metadata is not None:
        head += '"__metadata__":' + compact(metadata)
    for name in order:
        dtype, shape, raw = tensors[name]
        if len(head) > 1:
            head += ","
        head += compact(name) + ":" + compact({"dtype": dtype, "shape": shape,
                                                "data_offsets": [len(data), len(data) + len(raw)]})
        data += raw
    head += "}"
    head = head.encode()
    head += b" " * (-len(head) % 8)
    return frame(head, data)


def in_order(tensors, metadata=None, names=None):
    """A file holding `tensors` in the given order (default: as listed), unpadded."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in names or list(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return frame(compact(header), data)


def read_file(path):
    """This script's own reader: (tensors, metadata) after checking the buffer is tiled."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    out, spans = {}, []
    for k, v in header.items():
        b, e = v["data_offsets"]
        spans.append((b, e))
        out[k] = (v["dtype"], v["shape"], data[b:e])
    cursor = 0
    for b, e in sorted(spans):
        assert b == cursor, f"{path}: hole or overlap at {cursor}"
        cursor = e
    assert cursor == len(data), f"{path}: {len(data) - cursor} stray bytes"
    return out, meta


class Accept:
    def __init__(self, tensors, metadata=None):
        self.tensors, self.metadata = tensors, metadata or {}


class Reject:
    def __init__(self, why):
        self.why = why


cases = []


def case(source, name, data, verdict, stricter=None, writer=None, import_stricter=None):
    """data: the file's bytes, or a function writing the file at the path it is given, or None
    for a path that does not exist. stricter: a STRICTER id for both paths; import_stricter: for
    `ckpt import` only. writer: the reference writer's bytes for the file's tensors."""
    if import_stricter is None and isinstance(verdict, Accept) and not verdict.tensors:
        import_stricter = "no-tensors"
    cases.append(dict(source=source, name=name, data=data, verdict=verdict, stricter=stricter, writer=writer,
                      import_stricter=stricter or import_stricter))


RS = "tensor.rs"          # the crate's #[cfg(test)] mod tests
RSV = "tensor.rs (code)"  # what the crate's validation code does, beyond its tests
PY = "test_simple.py"
PT = "test_pt_comparison.py"
ATT = "attacks/"

f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
i32_zero = lambda n: b"\0" * (4 * n)
T_I32 = '{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}'

# ---- safetensors/src/tensor.rs: the tests ---------------------------------------------------

t = {"attn.0": ("F32", [1, 2, 3], f32(0, 1, 2, 3, 4, 5))}
case(RS, "test_serialization", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t4 = {"attn.0": ("F4", [1, 2], b"\0")}
case(RS, "test_serialization_fp4", ref_serialize(t4), Accept(t4), stricter="unrepresentable-dtype")
case(RS, "test_serialization_fp4_misaligned",
     frame('{"attn.0":{"dtype":"F4","shape":[1,3],"data_offsets":[0,2]}}', b"\0\1"), Reject("MisalignedSlice"))
case(RS, "test_serialization_fp4_invalid",
     frame('{"attn.0":{"dtype":"F4","shape":[1,2],"data_offsets":[0,2]}}', b"\0\1"), Reject("TensorInvalidInfo"))
case(RS, "test_empty", ref_serialize({}), Accept({}), writer=ref_serialize({}))
case(RS, "test_empty (with metadata)", ref_serialize({}, {"framework": "pt"}), Accept({}, {"framework": "pt"}),
     writer=ref_serialize({}, {"framework": "pt"}))
t = {"attn0": ("F32", [1, 1, 2, 3], f32(0, 1, 2, 3, 4, 5))}
case(RS, "test_serialization_forced_alignement", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"attn.0": ("F32", [1, 2, 3], f32(0, 1, 2, 3, 4, 5))}
case(RS, "test_slicing", ref_serialize(t), Accept(t))


def gpt2_like(n_heads, scale):
    """The test's GPT-2 layout (names, ranks, shape ratios), every dimension divided by
    `scale` so that the file stays small; bytes are a pattern where the test has zeros."""
    d = lambda x: max(1, x // scale)
    desc = [("wte", [d(50257), d(768)]), ("wpe", [d(1024), d(768)])]
    for i in range(n_heads):
        desc += [(f"h.{i}.ln_1.weight", [d(768)]), (f"h.{i}.ln_1.bias", [d(768)]),
                 (f"h.{i}.attn.bias", [1, 1, d(1024), d(1024)]), (f"h.{i}.attn.c_attn.weight", [d(768), d(2304)]),
                 (f"h.{i}.attn.c_attn.bias", [d(2304)]), (f"h.{i}.attn.c_proj.weight", [d(768), d(768)]),
                 (f"h.{i}.attn.c_proj.bias", [d(768)]), (f"h.{i}.ln_2.weight", [d(768)]),
                 (f"h.{i}.ln_2.bias", [d(768)]), (f"h.{i}.mlp.c_fc.weight", [d(768), d(3072)]),
                 (f"h.{i}.mlp.c_fc.bias", [d(3072)]), (f"h.{i}.mlp.c_proj.weight", [d(3072), d(768)]),
                 (f"h.{i}.mlp.c_proj.bias", [d(768)])]
    desc += [("ln_f.weight", [d(768)]), ("ln_f.bias", [d(768)])]
    return {name: ("F32", shape, pattern(nbytes("F32", shape), k)) for k, (name, shape) in enumerate(desc)}


t = gpt2_like(12, 32)
case(RS, "test_gpt2 (dimensions / 32)", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = gpt2_like(6, 32)
case(RS, "test_gpt2_tiny (dimensions / 32)", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"w": ("F32", [3], f32(1, 2, 3))}
case(RS, "test_serialize_to_file_same_path_with_active_mmap", ref_serialize(t), Accept(t), writer="same-path")
t = {"test": ("I32", [], i32_zero(1))}
case(RS, "test_empty_shapes_allowed", frame('{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', i32_zero(1)),
     Accept(t))
t = {"test": ("I32", [2, 2], i32_zero(4))}
case(RS, "test_deserialization", frame(T_I32, i32_zero(4)), Accept(t))
case(RS, "test_lifetimes", frame(T_I32, i32_zero(4)), Accept(t))
attack = {f"weight_{i}": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]} for i in range(10)}
case(RS, "test_json_attack", frame(compact(attack), b"\0" * 16), Reject("InvalidOffset"))
case(RS, "test_metadata_incomplete_buffer (extra bytes)",
     frame(T_I32, i32_zero(4) + b"extra_bogus_data_for_polyglot_file"), Reject("MetadataIncompleteBuffer"))
case(RS, "test_metadata_incomplete_buffer (2 bytes missing)", frame(T_I32, b"\0" * 14),
     Reject("MetadataIncompleteBuffer"))
case(RS, "test_header_too_large", b"<\0\0\0\0\xff\xff\xff" + T_I32.encode() + i32_zero(4), Reject("HeaderTooLarge"))
case(RS, "test_header_too_small", b"", Reject("HeaderTooSmall"))
case(RS, "test_invalid_header_length", b"<\0\0\0\0\0\0\0", Reject("InvalidHeaderLength"))
case(RS, "test_invalid_header_non_utf8", b"\x01\0\0\0\0\0\0\0\xff", Reject("InvalidHeader"))
case(RS, "test_invalid_header_not_json", b"\x01\0\0\0\0\0\0\0{", Reject("InvalidHeaderDeserialization"))
case(RS, "test_whitespace_padded_header", b"\x06\0\0\0\0\0\0\0{}\x0d\x20\x09\x0a", Accept({}))
case(RS, "test_whitespace_leading_padded_header", b"\x06\0\0\0\0\0\0\0\x09\x0a{}\x0d\x20", Accept({}))
case(RS, "test_zero_sized_tensor", frame('{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}'),
     Accept({"test": ("I32", [2, 0], b"")}))
case(RS, "test_invalid_info", frame('{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}', i32_zero(1)),
     Reject("TensorInvalidInfo"))
case(RS, "test_validation_overflow (shape)",
     frame('{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}', i32_zero(4)),
     Reject("ValidationOverflow"))
case(RS, "test_validation_overflow (bytes)",
     frame('{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}', i32_zero(4)),
     Reject("ValidationOverflow"))

# proptest test_roundtrip: 1..8 tensors of 1..8 dimensions of 1..7, buffer bytes 0, 1, 2, ...;
# serialized again it must give the same tensors, each aligned. Drawn over the dtypes ckpt has
# (the strategy's F4, F6_* and C64 are each a case of their own above and below).
STRATEGY = ["BOOL", "F8_E5M2", "F8_E4M3", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32",
            "F64"]
rng = random.Random(20240521)
for k in range(20):
    t, start = {}, 0
    for i in range(rng.randrange(1, 8)):
        dtype = rng.choice(STRATEGY)
        shape = [rng.randrange(1, 8) for _ in range(rng.randrange(1, 8))]
        n = nbytes(dtype, shape)
        raw = bytes((start + j) & 0xFF for j in range(n))
        if dtype == "BOOL":
            raw = bytes(b & 1 for b in raw)
        t[f"t.{i}"] = (dtype, shape, raw)
        start += n
    case(RS, f"test_roundtrip (proptest draw {k})", in_order(t), Accept(t), writer=ref_serialize(t))

# ---- the crate's validation code, beyond its tests ------------------------------------------

case(RSV, "shape overflow before a zero dimension",
     frame('{"z":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}'), Reject("ValidationOverflow"))
t = {"z": ("U8", [4611686018427387904, 0], b"")}
case(RSV, "huge dimension times zero", frame('{"z":{"dtype":"U8","shape":[4611686018427387904,0],"data_offsets":[0,0]}}'),
     Accept(t))
t = {"a": ("F32", [2], f32(1, 2)), "z": ("U8", [0], b"")}
case(RSV, "empty tensor at the end of the buffer",
     frame('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}}',
           f32(1, 2)), Accept(t))
case(RSV, "empty tensor at offset 0, before another",
     frame('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}',
           f32(1, 2)), Accept(t))
case(RSV, "empty tensor inside another's bytes",
     frame('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}',
           f32(1, 2)), Reject("InvalidOffset"))
case(RSV, "empty tensor past the buffer",
     frame('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}}',
           f32(1, 2)), Reject("InvalidOffset"))
t = {"b": ("U8", [2], b"\1\2"), "a": ("U8", [1], b"\3")}
case(RSV, "header entries in any order",
     frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
           b"\1\2\3"), Accept(t))
case(RSV, "a hole between tensors",
     frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}',
           b"\1\2\3"), Reject("InvalidOffset"))
case(RSV, "overlapping tensors",
     frame('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}',
           b"\1\2\3"), Reject("InvalidOffset"))
case(RSV, "data_offsets end before begin", frame('{"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}}', b"\1"),
     Reject("InvalidOffset"))
case(RSV, "data_offsets with three numbers", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}', b"\1"),
     Reject("serde: a 2-tuple"))
case(RSV, "data_offsets of floats", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1.0]}}', b"\1"),
     Reject("serde: usize"))
case(RSV, "negative dimension", frame('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: usize"))
case(RSV, "dimension with an exponent", frame('{"a":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: usize"))
case(RSV, "dimension beyond 64 bits", frame('{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}}',
                                             b"\1"), Reject("serde: usize"))
case(RSV, "dimension as a string", frame('{"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: usize"))
case(RSV, "shape missing", frame('{"a":{"dtype":"U8","data_offsets":[0,1]}}', b"\1"), Reject("serde: missing field"))
case(RSV, "dtype missing", frame('{"a":{"shape":[1],"data_offsets":[0,1]}}', b"\1"), Reject("serde: missing field"))
case(RSV, "data_offsets missing", frame('{"a":{"dtype":"U8","shape":[1]}}', b"\1"), Reject("serde: missing field"))
case(RSV, "a field twice in an entry", frame('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: duplicate field"))
t = {"a": ("U8", [1], b"\1")}
case(RSV, "unknown fields in an entry",
     frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":{"x":[1,2]}}}', b"\1"), Accept(t))
case(RSV, "lower-case dtype", frame('{"a":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: unknown variant"))
case(RSV, "dtype the format does not have (C128)", frame('{"a":{"dtype":"C128","shape":[1],"data_offsets":[0,16]}}',
                                                         b"\0" * 16), Reject("serde: unknown variant"))
case(RSV, "dtype not a string", frame('{"a":{"dtype":8,"shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: unknown variant"))
case(RSV, "entry not an object", frame('{"a":[1,2]}'), Reject("serde: TensorInfo"))
case(RSV, "entry a number", frame('{"a":5}'), Reject("serde: TensorInfo"))
case(RSV, "header a JSON array", frame("[]"), Reject("serde: a map"))
case(RSV, "header a JSON string", frame('"{}"'), Reject("serde: a map"))
case(RSV, "header of length 0", frame(""), Reject("serde: EOF"))
case(RSV, "header of spaces only", frame("        "), Reject("serde: EOF"))
case(RSV, "text after the JSON object", frame('{}x'), Reject("serde: trailing characters"))
case(RSV, "two JSON objects", frame('{}{}'), Reject("serde: trailing characters"))
case(RSV, "padded with NUL bytes", frame('{}\0\0\0\0\0\0'), Reject("serde: trailing characters"))
case(RSV, "a NUL byte inside the header", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\0{"x":1}', b"\1"),
     Reject("serde: trailing characters"))
case(RSV, "UTF-8 byte order mark", frame(b"\xef\xbb\xbf{}"), Reject("serde: expected value"))
case(RSV, "a trailing comma", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},}', b"\1"),
     Reject("serde: trailing comma"))
case(RSV, "a comment", frame('{/* x */}'), Reject("serde: key must be a string"))
case(RSV, "unquoted key", frame('{a:{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Reject("serde: key must be a string"))
t = {"a": ("U8", [1], b"\1")}
case(RSV, "pretty-printed header",
     frame('{\n  "a": {\n    "dtype": "U8",\n    "shape": [\n      1\n    ],\n    "data_offsets": [0, 1]\n  }\n}\n', b"\1"),
     Accept(t))
case(RSV, "__metadata__ null", frame('{"__metadata__":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Accept(t))
case(RSV, "__metadata__ empty", frame('{"__metadata__":{},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Accept(t))
case(RSV, "__metadata__ last", frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"k":"v"}}',
                                     b"\1"), Accept(t, {"k": "v"}))
case(RSV, "__metadata__ value a number", frame('{"__metadata__":{"k":1}}'), Reject("serde: a string"))
case(RSV, "__metadata__ value null", frame('{"__metadata__":{"k":null}}'), Reject("serde: a string"))
case(RSV, "__metadata__ value an object", frame('{"__metadata__":{"k":{"x":"y"}}}'), Reject("serde: a string"))
case(RSV, "__metadata__ a string", frame('{"__metadata__":"pt"}'), Reject("serde: a map"))
case(RSV, "__metadata__ twice", frame('{"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}}'),
     Reject("serde: duplicate field"))
case(RSV, "a metadata key twice", frame('{"__metadata__":{"k":"1","k":"2"}}'), Accept({}, {"k": "2"}),
     stricter="duplicate-key")
case(RSV, "a tensor name twice",
     frame('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
           b"\1"), Accept(t), stricter="duplicate-key")
t = {"caf\u00e9 \U0001f600": ("U8", [1], b"\1")}
case(RSV, "names with \\u escapes and a surrogate pair",
     frame('{"caf\\u00e9 \\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"), Accept(t))
case(RSV, "a lone surrogate escape in a name",
     frame('{"a\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"), Reject("serde: lone surrogate"))
case(RSV, "invalid UTF-8 inside a name", frame(b'{"a\xc3":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Reject("InvalidHeader"))
case(RSV, "overlong UTF-8 encoding", frame(b'{"\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
     Reject("InvalidHeader"))
for label, nm in [("an empty name", ""), ("a name with '/'", "model/w"), ("a name with '..'", "../etc/passwd"),
                  ("a name with an empty segment", "a..b"), ("a NUL byte in a name (\\u0000)", "a\0b"),
                  ("a newline in a name", "a\nb"), ("the reserved __ckpt prefix", "__ckpt.validation_logits")]:
    t = {nm: ("U8", [1], b"\1")}
    case(RSV, label, frame(compact({nm: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}), b"\1"), Accept(t),
         import_stricter="unsafe-name")
t = {"flags": ("BOOL", [4], b"\0\1\2\xff")}
case(RSV, "BOOL bytes other than 0 and 1", in_order(t), Accept(t))
for dt in ["F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "C64"]:
    shape = [4] if BITS[dt] != 6 else [4]
    t = {"x": (dt, shape, pattern(nbytes(dt, shape), 3))}
    case(RSV, f"dtype {dt}", in_order(t), Accept(t), stricter="unrepresentable-dtype")
for dt in ["U16", "U32", "U64", "F8_E4M3", "F8_E5M2"]:
    shape = [256 // BITS[dt] * 8] if BITS[dt] > 8 else [256]
    raw = bytes(range(256)) if dt.startswith("F8") else pattern(nbytes(dt, shape), 4)
    if dt == "U64":
        raw = np.array([0, 1, 2 ** 53 + 1, 2 ** 63, 2 ** 64 - 1], dtype="<u8").tobytes()
        shape = [5]
    t = {"x": (dt, shape, raw)}
    case(RSV, f"dtype {dt}, every pattern or the extremes", in_order(t), Accept(t), writer=ref_serialize(t))
t = {"a": ("U8", [1], b"\1")}
case(RSV, "a file under 8 bytes", b"\1\0\0", Reject("HeaderTooSmall"))
case(RSV, "header length past the file", frame('{}')[:-1], Reject("InvalidHeaderLength"))
case(RSV, "header length 2^64 - 1", b"\xff" * 8 + b"{}", Reject("HeaderTooLarge"))

# ---- bindings/python/tests/test_simple.py ---------------------------------------------------

T_I32_PADDED = b'@\0\0\0\0\0\0\0{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}    '
t = {"test": ("I32", [2, 2], i32_zero(4))}
case(PY, "test_serialization", T_I32_PADDED + i32_zero(4), Accept(t), writer=T_I32_PADDED + i32_zero(4))
one = i32_zero(3) + struct.pack("<i", 1)
case(PY, "test_serialization (data[1, 1] = 1)", T_I32_PADDED + one, Accept({"test": ("I32", [2, 2], one)}),
     writer=T_I32_PADDED + one)
case(PY, "test_deserialization", frame(T_I32, i32_zero(4)), Accept(t))
meta_file = (b'f\0\0\0\0\0\0\0{"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],'
             b'"data_offsets":[0,16]}}       ' + i32_zero(4))
case(PY, "test_deserialization_metadata", meta_file, Accept({"test1": ("I32", [2, 2], i32_zero(4))}, {"framework": "pt"}))
t = {"test1": ("I32", [2, 2], i32_zero(4)), "test2": ("I32", [2, 2], i32_zero(4))}
case(PY, "test_serialization_order_invariant", in_order(t, names=["test2", "test1"]), Accept(t), writer=ref_serialize(t))
aligned = (b'\x80\0\0\0\0\0\0\0{"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},"test2":{"dtype":"F16",'
           b'"shape":[2,2],"data_offsets":[16,24]}}      ' + b"\0" * 24)
t = {"test1": ("I32", [2, 2], i32_zero(4)), "test2": ("F16", [2, 2], b"\0" * 8)}
case(PY, "test_serialization_forces_alignment", in_order(t, names=["test2", "test1"]), Accept(t), writer=aligned)
with_meta = (b'`\0\0\0\0\0\0\0{"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],'
             b'"data_offsets":[0,16]}} ' + i32_zero(4))
t = {"test1": ("I32", [2, 2], i32_zero(4))}
case(PY, "test_serialization_metadata", with_meta, Accept(t, {"framework": "pt"}), writer=with_meta)
case(PY, "test_serialization_no_big_endian", with_meta, Accept(t, {"framework": "pt"}), writer=with_meta)
t = {"a": ("F32", [2, 2], pattern(16, 1)), "b": ("U8", [2, 3], pattern(6, 2))}
case(PY, "test_accept_path", ref_serialize(t), Accept(t))
case(PY, "test_get_correctly_dropped", ref_serialize(t), Accept(t))
case(PY, "test_file_not_found", None, Reject("FileNotFoundError"))
t = {"a": ("F64", [2, 2], b"\0" * 32), "b": ("U8", [2, 3], b"\0" * 6)}
case(PY, "test_numpy_example", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"a": ("BOOL", [], b"\0")}
case(PY, "test_numpy_bool", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"a": ("F32", [2, 2], np.random.default_rng(1).standard_normal(4).astype("<f4").tobytes()),
     "b": ("U8", [2, 3], bytes(np.random.default_rng(2).integers(0, 128, 6, dtype=np.uint8)))}
case(PY, "test_torch_example", ref_serialize(t), Accept(t), writer=ref_serialize(t))
case(PY, "test_exception (unknown dtype)", frame('{"test":{"dtype":"nonsense","shape":[1],"data_offsets":[0,0]}}'),
     Reject("unknown dtype"))
t = {"a": ("F32", [10, 5], np.random.default_rng(3).standard_normal(50).astype("<f4").tobytes())}
case(PY, "test_torch_slice", ref_serialize(t), Accept(t))
t = {"a": ("F64", [10, 5], np.random.default_rng(4).random(50).astype("<f8").tobytes())}
case(PY, "test_numpy_slice", ref_serialize(t), Accept(t))

# ---- bindings/python/tests/test_pt_comparison.py --------------------------------------------

t = {"test": ("I32", [2, 2], i32_zero(4))}
case(PT, "test_serialization", T_I32_PADDED + i32_zero(4), Accept(t), writer=T_I32_PADDED + i32_zero(4))
case(PT, "test_serialization (data[1, 1] = 1)", T_I32_PADDED + one, Accept({"test": ("I32", [2, 2], one)}),
     writer=T_I32_PADDED + one)
bf = b'@\0\0\0\0\0\0\0{"test":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}    \x10@\x80?\x80?\x80?'
case(PT, "test_serialization (bfloat16)", bf, Accept({"test": ("BF16", [2, 2], b"\x10@\x80?\x80?\x80?")}), writer=bf)
t = {"test": ("BF16", [2, 2], pattern(8, 5)), "test2": ("F16", [2, 2], pattern(8, 6)), "test3": ("BOOL", [2, 2], b"\1\0\0\0"),
     "test4": ("C64", [2, 2], b"\0" * 32)}
case(PT, "test_odd_dtype", ref_serialize(t), Accept(t), stricter="unrepresentable-dtype")
c64 = b'@\0\0\0\0\0\0\0{"test":{"dtype":"C64","shape":[2,2],"data_offsets":[0,32]}}    '
case(PT, "test_complex", c64 + b"\0" * 32, Accept({"test": ("C64", [2, 2], b"\0" * 32)}), stricter="unrepresentable-dtype")
t = {"test": ("F8_E4M3", [1], b"\xb0")}  # -0.5: sign, exponent 6 (bias 7), mantissa 0
case(PT, "test_odd_dtype_fp8_e4m3fn", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"test": ("F8_E5M2", [1], b"\xb8")}  # -0.5: sign, exponent 14 (bias 15), mantissa 0
case(PT, "test_odd_dtype_fp8_e5m2", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"test": ("F8_E8M0", [1], b"\x7e")}
case(PT, "test_odd_dtype_fp8_e8m0", ref_serialize(t), Accept(t), stricter="unrepresentable-dtype")
t = {"test1": ("F8_E4M3FNUZ", [1], b"\x40"), "test2": ("F8_E5M2FNUZ", [1], b"\x40")}
case(PT, "test_odd_dtype_fp8_fnuz", ref_serialize(t), Accept(t), stricter="unrepresentable-dtype")
t = {"test1": ("F8_E8M0", [1], b"\0"), "test2": ("F4", [2, 2], b"\0\0")}
case(PT, "test_odd_dtype_fp4", ref_serialize(t), Accept(t), stricter="unrepresentable-dtype")
t = {"test": ("F32", [2, 0], b"")}
case(PT, "test_zero_sized", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"test": ("F32", [2, 0], b""), "test2": ("F32", [2, 0], b"")}
case(PT, "test_multiple_zero_sized", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"test": ("F32", [9, 10], b"\0" * 360), "test2": ("F32", [1, 10], b"\0" * 40)}
case(PT, "test_disjoint_tensors_shared_storage", ref_serialize(t), Accept(t), writer=ref_serialize(t))
mem = b'@\0\0\0\0\0\0\0{"test":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}    ' + b"\0" * 16
case(PT, "test_in_memory", mem, Accept({"test": ("F32", [2, 2], b"\0" * 16)}), writer=mem)
t = {n: ("F32", [1024, 1024], b"\0" * (4 << 20)) for n in ["test", "test2", "test3"]}
case(PT, "LoadTestCase (three 1024 x 1024 tensors)", ref_serialize(t), Accept(t), writer=ref_serialize(t))
t = {"test": ("F32", [1, 2, 3], f32(0, 1, 2, 3, 4, 5))}
case(PT, "test_deserialization_slice", ref_serialize(t), Accept(t))
case(PT, "test_deserialization_metadata (none)", ref_serialize(t), Accept(t))
case(PT, "test_deserialization_metadata", ref_serialize(t, {"Something": "more"}), Accept(t, {"Something": "more"}),
     writer=ref_serialize(t, {"Something": "more"}))

# ---- attacks/ -------------------------------------------------------------------------------

t = {"weight": ("F32", [2, 2], b"\0" * 16)}
abuse1 = bytearray(ref_serialize(t))
abuse1[:8] = struct.pack("<Q", 1000)
case(ATT, "safetensors_abuse_attempt_1 (header length 1000)", bytes(abuse1), Reject("InvalidHeaderLength"))


def abuse_2(path):
    """10 million entries at [0, 16]: a header of about 800 MB (json.dumps spacing). Only its
    first megabyte is written; the rest of the file is a hole of the right size, which is all a
    reader that checks the length first ever sees."""
    count = 10_000_000
    entry = '"weight_{}": {{"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}'
    base = len(entry.format(0)) - 1  # without the index's digits
    digits = 1 + sum((min(count, 10 ** d) - 10 ** (d - 1)) * d for d in range(1, len(str(count)) + 1))  # of 0..count-1
    n = 2 + count * base + digits + 2 * (count - 1)
    head = "{" + ", ".join(entry.format(i) for i in range(20000))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + head.encode()[:1 << 20])
        f.truncate(8 + n + n)


case(ATT, "safetensors_abuse_attempt_2 (10^7 entries, ~800 MB header)", abuse_2, Reject("HeaderTooLarge"))
meta3 = {f"weight_{i}": {"dtype": "F32", "shape": [200, 200], "data_offsets": [0, 160000]} for i in range(100_000)}
head3 = json.dumps(meta3).encode()
case(ATT, "safetensors_abuse_attempt_3 (10^5 entries at [0, 160000])",
     lambda path: open(path, "wb").write(frame(head3, b"\0" * len(head3))), Reject("InvalidOffset"))


def torch_ace(path):
    """torch_ace_create.py: a .pt whose pickle calls os.system. For `ckpt import` only."""
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {path}.pwned",))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"weight": Evil()}, protocol=2))
        z.writestr("archive/version", "3\n")


def torch_dos(path):
    """torch_dos_create.py: a 2 x 2 float tensor whose storage record inflates to 40 GB; here
    256 MB (the verdict does not depend on the size: the record must be refused, not inflated)."""
    pkl = (b"\x80\x02}q\x00X\x06\x00\x00\x00weightq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00"
           b"storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x04tq\x07QK\x00"
           b"K\x02K\x02\x86q\x08K\x02K\x01\x86q\t\x89ccollections\nOrderedDict\nq\n)Rq\x0btq\x0cRq\rs.")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
        with z.open("archive/data/0", "w", force_zip64=True) as f:
            block = b"\0" * (1 << 20)
            for _ in range(256):
                f.write(block)


# ---- running --------------------------------------------------------------------------------


def materialise(c, suffix):
    path = fresh(suffix)
    if c["data"] is None:
        return path  # does not exist
    if callable(c["data"]):
        c["data"](path)
    else:
        with open(path, "wb") as f:
            f.write(c["data"])
    return path


def lib_verdict(path):
    """st_tool dump: ("accept", tensors, metadata) or ("reject", message)."""
    p = subprocess.run([ST_TOOL, "dump", path], capture_output=True)
    if p.returncode != 0:
        return "reject", p.stderr.decode(errors="replace").strip(), p.returncode
    tensors, meta = {}, {}
    for line in p.stdout.decode().splitlines():
        f = line.split(" ")
        if f[0] == "tensor":
            shape = json.loads(f[3])
            tensors[bytes.fromhex(f[1]).decode()] = (f[2], shape, bytes.fromhex(f[4]) if len(f) > 4 else b"")
        elif f[0] == "meta":
            meta[bytes.fromhex(f[1]).decode()] = bytes.fromhex(f[2]).decode() if len(f) > 2 else ""
    return "accept", tensors, meta


def import_verdict(path):
    """ckpt import, then ckpt export to safetensors, read back here."""
    root = fresh("-root")
    p = subprocess.run([CKPT, "import", path, root], capture_output=True)
    if p.returncode != 0:
        return "reject", p.stderr.decode(errors="replace").strip(), p.returncode
    out = fresh("-export.safetensors")
    q = subprocess.run([CKPT, "export", root, out, "--format", "safetensors"], capture_output=True)
    if q.returncode != 0:
        return "export-failed", q.stderr.decode(errors="replace").strip(), q.returncode
    tensors, meta = read_file(out)
    return "accept", tensors, meta


def same_tensors(got, want):
    if set(got) != set(want):
        return f"tensors {sorted(got)} instead of {sorted(want)}"
    for n, (dt, shape, raw) in want.items():
        if got[n] != (dt, shape, raw):
            g = got[n]
            return (f"tensor {n!r}: {g[0]} {g[1]} {g[2][:16].hex()}... instead of {dt} {shape} {raw[:16].hex()}..."
                    if len(raw) > 16 else f"tensor {n!r}: {g} instead of {(dt, shape, raw)}")
    return None


def judge(c, path_kind, result, stricter):
    """'agree', ('stricter', rule) or ('disagree', why) for one path's result."""
    verdict = c["verdict"]
    kind = result[0]
    if kind in ("reject", "export-failed"):
        message, rc = result[1], result[2]
        if rc < 0 or rc > 2:
            return "disagree", f"{path_kind} crashed or exited {rc}: {message[-300:]}"
        if path_kind == "library" and not message.startswith("ckpt::error ("):
            return "disagree", f"library refused without a ckpt::error: {message[-300:]}"
        if c["data"] is not None and os.path.basename(c["path"]) not in message:
            return "disagree", f"{path_kind}'s error does not name the file: {message[-300:]}"
        if isinstance(verdict, Reject):
            if c.get("marker") and os.path.exists(c["marker"]):
                return "disagree", f"{path_kind}: the payload ran"
            return "agree", None
        if kind == "export-failed":
            return "disagree", f"imported but the export failed: {message[-300:]}"
        if stricter:
            return "stricter", stricter
        return "disagree", f"reference accepts, {path_kind} refuses: {message[-300:]}"
    # accepted
    if isinstance(verdict, Reject):
        return "disagree", f"reference rejects ({verdict.why}), {path_kind} accepts"
    if stricter:
        return "disagree", f"listed as stricter ({stricter}) but {path_kind} accepts: the list is stale"
    why = same_tensors(result[1], verdict.tensors)
    if why:
        return "disagree", f"{path_kind}: {why}"
    meta = result[2]
    if path_kind == "library" and meta != verdict.metadata:
        return "disagree", f"library metadata {meta} instead of {verdict.metadata}"
    if path_kind == "import" and any(meta.get(k) != v for k, v in verdict.metadata.items()):
        return "disagree", f"export metadata {meta} lacks {verdict.metadata}"
    return "agree", None


def writer_check(c):
    if c["writer"] is None:
        return None
    src = c["path"]
    out = src if c["writer"] == "same-path" else fresh("-copy.safetensors")
    want = open(src, "rb").read() if c["writer"] == "same-path" else c["writer"]
    p = subprocess.run([ST_TOOL, "copy", src, out], capture_output=True)
    if p.returncode != 0:
        return f"st_tool copy failed: {p.stderr.decode(errors='replace')[-300:]}"
    got = open(out, "rb").read()
    if got != want:
        return f"writer bytes differ: {got[:120]!r}... instead of {want[:120]!r}..."
    return None


with open(CLI_DOC, encoding="utf-8") as f:
    cli_doc = f.read()
failures = []
for rule in STRICTER:
    if f"`{rule}`" not in cli_doc:
        failures.append(f"stricter rule `{rule}` is not listed in {CLI_DOC}")
        print(f"FAIL: stricter rule `{rule}` is not listed in {CLI_DOC}")

tally = {"agree": 0, "stricter": 0, "disagree": 0}
by_path = {"library": {"agree": 0, "stricter": 0, "disagree": 0}, "import": {"agree": 0, "stricter": 0, "disagree": 0}}
sources = {}
used_rules = set()
for c in cases:
    c["path"] = materialise(c, ".safetensors")
    start = time.monotonic()
    outcomes = {"library": judge(c, "library", lib_verdict(c["path"]), c["stricter"]),
                "import": judge(c, "import", import_verdict(c["path"]), c["import_stricter"])}
    w = writer_check(c)
    if w:
        outcomes["writer"] = ("disagree", w)
    seconds = time.monotonic() - start
    if seconds > 20:
        outcomes["time"] = ("disagree", f"took {seconds:.1f} s")
    for k in ("library", "import"):
        o = outcomes[k]
        by_path[k][o[0] if isinstance(o, tuple) else o] += 1
    kinds = [o[0] for o in outcomes.values()]
    overall = "disagree" if "disagree" in kinds else "stricter" if "stricter" in kinds else "agree"
    tally[overall] += 1
    sources.setdefault(c["source"], 0)
    sources[c["source"]] += 1
    notes = "; ".join(f"{k}: {o[1]}" for k, o in outcomes.items() if o[0] != "agree")
    if overall == "stricter":
        used_rules.update(o[1] for o in outcomes.values() if o[0] == "stricter")
        print(f"stricter  [{c['source']}] {c['name']}: {notes}")
    elif overall == "disagree":
        failures.append(c["name"])
        print(f"DISAGREE  [{c['source']}] {c['name']}: {notes}")
    os.path.exists(c["path"]) and os.remove(c["path"])  # the large ones

# The two .pt attacks of attacks/ target torch.load, which ckpt import also is: each must be
# refused quickly, cleanly, and without running anything.
for label, build in [("torch_ace_create.py (pickle calls os.system)", torch_ace),
                     ("torch_dos_create.py (storage inflating to 256 MB)", torch_dos)]:
    path = fresh(".pt")
    build(path)
    start = time.monotonic()
    p = subprocess.run([CKPT, "import", path, fresh("-root")], capture_output=True)
    seconds = time.monotonic() - start
    err = p.stderr.decode(errors="replace")
    sources[ATT] += 1
    if p.returncode in (1, 2) and os.path.basename(path) in err and not os.path.exists(path + ".pwned") and seconds < 10:
        tally["agree"] += 1
        by_path["import"]["agree"] += 1
    else:
        tally["disagree"] += 1
        failures.append(label)
        print(f"DISAGREE  [{ATT}] {label}: exit {p.returncode} after {seconds:.1f} s: {err[-300:]}")

print("cases by source: " + ", ".join(f"{s} {n}" for s, n in sources.items()))
print("library (st_tool dump): " + ", ".join(f"{n} {k}" for k, n in by_path["library"].items()))
print("tool (ckpt import, export): " + ", ".join(f"{n} {k}" for k, n in by_path["import"].items()))
print("stricter rules used: " + ", ".join(sorted(used_rules)))
print(f"reference cases: {tally['agree']} agree, {tally['stricter']} stricter-by-design (listed), "
      f"{tally['disagree']} disagree")
if failures:
    sys.exit(1)
