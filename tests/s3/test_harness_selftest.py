#!/usr/bin/python3
"""Self-test of the S3 test harness: s3rver, the fault proxy and its control
API.  Run it on its own (it starts the servers itself):

    /usr/bin/python3 tests/s3/test_harness_selftest.py

or under the harness, which also checks the environment it hands to tests:

    /usr/bin/python3 tests/s3/harness.py -- /usr/bin/python3 tests/s3/test_harness_selftest.py

Exits 77 (skipped) when node or s3rver is not installed.  Requests carry no
Authorization header: s3rver accepts anonymous requests, and signing is the
C++ client's business, not the harness's.
"""

import contextlib
import errno
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

ENV = None  # the CKPT_TEST_S3_* variables, from the harness CLI or from servers()


def _port(url):
    return urllib.parse.urlsplit(url).port


def request(url, method, path, body=b"", headers=None, timeout=10):
    """One request on a fresh connection; returns (status, headers, body)."""
    c = http.client.HTTPConnection("127.0.0.1", _port(url), timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def control(method, path, obj=None):
    body = json.dumps(obj).encode() if obj is not None else b""
    status, _, data = request(ENV["CKPT_TEST_S3_CONTROL"], method, path, body,
                              {"Content-Type": "application/json"}, timeout=90)
    return status, json.loads(data)


def faults(*rules):
    status, reply = control("POST", "/faults", {"rules": list(rules)})
    assert status == 200, reply


def log():
    return control("GET", "/log")[1]["requests"]


class HarnessSelfTest(unittest.TestCase):
    def setUp(self):
        self.proxy = ENV["CKPT_TEST_S3_PROXY"]
        self.direct = ENV["CKPT_TEST_S3_ENDPOINT"]
        self.key = "/%s/selftest/%s" % (ENV["CKPT_TEST_S3_BUCKET"], self._testMethodName)
        control("DELETE", "/faults")
        control("DELETE", "/log")

    def put(self, data, url=None, **kw):
        status, headers, _ = request(url or self.proxy, "PUT", self.key, data, **kw)
        self.assertEqual(status, 200)
        return headers

    def test_environment(self):
        for name in ("CKPT_TEST_S3_ENDPOINT", "CKPT_TEST_S3_PROXY", "CKPT_TEST_S3_CONTROL"):
            self.assertRegex(ENV[name], r"^http://127\.0\.0\.1:\d+$")
        self.assertEqual(ENV["CKPT_TEST_S3_BUCKET"], "ckpt-test")
        self.assertTrue(os.path.isdir(os.path.join(ENV["CKPT_TEST_S3_DATA"], "ckpt-test")))
        self.assertEqual(control("GET", "/health"), (200, {"ok": True, "s3rver_running": True}))

    def test_put_get_through_proxy(self):
        data = os.urandom(3 * 1024 * 1024 + 7)
        # Expect: 100-continue as curl sends it for large bodies; http.client
        # sends the body without waiting and skips the interim 100.
        headers = self.put(data, headers={"Expect": "100-continue", "Content-MD5": "ignored-by-s3rver"})
        self.assertRegex(headers["etag"], r'^"[0-9a-f]{32}"$')
        status, headers, body = request(self.proxy, "GET", self.key, headers={"Range": "bytes=10-19"})
        self.assertEqual((status, body), (206, data[10:20]))
        self.assertEqual(headers["content-range"], "bytes 10-19/%d" % len(data))
        status, _, body = request(self.proxy, "GET", self.key)
        self.assertEqual((status, body), (200, data))
        # Keep-alive: several requests on one client connection.
        c = http.client.HTTPConnection("127.0.0.1", _port(self.proxy), timeout=10)
        for _ in range(3):
            c.request("HEAD", self.key)
            r = c.getresponse()
            r.read()
            self.assertEqual((r.status, r.getheader("Content-Length")), (200, str(len(data))))
        c.close()
        entries = log()
        self.assertEqual([(e["method"], e["status"], e["action"]) for e in entries],
                         [("PUT", 200, "forward"), ("GET", 206, "forward"), ("GET", 200, "forward")]
                         + [("HEAD", 200, "forward")] * 3)
        self.assertEqual(entries[0]["req_body_bytes"], len(data))
        self.assertEqual(entries[0]["headers"]["content-md5"], "ignored-by-s3rver")
        self.assertEqual(entries[1]["headers"]["range"], "bytes=10-19")

    def test_status_rule_fails_once(self):
        self.put(b"hello")
        faults({"match": {"method": "GET", "path": "/selftest/"}, "action": "status", "status": 503})
        status, headers, body = request(self.proxy, "GET", self.key)
        self.assertEqual(status, 503)
        self.assertIn(b"<Code>SlowDown</Code>", body)
        status, _, body = request(self.proxy, "GET", self.key)
        self.assertEqual((status, body), (200, b"hello"))
        self.assertEqual([(e["method"], e["status"], e["action"], e["rule"]) for e in log()],
                         [("PUT", 200, "forward", None), ("GET", 503, "status", 0), ("GET", 200, "forward", None)])
        rule = control("GET", "/faults")[1]["rules"][0]
        self.assertEqual((rule["matched"], rule["fired"]), (2, 1))

    def test_skip_times_and_query_match(self):
        self.put(b"x")
        # Only requests carrying ?partNumber match; of those the first passes
        # and the next two get a 500.
        faults({"match": {"query": "partNumber"}, "action": "status", "status": 500, "skip": 1, "times": 2})
        got = [request(self.proxy, "GET", self.key + "?partNumber=1")[0] for _ in range(4)]
        self.assertEqual(got, [200, 500, 500, 200])
        self.assertEqual(request(self.proxy, "GET", self.key)[0], 200)
        self.assertEqual([e["action"] for e in log()][1:], ["forward", "status", "status", "forward", "forward"])

    def test_status_before_body_closes(self):
        faults({"match": {"method": "PUT"}, "action": "status", "status": 500, "before_body": True})
        s = socket.create_connection(("127.0.0.1", _port(self.proxy)), timeout=10)
        s.sendall(b"PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
                  % self.key.encode())
        reply = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            reply += data
        s.close()
        self.assertTrue(reply.startswith(b"HTTP/1.1 500 "), reply)
        self.assertIn(b"Connection: close", reply)
        self.assertIn(b"<Code>InternalError</Code>", reply)
        self.assertEqual(log()[0]["req_body_bytes"], 0)

    def test_reset_rule(self):
        self.put(b"hello")
        faults({"match": {"method": "GET"}, "action": "reset"})
        with self.assertRaises(ConnectionResetError) as cm:
            request(self.proxy, "GET", self.key)
        # A clean close would be RemoteDisconnected (also a
        # ConnectionResetError subclass); make sure it really was an RST.
        self.assertEqual(cm.exception.errno, errno.ECONNRESET)
        self.assertEqual(request(self.proxy, "GET", self.key)[0], 200)
        self.assertEqual([(e["action"], e["status"]) for e in log()][1:], [("reset", None), ("forward", 200)])

    def test_stall_rule(self):
        self.put(b"hello")
        faults({"match": {"method": "GET"}, "action": "stall", "seconds": 3})
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError):
            request(self.proxy, "GET", self.key, timeout=1)
        self.assertLess(time.monotonic() - t0, 2.5)
        stalled = log()[1]
        self.assertEqual((stalled["action"], stalled["done"]), ("stall", False))
        # Other connections are not held up by the stalled one.
        self.assertEqual(request(self.proxy, "GET", self.key)[0], 200)

    def test_truncate_rule(self):
        data = os.urandom(100000)
        self.put(data)
        faults({"match": {"method": "GET"}, "action": "truncate"})
        c = http.client.HTTPConnection("127.0.0.1", _port(self.proxy), timeout=10)
        c.request("GET", self.key)
        r = c.getresponse()
        self.assertEqual(r.getheader("Content-Length"), str(len(data)))
        with self.assertRaises(http.client.IncompleteRead) as cm:
            r.read()
        self.assertEqual(cm.exception.partial, data[: len(data) // 2])
        c.close()
        e = log()[1]
        self.assertEqual((e["action"], e["status"], e["resp_body_bytes"]), ("truncate", 200, len(data) // 2))

    def test_bad_rule_rejected(self):
        status, reply = control("POST", "/faults", {"rules": [{"action": "explode"}]})
        self.assertEqual(status, 400)
        self.assertIn("unknown action", reply["error"])
        self.assertEqual(control("GET", "/faults")[1]["rules"], [])

    def test_kill_and_restart(self):
        self.put(b"survivor")
        self.assertEqual(control("POST", "/kill"), (200, {"ok": True, "s3rver_running": False}))
        with self.assertRaises(ConnectionRefusedError):
            request(self.direct, "GET", self.key)
        with self.assertRaises(ConnectionResetError):
            request(self.proxy, "GET", self.key)
        self.assertEqual(log()[-1]["action"], "upstream_down")
        self.assertEqual(control("POST", "/restart"), (200, {"ok": True, "s3rver_running": True}))
        self.assertEqual(request(self.direct, "GET", self.key)[0::2], (200, b"survivor"))
        self.assertEqual(request(self.proxy, "GET", self.key)[0::2], (200, b"survivor"))

    @unittest.skipUnless(shutil.which("curl"), "curl not installed")
    def test_curl_expect_continue_and_early_503(self):
        # What libcurl does in the C++ back end: a >1 MiB PUT with Expect:
        # 100-continue, refused before the body is sent, then retried.
        path = os.path.join(ENV["CKPT_TEST_S3_DATA"], "..", "curl-upload")
        data = os.urandom(2 * 1024 * 1024 + 3)
        with open(path, "wb") as f:
            f.write(data)
        try:
            faults({"match": {"method": "PUT"}, "action": "status", "status": 503, "before_body": True})
            # curl waits at most --expect100-timeout for 100 Continue and then
            # sends anyway; a long one makes a proxy that never sends 100
            # fail the test instead of merely slowing it down.  (The retry
            # itself waits curl's minimum backoff of 1 s.)
            t0 = time.monotonic()
            out = subprocess.run(["curl", "-sS", "--fail", "--retry", "1", "--expect100-timeout", "30", "-T", path,
                                  self.proxy + self.key], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertLess(time.monotonic() - t0, 15)
        finally:
            os.unlink(path)
        self.assertEqual([(e["status"], e["req_body_bytes"], e["headers"].get("expect")) for e in log()],
                         [(503, 0, "100-continue"), (200, len(data), "100-continue")])
        self.assertEqual(request(self.direct, "GET", self.key)[2], data)

    @unittest.skipUnless(shutil.which("aws"), "awscli not installed")
    def test_awscli_retries_through_proxy(self):
        # awscli is a real SigV4 client: the request must get through the
        # proxy and s3rver signed, and its retry on 503 must see the fault.
        faults({"match": {"method": "PUT"}, "action": "status", "status": 503})
        env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
                   AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        out = subprocess.run(
            ["aws", "--endpoint-url", self.proxy, "s3api", "put-object", "--bucket", ENV["CKPT_TEST_S3_BUCKET"],
             "--key", self.key.split("/", 2)[2], "--body", __file__],
            env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("ETag", out.stdout)
        entries = log()
        self.assertEqual([(e["method"], e["status"]) for e in entries], [("PUT", 503), ("PUT", 200)])
        self.assertTrue(entries[1]["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 "))


def processes_mentioning(text):
    """PIDs whose command line contains text (a leftover s3rver would)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


class HarnessCliTest(unittest.TestCase):
    """The wrapper's exit statuses, which meson relies on."""

    def run_cli(self, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, "harness.py")] + list(args),
                              capture_output=True, text=True, timeout=60)

    def test_missing_s3rver_skips(self):
        r = self.run_cli("--s3rver", "/nonexistent/s3rver.js", "--", "true")
        self.assertEqual(r.returncode, 77)
        self.assertIn("skipping", r.stderr)

    def test_exit_status_and_env_pass_through(self):
        script = ('test "$CKPT_TEST_S3_BUCKET" = ckpt-test && test "$AWS_ACCESS_KEY_ID" = S3RVER '
                  '&& test -d "$CKPT_TEST_S3_DATA" && echo "$CKPT_TEST_S3_DATA" && exit 77')
        r = self.run_cli("--", "sh", "-c", script)
        self.assertEqual(r.returncode, 77, r.stderr)
        # The temporary workdir is gone afterwards, and so is s3rver.
        data_dir = r.stdout.strip()
        self.assertFalse(os.path.exists(data_dir))
        self.assertEqual(processes_mentioning(data_dir), [])
        self.assertEqual(self.run_cli("--", "sh", "-c", "exit 3").returncode, 3)


def main():
    global ENV
    with contextlib.ExitStack() as stack:
        if "CKPT_TEST_S3_CONTROL" in os.environ:
            ENV = os.environ
        else:
            try:
                ENV = stack.enter_context(harness.servers()).env()
            except harness.StartError as e:
                print("skipping: %s" % e, file=sys.stderr)
                return harness.SKIP
        result = unittest.main(exit=False, verbosity=2).result
        return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
