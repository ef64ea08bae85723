#!/usr/bin/env python3
"""The `ckpt` tool on real checkpoints written by ckpt (tests/cli/make_ckpt.cpp): every
subcommand, single- and multi-rank, its output, its exit status and its JSON.

    test_cli.py CKPT_TOOL MAKE_CKPT
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from harness import Harness

h = Harness(sys.argv[1], sys.argv[2])
run, make, check, case = h.run, h.make, h.check, h.case


tmp = tempfile.mkdtemp(prefix="ckpt-cli-")
one = os.path.join(tmp, "tp1")       # three tags at tp=1
two = os.path.join(tmp, "tp2")       # the same model saved from 2 ranks, zstd
make(one, "--iterations", "100,200,300")
make(two, "--iterations", "300", "--tp", "2", "--codec", "zstd")

TENSORS = {
    "embed.weight": ("f32", [64, 16]),
    "layers.0.fc1.weight": ("f32", [48, 16]),
    "layers.0.fc2.weight": ("f32", [16, 48]),
    "layers.0.norm.weight": ("f32", [1, 16]),
    "layers.0.fc1.weight_bf16": ("bf16", [48, 16]),
    "layers.1.fc1.weight": ("f32", [48, 16]),
    "optimizer.exp_avg.embed.weight": ("f32", [64, 16]),
    "optimizer.exp_avg.layers.0.fc1.weight": ("f32", [48, 16]),
}


@case
def help_everywhere():
    for sub in ["", "ls", "inspect", "verify", "diff", "prune", "reshard", "export", "import"]:
        p = run(*([sub] if sub else []), "--help")
        check("Usage" in p.stdout or "usage" in p.stdout.lower(), f"no usage text for {sub!r}")
    p = run("no-such-command", expect="nonzero")
    check("subcommand" in p.stderr, p.stderr)


@case
def ls_lists_tags():
    # A crashed save: a tag directory with ckpt's marker and no metadata.json.
    os.makedirs(os.path.join(one, "global_step400"))
    open(os.path.join(one, "global_step400", ".ckpt_tag"), "w").write("x\n")
    os.makedirs(os.path.join(one, "not_ckpt"))  # someone else's directory: not listed
    p = run("ls", one)
    lines = p.stdout.splitlines()
    check(lines[0].split()[:2] == ["TAG", "ITERATION"], p.stdout)
    rows = {l.split()[0]: l for l in lines[1:] if l.startswith("global_step")}
    check(set(rows) == {"global_step100", "global_step200", "global_step300", "global_step400"}, p.stdout)
    check("<- latest" in rows["global_step300"] and "<- latest" not in rows["global_step200"], p.stdout)
    check("uncommitted" in rows["global_step400"] and "committed" in rows["global_step100"], p.stdout)
    check("not_ckpt" not in p.stdout, p.stdout)
    j = json.loads(run("ls", one, "--json").stdout)
    check(j["latest"] == "global_step300", j)
    by = {t["tag"]: t for t in j["tags"]}
    check(by["global_step200"]["iteration"] == 200 and by["global_step200"]["state"] == "committed", j)
    check(by["global_step400"]["iteration"] is None and by["global_step400"]["state"] == "uncommitted", j)
    check(all(by[t]["bytes"] > 0 for t in by), j)
    check([t["tag"] for t in j["tags"]][:3] == ["global_step100", "global_step200", "global_step300"], j)
    shutil.rmtree(os.path.join(one, "not_ckpt"))


@case
def inspect_single_and_multi_rank():
    for root, shards, codec in [(one, 1, "raw"), (two, 2, "zstd")]:
        j = json.loads(run("inspect", root, "--json").stdout)
        check(j["tag"] == "global_step300" and j["iteration"] == 300, j)
        check(j["config"] == {"hidden_size": 16, "layers": 1, "seed": 1, "lr": 3e-4, "precision": 'bf16 "mixed"', "bias": True}, j["config"])
        tp = 1 if root == one else 2
        check(j["topology"]["tp"] == tp and j["topology"]["world"] == tp, j["topology"])
        t = {x["name"]: x for x in j["tensors"]}
        check(set(t) == set(TENSORS), sorted(t))
        for name, (dtype, shape) in TENSORS.items():
            check(t[name]["dtype"] == dtype and t[name]["shape"] == shape, t[name])
            elem = 2 if dtype == "bf16" else 4
            check(t[name]["raw_bytes"] == shape[0] * shape[1] * elem, t[name])
            want = 1 if name == "layers.0.norm.weight" else shards  # replicated: stored once
            check(t[name]["shards"] == want, (name, t[name]))
        check(t["embed.weight"]["codecs"] == [codec] or codec == "zstd", t["embed.weight"])
        check(len(j["files"]) == shards, j["files"])
        vals = {(v["name"], v["rank"]) for v in j["values"]}
        check(vals == {(n, r) for n in ("rng", "step") for r in range(tp)}, vals)
    # A tag directory works as PATH too, and --tag picks another tag of the root.
    j = json.loads(run("inspect", os.path.join(one, "global_step100"), "--json").stdout)
    check(j["iteration"] == 100, j["iteration"])
    j = json.loads(run("inspect", one, "--tag", "global_step200", "--json").stdout)
    check(j["iteration"] == 200, j["iteration"])
    p = run("inspect", two)
    check("layers.0.fc1.weight_bf16" in p.stdout and "bf16" in p.stdout and "tp=2" in p.stdout, p.stdout)
    p = run("inspect", os.path.join(tmp, "nowhere"), expect=2)
    check("no such checkpoint" in p.stderr, p.stderr)
    p = run("inspect", one, "--tag", "global_step999", expect=2)
    check("global_step999" in p.stderr, p.stderr)


@case
def verify_sound_and_damaged():
    for root in (one, two):
        p = run("verify", root)
        check(p.stdout.startswith("OK: global_step300"), p.stdout)
    bad = os.path.join(tmp, "bad")
    shutil.copytree(two, bad)
    j = json.loads(run("inspect", bad, "--json", "--chunks").stdout)
    fc1 = next(t for t in j["tensors"] if t["name"] == "layers.0.fc1.weight")
    c = fc1["chunk_list"][-1]
    path = os.path.join(bad, "global_step300", c["file"])
    with open(path, "r+b") as f:  # flip one byte in the middle of the chunk
        f.seek(c["file_offset"] + c["stored_bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    p = run("verify", bad, expect=1)
    check(p.stdout.startswith("DAMAGED") and "1 problem" in p.stdout, p.stdout)
    check("layers.0.fc1.weight" in p.stdout and "checksum" in p.stdout and c["file"] in p.stdout, p.stdout)
    # Two problems at once: the flipped byte and a truncated second file, both reported.
    other = next(f["path"] for f in j["files"] if f["path"] != c["file"])
    with open(os.path.join(bad, "global_step300", other), "r+b") as f:
        f.truncate(100)
    p = run("verify", bad, expect=1)
    check("2 problem" in p.stdout and "truncated" in p.stdout and "checksum" in p.stdout, p.stdout)
    # Damaged metadata: still exit 1, with the reason.
    md = os.path.join(bad, "global_step300", "metadata.json")
    text = open(md).read()
    open(md, "w").write(text.replace('"iteration": 300', '"iteration": 301'))
    p = run("verify", bad, expect=1)
    check("DAMAGED" in p.stdout and "metadata.json" in p.stdout, p.stdout)
    p = run("verify", one, "--quiet")
    check(p.stdout == "", p.stdout)


@case
def diff_equal_and_different():
    same = os.path.join(tmp, "same")
    make(same, "--iterations", "300")
    p = run("diff", one, same)
    check(p.stdout.rstrip().endswith("EQUAL"), p.stdout)
    perturbed = os.path.join(tmp, "perturbed")
    make(perturbed, "--iterations", "300", "--perturb", "layers.0.fc1.weight=0.5")
    p = run("diff", one, perturbed, expect=1)
    row = next(l for l in p.stdout.splitlines() if l.startswith("layers.0.fc1.weight "))
    fields = row.split()
    check(abs(float(fields[1]) - 0.5) < 1e-6 and fields[3] == "1" and fields[4] == "DIFFERENT", row)
    check(p.stdout.rstrip().endswith("DIFFERENT"), p.stdout)
    check(all(l.split()[-1] == "equal" for l in p.stdout.splitlines()
              if l.startswith(("embed", "optimizer", "layers.0.fc2", "layers.0.norm"))), p.stdout)
    p = run("diff", one, perturbed, "--atol", "0.6")
    check("within tolerance" in p.stdout and p.stdout.rstrip().endswith("EQUAL"), p.stdout)
    # Another topology and codec, same global tensors: equal once per-rank values are left out.
    p = run("diff", one, two, "--no-values")
    check(p.stdout.rstrip().endswith("EQUAL"), p.stdout)
    p = run("diff", one, two, expect=1)
    check("only in B: value rng of rank 1" in p.stdout, p.stdout)
    # An older iteration differs everywhere, and the step value too; block-wise reading gives
    # the same answer as reading whole tensors.
    a = run("diff", os.path.join(one, "global_step100"), same, expect=1).stdout
    b = run("diff", os.path.join(one, "global_step100"), same, "--block-bytes", "100", expect=1).stdout
    check(a == b and "value step of rank 0 differs" in a, a + "\n----\n" + b)
    # Config differences are listed; a missing tensor is reported.
    seeded = os.path.join(tmp, "seed2")
    make(seeded, "--iterations", "300", "--seed", "2", "--rows", "80")
    p = run("diff", one, seeded, expect=1)
    check("config seed: A 1, B 2" in p.stdout, p.stdout)
    check(any(l.startswith("embed.weight ") and l.endswith("A is f32 [64, 16], B is f32 [80, 16]")
              for l in p.stdout.splitlines()), p.stdout)


@case
def reshard_between_topologies():
    # tp=2 -> tp=1: one file, verified, equal to the model saved at tp=1 and to its source.
    out = os.path.join(tmp, "resharded")
    p = run("reshard", two, out, "--tp", "1")
    check("verified and equal to the source" in p.stdout, p.stdout)
    j = json.loads(run("inspect", out, "--json").stdout)
    check(len(j["files"]) == 1 and j["topology"]["tp"] == 1 and j["iteration"] == 300, j["files"])
    check(j["config"] == {"hidden_size": 16, "layers": 1, "seed": 1, "lr": 3e-4, "precision": 'bf16 "mixed"', "bias": True}, j["config"])
    check(all(t["shards"] == 1 for t in j["tensors"]), j["tensors"])
    run("verify", out)
    check(run("diff", one, out, "--no-values").stdout.rstrip().endswith("EQUAL"), "tp=2 -> 1 differs from the tp=1 save")
    check(run("diff", two, out, "--no-values").stdout.rstrip().endswith("EQUAL"), "tp=2 -> 1 differs from its source")
    # The RNG state of rank 0 came along unchanged.
    p = run("diff", os.path.join(one, "global_step300"), out)
    check(p.stdout.rstrip().endswith("EQUAL"), p.stdout)
    # tp=1 -> tp=4 splits nothing SRC did not split, unless told: --split says how.
    wide = os.path.join(tmp, "tp4")
    run("reshard", one, wide, "--tp", "4", "--split", "layers.*.fc2.weight=1", "--split", "*fc1*=0",
        "--split", "*embed.weight=0")
    j = json.loads(run("inspect", wide, "--json", "--chunks").stdout)
    t = {x["name"]: x for x in j["tensors"]}
    check(len(j["files"]) == 4 and t["layers.0.fc1.weight"]["shards"] == 4 and t["layers.0.norm.weight"]["shards"] == 1, t)
    check(sorted(c["offset"][1] for c in t["layers.0.fc2.weight"]["chunk_list"]) == [0, 12, 24, 36], t["layers.0.fc2.weight"])
    check(run("diff", one, wide, "--no-values").stdout.rstrip().endswith("EQUAL"), "tp=1 -> 4 differs")
    # tp=2 -> tp=2 pp=2: layer 0 and the embedding on stage 0, layer 1 on stage 1.
    deep = os.path.join(tmp, "pp2")
    run("reshard", two, deep, "--tp", "2", "--pp", "2")
    j = json.loads(run("inspect", deep, "--json", "--chunks").stdout)
    stage = lambda f: int(f.split("/")[0].split("_")[3])
    for x in j["tensors"]:
        want = 1 if x["name"].startswith("layers.1.") else 0
        check({stage(c["file"]) for c in x["chunk_list"]} == {want}, (x["name"], x["chunk_list"]))
    check(run("diff", two, deep, "--no-values").stdout.rstrip().endswith("EQUAL"), "pp=2 differs")
    # A split that cannot be: a clear error, nothing committed.
    bad = os.path.join(tmp, "bad_split")
    p = run("reshard", one, bad, "--tp", "32", "--split", "layers.0.norm.weight=0", expect=2)
    check("layers.0.norm.weight" in p.stderr and "tp=32" in p.stderr, p.stderr)
    check(not os.path.exists(os.path.join(bad, "latest")), os.listdir(bad) if os.path.exists(bad) else "")


@case
def progress_only_on_a_terminal():
    p = run("verify", two)
    check(p.stderr == "", p.stderr)  # a pipe gets no progress bar
    if not shutil.which("script"):
        print("     (no `script` to give the tool a terminal: the terminal half is skipped)")
        return
    # `script` runs the tool on a pseudo-terminal: the bar shows bytes, percent and rate.
    t = subprocess.run(["script", "-qec", f"{h.tool} verify {two}", "/dev/null"], capture_output=True, text=True)
    check(t.returncode == 0 and "verify [" in t.stdout and "100%" in t.stdout and "/s" in t.stdout, t.stdout)


@case
def prune_keeps_newest():
    root = os.path.join(tmp, "prune")
    make(root, "--iterations", "10,20,30,40")
    os.makedirs(os.path.join(root, "global_step50"))
    open(os.path.join(root, "global_step50", ".ckpt_tag"), "w").write("x\n")
    p = run("prune", root, "--keep", "2", "--dry-run")
    check(sorted(l.split()[-1] for l in p.stdout.splitlines()) == ["global_step10", "global_step20", "global_step50"], p.stdout)
    check(all(l.startswith("would delete") for l in p.stdout.splitlines()), p.stdout)
    check(len([d for d in os.listdir(root) if d.startswith("global_step")]) == 5, os.listdir(root))
    p = run("prune", root, "--keep", "2")
    check(sorted(d for d in os.listdir(root) if d.startswith("global_step")) == ["global_step30", "global_step40"], os.listdir(root))
    run("verify", root)
    p = run("prune", root, "--keep", "0", expect="nonzero")
    check("keep" in p.stderr, p.stderr)
    p = run("prune", root, "--keep", "5")
    check("nothing to delete" in p.stdout, p.stdout)


@case
def column_major_tensors():
    # A tensor stored column-major (as the Eigen adapter stores one): inspect shows the layout,
    # reshard and diff keep it, and export refuses it rather than write it transposed.
    root = os.path.join(tmp, "colmajor")
    make(root, "--iterations", "5", "--column-major", "1")
    t = {x["name"]: x for x in json.loads(run("inspect", root, "--json").stdout)["tensors"]}
    check(t["eigen.w"]["layout"] == "column_major" and t["eigen.w"]["shape"] == [5, 3], t["eigen.w"])
    check(t["embed.weight"]["layout"] == "row_major", t["embed.weight"])
    p = run("inspect", root)
    line = [l for l in p.stdout.splitlines() if l.startswith("eigen.w ")]
    check(line and line[0].endswith("column-major (logical [3, 5])"), p.stdout)
    check(all("column-major" not in l for l in p.stdout.splitlines() if not l.startswith("eigen.w ")), p.stdout)
    for args in (["--format", "safetensors"], ["--format", "torch"], ["--format", "torch", "--layout", "deepspeed"]):
        dst = os.path.join(tmp, "colmajor_export" + ("" if "deepspeed" in args else ".pt" if "torch" in args else ".safetensors"))
        p = run("export", root, dst, *args, expect=2)
        check("'eigen.w' (logical shape [3, 5])" in p.stderr and "column-major" in p.stderr, p.stderr)
        check(not os.path.exists(dst), dst)
    resharded = os.path.join(tmp, "colmajor_tp2")
    run("reshard", root, resharded, "--tp", "2")
    t = {x["name"]: x for x in json.loads(run("inspect", resharded, "--json").stdout)["tensors"]}
    check(t["eigen.w"]["layout"] == "column_major" and t["eigen.w"]["shape"] == [5, 3], t["eigen.w"])
    check(run("diff", root, resharded, "--no-values").stdout.rstrip().endswith("EQUAL"), "reshard changed a column-major tensor")


shutil.rmtree(tmp)
h.finish()
