#!/usr/bin/python3
"""Runs s3rver and the fault proxy around the S3 tests.

As a module:

    with harness.servers(s3rver_js, workdir) as s:
        s.endpoint        # http://127.0.0.1:P   s3rver itself
        s.proxy           # http://127.0.0.1:Q   through fault_proxy
        s.control         # http://127.0.0.1:R   fault_proxy's JSON control API
        s.bucket, s.data_dir, s.env()  # env() = the CKPT_TEST_S3_* / AWS_* vars
        s.set_faults([...]); s.log(); s.kill(); s.restart()  # same as the API

As a test wrapper (what meson runs):

    harness.py [--s3rver PATH/s3rver.js] [--workdir DIR] [--node NODE] -- CMD ARGS...

runs CMD with the environment described in env() and exits with its status.
Exit status 77 (skipped) if node or s3rver is not installed.  --s3rver
defaults to $CKPT_S3RVER_JS, else tests/s3/node_modules (from `npm ci` here).

Everything listens on 127.0.0.1 only.  s3rver runs in its own process group and
is SIGKILLed on the way out, including when this script is killed outright
(PR_SET_PDEATHSIG), so no node process outlives a test.
"""

import argparse
import contextlib
import ctypes
import http.client
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # so that this works as a script from any directory
import fault_proxy  # noqa: E402  (needs the path above)

BUCKET = "ckpt-test"
SKIP = 77  # the exit status meson (and automake) read as "skipped"
# Where `npm ci` in this directory puts it (package-lock.json pins 3.7.1).
DEFAULT_S3RVER_JS = os.path.join(HERE, "node_modules", "s3rver", "bin", "s3rver.js")
# s3rver's bin prints this even with --silent; with -p 0 it is how we learn the
# port without a bind-then-release race.
_LISTENING = re.compile(rb"S3rver listening on [^\s:]+:(\d+)")
_START_TIMEOUT = 60.0  # node cold start on a busy 2-core CI box can take seconds

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child must not import
except OSError:
    _libc = None


class StartError(RuntimeError):
    pass


def find_node():
    return shutil.which("node") or shutil.which("nodejs")


