#!/usr/bin/python3
"""Cross-checks ckpt's safetensors support against an independent implementation.

Debian 12 has no Python safetensors package, so this script implements the format from its
specification (https://github.com/huggingface/safetensors) with struct, json and torch:
an 8-byte little-endian header length N, N bytes of JSON, then the data buffer.

    check_safetensors.py ST_TOOL

1. ckpt writes (st_tool write): this script reads every file with its own reader, compares every
   value with the table it computes itself, checks the layout, and checks the files are
   byte-identical to what its own writer produces for the same tensors (declaration order, and
   the reference implementation's order), and that the sharded export and its index are exactly
   what transformers' save_pretrained(max_shard_size=...) algorithm and json.dumps produce.
2. This script writes (padded and unpadded headers, other key orders, ASCII-escaped JSON,
   metadata, f16/bf16, a sharded set of its own split) and ckpt reads back (st_tool check /
   dump), compared exactly.

Exits 77 (skipped) when torch cannot be imported.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipping: cannot import torch ({e})")
    sys.exit(77)

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAME_OF = {v: k for k, v in DTYPES.items()}
# The reference implementation's Dtype enum order (by alignment); it writes in descending order.
REFERENCE_RANK = ["BOOL", "U8", "I8", "I16", "F16", "BF16", "I32", "F32", "F64", "I64"]

# Keep in step with table() in st_tool.cpp.
TABLE = [
    ("emb.f64", "F64", [3, 5]),
    ("layers.0.f32", "F32", [4, 6]),
    ("layers.0.f16", "F16", [7]),
    ("layers.0.bf16", "BF16", [2, 3, 4]),
    ("big.f32", "F32", [16, 5]),
    ("i64", "I64", [9]),
    ("i32", "I32", [2, 5]),
    ("i16", "I16", [11]),
    ("i8", "I8", [13]),
    ("u8", "U8", [3, 3]),
    ("flags", "BOOL", [7]),
    ("scalar.f32", "F32", []),
    ("scalar.i64", "I64", []),
    ("empty.f32", "F32", [0]),
    ("empty.bf16", "BF16", [3, 0]),
    ("tail.f16", "F16", [2, 2]),
]
# Keep in step with metadata in st_tool.cpp.
METADATA = {
    "format": "pt",
    "producer": "ckpt st_tool",
    "note \u2713": 'quote " backslash \\ newline \n tab \t',
}
SHARD_LIMIT = 200  # st_tool writes its sharded export with parse_size("200B")

MASK64 = (1 << 64) - 1
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def hash64(k, i):
    x = ((k + 1) * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9) & MASK64
    return x ^ (x >> 31)


def float_value(k, i):
    r = i % 11
    if r == 3:
        return -0.0
    if r == 5:
        return float("inf")
    if r == 7:
        return float("-inf")
    if r == 9:
        return float("nan")
    return (((hash64(k, i) >> 40) % 512) - 256) / 16.0


def signed(v, bits):
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def expected_tensor(k):
    """Table entry k as a torch tensor, computed independently of ckpt."""
    _, dt, shape = TABLE[k]
    n = numel(shape)
    if dt in ("F64", "F32", "F16", "BF16"):
        vals = [float_value(k, i) for i in range(n)]
    elif dt == "BOOL":
        vals = [bool((hash64(k, i) >> 7) & 1) for i in range(n)]
    elif dt == "U8":
        vals = [hash64(k, i) & 0xFF for i in range(n)]
    else:
        bits = {"I64": 64, "I32": 32, "I16": 16, "I8": 8}[dt]
        vals = [signed(hash64(k, i), bits) for i in range(n)]
    return torch.tensor(vals, dtype=DTYPES[dt]).reshape(shape)


def tensor_bytes(t):
    """Row-major little-endian bytes of a tensor (bf16 through an int16 view: numpy lacks it)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def from_bytes(b, dt, shape):
    if len(b) == 0:
        return torch.empty(shape, dtype=DTYPES[dt])
    if dt == "BF16":
        return torch.frombuffer(bytearray(b), dtype=torch.int16).view(torch.bfloat16).reshape(shape)
    return torch.frombuffer(bytearray(b), dtype=DTYPES[dt]).reshape(shape)


