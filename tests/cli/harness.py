"""What the `ckpt` tool's test scripts share: running the tool and make_ckpt, checks, and
cases that report every failure rather than stopping at the first.

    from harness import Harness
    h = Harness(sys.argv[1], sys.argv[2])
    @h.case
    def something(): h.check(h.run("ls", root).stdout != "", "empty")
    h.finish()
"""
import os
import subprocess
import sys


class Harness:
    def __init__(self, tool, make_ckpt):
        self.tool, self.make_ckpt, self.failures = tool, make_ckpt, []

    def run(self, *args, expect=0):
        """Runs `ckpt ARGS`; its exit status must be `expect` (or any but 0 for "nonzero")."""
        p = subprocess.run([self.tool, *args], capture_output=True, text=True)
        if p.returncode != expect and not (expect == "nonzero" and p.returncode != 0):
            raise AssertionError(f"ckpt {' '.join(args)}: exit {p.returncode}, expected {expect}\n"
                                 f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def make(self, root, *args):
        """Writes checkpoints with tests/cli/make_ckpt."""
        subprocess.run([self.make_ckpt, root, *args], check=True)

    @staticmethod
    def check(cond, what):
        if not cond:
            raise AssertionError(what)

    def case(self, fn):
        """Runs `fn` at once (a decorator), printing ok or FAIL with the reason. With CASES set
        (a comma-separated list of names), only those run."""
        only = os.environ.get("CASES")
        if only and fn.__name__ not in only.split(","):
            return fn
        try:
            fn()
            print(f"ok   {fn.__name__}")
        except Exception as e:  # noqa: BLE001 - report every failing case, not just the first
            self.failures.append(fn.__name__)
            print(f"FAIL {fn.__name__}: {e}")
        return fn

    def finish(self):
        if self.failures:
            print(f"{len(self.failures)} case(s) failed: {', '.join(self.failures)}")
            sys.exit(1)
        print("all cases passed")