def _die_with_parent():
    """preexec_fn: have the kernel SIGKILL the child when the thread that
    spawned it exits.  That is why s3rver is spawned on one long-lived thread
    (S3rver._spawner): a control-API request thread would take s3rver down
    with it when it finishes."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def node_flags(node):
    """Extra node options s3rver needs.  s3rver builds ListObjectsV2
    continuation tokens with DES, which OpenSSL 3 only offers through its
    legacy provider; without it every truncated V2 listing is a 500
    InternalError.  Probe rather than guess from the version: whether the flag
    exists and works depends on how node and OpenSSL were built."""
    probe = "require('crypto').createCipheriv('des', Buffer.alloc(8), Buffer.alloc(8))"
    for flags in ([], ["--openssl-legacy-provider"]):
        try:
            if subprocess.run([node] + flags + ["-e", probe], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0:
                return flags
        except (OSError, subprocess.TimeoutExpired):
            break
    print("harness: warning: node has no DES; truncated ListObjectsV2 will fail with 500", file=sys.stderr)
    return []


class S3rver:
    """One s3rver process: start, SIGKILL, start again on the same port and
    data directory (so a restart looks to the client like a server that
    crashed and came back, objects intact)."""

    def __init__(self, node, script, data_dir, log_path, bucket=BUCKET):
        self.node, self.script = node, script
        self.data_dir, self.log_path, self.bucket = data_dir, log_path, bucket
        self.port = 0
        self.proc = None
        self.node_flags = node_flags(node)
        self._lock = threading.Lock()
        self._jobs = queue.Queue()
        self._spawner = threading.Thread(target=self._spawn_loop, name="s3rver-spawner", daemon=True)
        self._spawner.start()

    def _spawn_loop(self):
        while True:
            job, result = self._jobs.get()
            if job is None:
                return
            try:
                result.put((True, job()))
            except BaseException as e:  # handed back to the caller's thread
                result.put((False, e))

    def _on_spawner(self, fn):
        result = queue.Queue()
        self._jobs.put((fn, result))
        ok, value = result.get()
        if not ok:
            raise value
        return value

    def start(self):
        """Start s3rver (first time on a free port, afterwards on the same
        one) and return once it answers HTTP."""
        with self._lock:
            if self.running():
                return
            os.makedirs(self.data_dir, exist_ok=True)
            with open(self.log_path, "ab") as log:
                offset = log.tell()
                argv = [self.node] + self.node_flags + [
                    self.script, "-d", self.data_dir, "-a", "127.0.0.1", "-p", str(self.port),
                    "--configure-bucket", self.bucket, "--silent"]
                self.proc = self._on_spawner(lambda: subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent))
            self.port = self._wait_listening(offset)
            self._wait_answers()

    def _wait_listening(self, offset):
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                m = _LISTENING.search(f.read())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise StartError("s3rver exited with %s:\n%s" % (self.proc.returncode, self.log_tail()))
            time.sleep(0.05)
        self._kill_locked()
        raise StartError("s3rver did not start within %ds:\n%s" % (_START_TIMEOUT, self.log_tail()))

    def _wait_answers(self):
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self._kill_locked()
                    raise StartError("s3rver on port %d does not answer:\n%s" % (self.port, self.log_tail()))
                time.sleep(0.05)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL, no chance to flush or clean up: the crash case."""
        with self._lock:
            self._kill_locked()

    def _kill_locked(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def restart(self):
        self.kill()
        self.start()

    def close(self):
        self.kill()
        self._jobs.put((None, None))
        self._spawner.join(5)

    def log_tail(self, n=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class Servers:
    """What servers() yields.  The URL attributes are what a test needs; the
    methods are the control API for Python callers."""

    def __init__(self, s3rver, proxy, control, workdir):
        self.s3rver, self.fault_proxy, self.control_server = s3rver, proxy, control
        self.workdir = workdir
        self.bucket = s3rver.bucket
        self.data_dir = s3rver.data_dir
        self.endpoint = "http://127.0.0.1:%d" % s3rver.port
        self.proxy = "http://127.0.0.1:%d" % proxy.port
        self.control = "http://127.0.0.1:%d" % control.port

    def env(self):
        """Environment for a test process.  The AWS_* values are the ones
        s3rver accepts (it only knows the access key S3RVER and does not check
        SigV4 signatures); metadata lookups are disabled so that SDKs and the
        CLI never wait on 169.254.169.254."""
        return {
            "CKPT_TEST_S3_ENDPOINT": self.endpoint,
            "CKPT_TEST_S3_PROXY": self.proxy,
            "CKPT_TEST_S3_CONTROL": self.control,
            "CKPT_TEST_S3_BUCKET": self.bucket,
            "CKPT_TEST_S3_DATA": self.data_dir,
            "AWS_ACCESS_KEY_ID": "S3RVER",
            "AWS_SECRET_ACCESS_KEY": "S3RVER",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",  # the name awscli v1 reads
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def set_faults(self, rules):
        self.fault_proxy.set_rules(rules)

    def clear_faults(self):
        self.fault_proxy.clear_rules()

    def log(self):
        return self.fault_proxy.log()

    def clear_log(self):
        self.fault_proxy.clear_log()

    def kill(self):
        self.s3rver.kill()

    def restart(self):
        self.s3rver.restart()


@contextlib.contextmanager
def servers(s3rver_js=DEFAULT_S3RVER_JS, workdir=None, node=None, bucket=BUCKET):
    """Start s3rver (data in WORKDIR/data, output in WORKDIR/s3rver.log), the
    fault proxy and its control server; stop all of them on exit, whatever
    happened in between.  With workdir None a temporary one is used and
    removed afterwards."""
    node = node or find_node()
    if not node:
        raise StartError("node not found on PATH")
    if not os.path.isfile(s3rver_js):
        raise StartError("s3rver not found at %s (run `npm ci` in tests/s3)" % s3rver_js)
    own_workdir = workdir is None
    if own_workdir:
        workdir = tempfile.mkdtemp(prefix="ckpt-s3-")
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    s3 = S3rver(node, os.path.abspath(s3rver_js), os.path.join(workdir, "data"), os.path.join(workdir, "s3rver.log"),
                bucket)
    proxy = control = None
    try:
        s3.start()
        proxy = fault_proxy.FaultProxy(s3.port).start()
        control = fault_proxy.ControlServer(proxy, s3).start()
        yield Servers(s3, proxy, control, workdir)
    finally:
        # Reverse order; each step on its own so that one failure cannot
        # leave s3rver running.
        if control is not None:
            control.stop()
        if proxy is not None:
            proxy.stop()
        s3.close()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


class _Signalled(BaseException):
    """Raised in the main thread on SIGTERM/SIGINT/SIGHUP so that the
    finally blocks above run (meson sends SIGTERM on timeout)."""

    def __init__(self, signum):
        self.signum = signum


def _raise_signalled(signum, frame):
    # Only the first signal interrupts; a second one (meson sends SIGTERM,
    # users press ^C twice) must not cut the cleanup short.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise _Signalled(signum)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s [--s3rver JS] [--workdir DIR] -- CMD [ARGS...]")
    ap.add_argument("--s3rver", default=os.environ.get("CKPT_S3RVER_JS", DEFAULT_S3RVER_JS),
                    help="path to s3rver's bin/s3rver.js (default: %(default)s)")
    ap.add_argument("--workdir", help="keep data and s3rver.log here (default: a temp dir, removed afterwards)")
    ap.add_argument("--node", help="node binary (default: from PATH)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")

    node = args.node or find_node()
    if not node or not os.path.exists(node):
        print("harness: skipping, node is not installed", file=sys.stderr)
        return SKIP
    if not os.path.isfile(args.s3rver):
        print("harness: skipping, s3rver not found at %s (run `npm ci` in tests/s3)" % args.s3rver, file=sys.stderr)
        return SKIP

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_signalled)
    child = None
    try:
        with servers(args.s3rver, args.workdir, node=node) as s:
            env = dict(os.environ, **s.env())
            # Same process group as us (meson's timeout kill reaches it), and
            # gone with us even if we are SIGKILLed alone.
            child = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)
            rc = child.wait()
            if rc not in (0, SKIP):
                print("harness: %s exited with %d; s3rver log tail:\n%s" % (cmd[0], rc, s.s3rver.log_tail(2000)),
                      file=sys.stderr)
            # A child killed by a signal reports -N; a shell would say 128+N.
            return rc if rc >= 0 else 128 - rc
    except _Signalled as e:
        return 128 + e.signum
    except (StartError, OSError) as e:
        print("harness: %s" % e, file=sys.stderr)
        return 1
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


if __name__ == "__main__":
    sys.exit(main())