def same_values(a, b):
    """Exact equality, NaN equal to NaN and -0 distinct from +0 (compared through the bits)."""
    if a.dtype != b.dtype or list(a.shape) != list(b.shape):
        return False
    if a.dtype.is_floating_point:
        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.view(ints), b.view(ints))
    return torch.equal(a, b)


# ---- the format, from the specification -----------------------------------------------------


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate keys in {keys}")
    return dict(pairs)


def read_safetensors(path):
    """Returns (header dict, metadata, {name: tensor}, N) after validating the layout."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header length past the end"
    header_bytes = data[8 : 8 + n]
    assert header_bytes[:1] == b"{"
    header = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=no_duplicates)
    buffer = data[8 + n :]
    metadata = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in metadata.values())
    tensors = {}
    spans = []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dt, shape = info["dtype"], info["shape"]
        assert numel(shape) * torch.tensor([], dtype=DTYPES[dt]).element_size() == end - begin, name
        spans.append((begin, end, name))
        tensors[name] = from_bytes(buffer[begin:end], dt, shape)
    cursor = 0
    for begin, end, name in sorted(spans):
        assert begin == cursor, f"{name}: hole or overlap at {cursor}"
        cursor = end
    assert cursor == len(buffer), "buffer not covered"
    return header, metadata, tensors, n


def header_json(entries, metadata, metadata_first=True, ensure_ascii=False):
    """Compact JSON like serde_json, the reference writer. entries: [(name, dtype, shape, b, e)]."""
    obj = {}
    if metadata and metadata_first:
        obj["__metadata__"] = metadata
    for name, dt, shape, b, e in entries:
        obj[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [b, e]}
    if metadata and not metadata_first:
        obj["__metadata__"] = metadata
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii).encode("utf-8")


def write_safetensors(path, tensors, metadata=None, order="given", pad=True, header_order="same",
                      metadata_first=True, ensure_ascii=False):
    """tensors: [(name, tensor)]. order: 'given' or 'reference' (dtype alignment desc, then name)."""
    items = list(tensors)
    if order == "reference":
        items.sort(key=lambda nt: nt[0])
        items.sort(key=lambda nt: REFERENCE_RANK.index(NAME_OF[nt[1].dtype]), reverse=True)
    entries, blobs, offset = [], [], 0
    for name, t in items:
        b = tensor_bytes(t)
        entries.append((name, NAME_OF[t.dtype], list(t.shape), offset, offset + len(b)))
        blobs.append(b)
        offset += len(b)
    if header_order == "reversed":
        entries = entries[::-1]
    h = header_json(entries, metadata, metadata_first, ensure_ascii)
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return len(h)


def plan_shards(sizes, limit):
    """transformers' shard_checkpoint: start a new shard when the current one is non-empty and
    the next tensor would take it past the limit."""
    shards, current = [[]], 0
    for name, size in sizes:
        if shards[-1] and current + size > limit:
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += size
    return shards


def index_text(weight_map, total_size):
    return json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map}, indent=2,
                      sort_keys=True) + "\n"


def run(tool, *args, expect_ok=True):
    p = subprocess.run([tool, *args], capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        failures.append(f"st_tool {' '.join(args)} exited {p.returncode}: {p.stderr}")
        print("FAIL:", failures[-1])
    return p


def meta_lines(metadata):
    return [f"meta {k.encode().hex()} {v.encode().hex()}" for k, v in sorted(metadata.items(), key=lambda kv: kv[0].encode())]


# ---- 1. ckpt writes, Python reads ---------------------------------------------------------------


def check_ckpt_output(tool, out):
    run(tool, "write", out)
    expected = {name: expected_tensor(k) for k, (name, _, _) in enumerate(TABLE)}
    in_order = [(name, expected[name]) for name, _, _ in TABLE]

    # Single file, declaration order.
    path = os.path.join(out, "single", "model.safetensors")
    header, metadata, tensors, n = read_safetensors(path)
    check(n % 8 == 0, "single: header length is a multiple of 8")
    raw = open(path, "rb").read()[8 : 8 + n]
    check(raw.rstrip(b" ") == raw.rstrip(), "single: header padded with spaces only")
    check(metadata == METADATA, f"single: metadata {metadata!r}")
    check(list(header) == [name for name, _, _ in TABLE], "single: header lists tensors in declaration order")
    begins = [header[name]["data_offsets"][0] for name, _, _ in TABLE]
    check(begins == sorted(begins), "single: data laid out in declaration order")
    for name, dt, shape in TABLE:
        check(header[name]["dtype"] == dt and header[name]["shape"] == shape, f"single: {name} dtype/shape")
        check(same_values(tensors[name], expected[name]), f"single: values of {name}")
        check(tensor_bytes(tensors[name]) == tensor_bytes(expected[name]), f"single: bytes of {name}")
    mine = os.path.join(out, "py_single.safetensors")
    write_safetensors(mine, in_order, dict(sorted(METADATA.items(), key=lambda kv: kv[0].encode())))
    check(open(mine, "rb").read() == open(path, "rb").read(), "single: byte-identical to the spec writer")

    # Reference order.
    path = os.path.join(out, "sorted", "model.safetensors")
    mine = os.path.join(out, "py_sorted.safetensors")
    write_safetensors(mine, in_order, {"format": "pt"}, order="reference")
    check(open(mine, "rb").read() == open(path, "rb").read(), "sorted: byte-identical to the reference order")
    _, _, tensors, _ = read_safetensors(path)
    check(all(same_values(tensors[k], v) for k, v in expected.items()), "sorted: values")

    # Sharded export and index.
    sharded = os.path.join(out, "sharded")
    sizes = [(name, len(tensor_bytes(expected[name]))) for name, _, _ in TABLE]
    plan = plan_shards(sizes, SHARD_LIMIT)
    check(len(plan) == 4, f"sharded: {len(plan)} shards planned (big.f32 alone)")
    files = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    check(sorted(os.listdir(sharded)) == sorted(files + ["model.safetensors.index.json"]),
          f"sharded: files {sorted(os.listdir(sharded))}")
    weight_map = {name: files[i] for i, names in enumerate(plan) for name in names}
    want_index = index_text(weight_map, sum(s for _, s in sizes))
    got_index = open(os.path.join(sharded, "model.safetensors.index.json")).read()
    check(got_index == want_index, f"sharded: index text\n{got_index}\nexpected\n{want_index}")
    for i, names in enumerate(plan):
        header, metadata, tensors, _ = read_safetensors(os.path.join(sharded, files[i]))
        check(list(header) == names, f"sharded: {files[i]} holds {list(header)}")
        check(metadata == {"format": "pt"}, f"sharded: {files[i]} metadata")
        for name in names:
            check(same_values(tensors[name], expected[name]), f"sharded: values of {name}")
    check(plan[2] == ["big.f32"], "sharded: the tensor over the limit has a shard of its own")


# ---- 2. Python writes, ckpt reads ---------------------------------------------------------------


def check_ckpt_input(tool, out):
    expected = [(name, expected_tensor(k)) for k, (name, _, _) in enumerate(TABLE)]

    # Reference layout: reference order, padded, metadata first.
    path = os.path.join(out, "ref.safetensors")
    write_safetensors(path, expected, {"format": "pt"}, order="reference")
    p = run(tool, "check", path)
    check(p.stdout.splitlines() == meta_lines({"format": "pt"}) + [f"ok {len(TABLE)}"], f"ref: {p.stdout!r}")

    # No padding (N not a multiple of 8), the header listing tensors in the opposite order to
    # their data, __metadata__ last, everything non-ASCII escaped as \uXXXX.
    metadata = {"caf\u00e9": "\u2603 snow", "emoji": "\U0001F600", "ctl": "a\x01b\nc\"d\\"}
    path = os.path.join(out, "unpadded.safetensors")
    while True:
        n = write_safetensors(path, expected, metadata, pad=False, header_order="reversed", metadata_first=False,
                              ensure_ascii=True)
        if n % 8:
            break
        metadata["filler"] = metadata.get("filler", "") + "x"
    check(n % 8 != 0, "unpadded: header length not a multiple of 8")
    check(b"\\u2603" in open(path, "rb").read(), "unpadded: JSON uses \\u escapes")
    p = run(tool, "check", path)
    check(p.stdout.splitlines() == meta_lines(metadata) + [f"ok {len(TABLE)}"], f"unpadded: {p.stdout!r}")

    # A sharded set split differently from ckpt's (by dtype family), index as transformers writes.
    sharded = os.path.join(out, "py_sharded")
    os.makedirs(sharded)
    groups = [[nt for nt in expected if NAME_OF[nt[1].dtype] in fam]
              for fam in (("F64", "F32"), ("F16", "BF16"), ("I64", "I32", "I16", "I8", "U8", "BOOL"))]
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(os.path.join(sharded, file), group, {"format": "pt"}, order="reference")
        for name, t in group:
            weight_map[name] = file
            total += len(tensor_bytes(t))
    index = os.path.join(sharded, "model.safetensors.index.json")
    with open(index, "w") as f:
        f.write(index_text(weight_map, total))
    p = run(tool, "check", index)
    check(p.stdout.splitlines() == meta_lines({"format": "pt"}) + [f"ok {len(TABLE)}"], f"py_sharded: {p.stdout!r}")

    # Random values of every dtype (not exact in any sense but their bits), dumped by ckpt.
    g = torch.Generator().manual_seed(1234)
    rnd = [
        ("w.f64", torch.randn(5, 3, generator=g, dtype=torch.float64)),
        ("w.f32", torch.randn(2, 3, 4, generator=g)),
        ("w.f16", torch.randn(17, generator=g).to(torch.float16)),
        ("w.bf16", torch.randn(4, 9, generator=g).to(torch.bfloat16)),
        ("n.i64", torch.randint(-2**62, 2**62, (6,), generator=g, dtype=torch.int64)),
        ("n.i32", torch.randint(-2**31, 2**31, (3, 2), generator=g, dtype=torch.int32)),
        ("n.i16", torch.randint(-2**15, 2**15, (5,), generator=g, dtype=torch.int16)),
        ("n.i8", torch.randint(-128, 128, (7,), generator=g, dtype=torch.int8)),
        ("n.u8", torch.randint(0, 256, (2, 2), generator=g, dtype=torch.uint8)),
        ("mask", torch.randint(0, 2, (9,), generator=g).to(torch.bool)),
        ("zero_d", torch.tensor(3.25, dtype=torch.bfloat16)),
        ("\u00fcnicode name", torch.zeros(0, 4, dtype=torch.float16)),
    ]
    path = os.path.join(out, "random.safetensors")
    write_safetensors(path, rnd, {"format": "pt", "seed": "1234"}, order="reference")
    p = run(tool, "dump", path)
    want = []
    for name, t in sorted(rnd, key=lambda nt: nt[0].encode()):
        want.append(f"tensor {name.encode().hex()} {NAME_OF[t.dtype]} [{','.join(str(d) for d in t.shape)}] "
                    f"{tensor_bytes(t).hex()}")
    want += meta_lines({"format": "pt", "seed": "1234"})
    check(p.stdout.splitlines() == want, "random: ckpt's dump equals torch's bytes")

    # ckpt must refuse what the spec forbids: here a hole in the buffer.
    path = os.path.join(out, "hole.safetensors")
    h = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(12))
    p = run(tool, "check", path, expect_ok=False)
    check(p.returncode == 1 and "hole in the data buffer" in p.stderr, f"hole: {p.returncode} {p.stderr!r}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="ckpt-st-") as out:
        check_ckpt_output(tool, os.path.join(out, "ckpt"))
        check_ckpt_input(tool, out)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("safetensors interop: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
