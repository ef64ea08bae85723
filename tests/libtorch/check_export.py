#!/usr/bin/python3
"""A LibTorch engine's checkpoint, exported with `ckpt export --format torch --group model`,
loads into the same network written in Python with torch.nn.Module.load_state_dict(strict=True),
and that network computes the C++ run's evaluation loss to the last printed digit.

usage: /usr/bin/python3 check_export.py LIBTORCH_RESUME CKPT_TOOL
(Debian's python3-torch: only /usr/bin/python3 imports it.)
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """examples/libtorch_resume.cpp's mlpImpl, in Python."""

    def __init__(self, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(16, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 4)

    def forward(self, x):
        x = F.gelu(self.norm(self.fc1(x)))
        x = F.dropout(F.gelu(self.fc2(x)), 0.1, self.training)
        return self.out(x)


def main():
    example, tool = sys.argv[1], sys.argv[2]
    seed = 7
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "run"
        run = subprocess.run([example, "--save", str(root), "--steps", "30", "--save-interval", "10", "--quiet",
                              "--seed", str(seed)], check=True, capture_output=True, text=True).stdout
        cpp_loss = re.search(r"eval_loss=(\S+)", run).group(1)
        out = Path(tmp) / "model.pt"
        ex = subprocess.run([tool, "export", str(root), str(out), "--format", "torch", "--group", "model"],
                            check=True, capture_output=True, text=True)
        assert "left out: 16 tensors outside group model" in ex.stderr, ex.stderr
        state = torch.load(out)
        net = MLP()
        names = sorted(state)
        assert names == sorted(n for n, _ in net.named_parameters()), names
        net.load_state_dict(state, strict=True)

        # The same teacher and evaluation set as the C++ run: LibTorch's and torch's CPU
        # generators are the same Mersenne Twister.
        torch.manual_seed(seed)
        teacher = nn.Linear(16, 4)
        net.eval()
        x = torch.randn(256, 16, generator=torch.Generator().manual_seed(seed + 1000))
        with torch.no_grad():
            py_loss = "%.9f" % F.mse_loss(net(x), teacher(x)).item()
        assert py_loss == cpp_loss, (py_loss, cpp_loss)

        # --group of a group the checkpoint lacks is refused.
        bad = subprocess.run([tool, "export", str(root), str(Path(tmp) / "x.pt"), "--format", "torch", "--group", "nope"],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and "no tensor under nope." in bad.stderr, bad.stderr
    print(f"ok: {len(names)} tensors load with strict=True; Python's eval loss {py_loss} is the C++ run's")


if __name__ == "__main__":
    main()
