#!/usr/bin/python3
"""Fault-injecting HTTP/1.1 proxy that sits between the S3 client under test
and s3rver.

Why a proxy and not a feature of s3rver: s3rver behaves like a healthy S3, but
the S3 back end's retry, timeout and resume logic only runs when the network or
the service misbehaves.  The proxy forwards requests unchanged and, when a fault
rule matches, answers with an error, resets the connection, stalls, or cuts a
response short instead.  Tests drive it through a small JSON control API on a
second port (see ControlServer).

Standard library only, 127.0.0.1 only.  One thread per client connection; a
fresh upstream connection per request, so that killing and restarting s3rver
never leaves the proxy holding a dead upstream socket.
"""

import http.server
import json
import socket
import struct
import threading
import time
import urllib.parse

# Bytes to move per recv()/send(); only affects speed, not behaviour.
_CHUNK = 256 * 1024
# Upper bound on a request or response head; anything bigger is not S3.
_MAX_HEAD = 256 * 1024
# How long an idle keep-alive client connection is kept open.  curl copes with
# the server closing an idle connection, so this only needs to outlive the gap
# between two requests of one test.
_CLIENT_IDLE_TIMEOUT = 120.0
# Upstream (s3rver) socket timeout.  Large enough for big bodies on a slow
# machine; a stalled s3rver is not something the tests simulate this way.
_UPSTREAM_TIMEOUT = 120.0

ACTIONS = ("status", "reset", "stall", "truncate", "delay")
_DEFAULT_CODES = {500: "InternalError", 503: "SlowDown"}


class _Closed(Exception):
    """The peer closed the connection (cleanly or not) mid-message."""


class _Reader:
    """Buffered reader over a socket, so that a head can be read line-wise and
    the body after it byte-exactly, without losing what recv() over-read."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(_CHUNK)
        if not data:
            raise _Closed()
        self.buf += data

    def read_head(self):
        """Bytes up to and including the blank line ending a message head;
        None if the peer closed cleanly before sending anything."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _MAX_HEAD:
                raise ValueError("message head too large")
            try:
                self._fill()
            except _Closed:
                if self.buf:
                    raise
                return None
        end = self.buf.index(b"\r\n\r\n") + 4
        head, self.buf = self.buf[:end], self.buf[end:]
        return head

    def read_line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        end = self.buf.index(b"\r\n") + 2
        line, self.buf = self.buf[:end], self.buf[end:]
        return line

    def read_exact(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_to_eof(self):
        chunks = [self.buf]
        self.buf = b""
        while True:
            data = self.sock.recv(_CHUNK)
            if not data:
                return b"".join(chunks)
            chunks.append(data)

    def iter_exact(self, n):
        """Yield exactly n bytes in pieces, so large bodies are streamed rather
        than held in memory twice."""
        if self.buf:
            piece, self.buf = self.buf[:n], self.buf[n:]
            n -= len(piece)
            yield piece
        while n > 0:
            data = self.sock.recv(min(n, _CHUNK))
            if not data:
                raise _Closed()
            n -= len(data)
            yield data

    def iter_chunked_raw(self):
        """Yield a chunked body exactly as it was framed (chunk-size lines,
        trailers and all), together with the decoded payload size so far.
        Forwarding the original framing keeps the request byte-faithful."""
        size = 0
        while True:
            line = self.read_line()
            n = int(line.split(b";", 1)[0].strip(), 16)
            yield line, size
            if n == 0:
                # Trailer section: header lines up to an empty line.
                while True:
                    t = self.read_line()
                    yield t, size
                    if t == b"\r\n":
                        return
            for piece in self.iter_exact(n):
                size += len(piece)
                yield piece, size
            yield self.read_exact(2), size  # CRLF after chunk data

    def read_chunked_decoded(self):
        parts = []
        while True:
            n = int(self.read_line().split(b";", 1)[0].strip(), 16)
            if n == 0:
                while self.read_line() != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(self.read_exact(n))
            self.read_exact(2)


def _parse_head(head):
    """Split a message head into (start line, [(name, value)]).  Names keep
    their original case; they are only lower-cased for lookups."""
    lines = head.decode("latin-1").split("\r\n")
    start = lines[0]
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return start, headers


def _get(headers, name, default=None):
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return default


def _without(headers, *names):
    names = {n.lower() for n in names}
    return [(k, v) for k, v in headers if k.lower() not in names]


def _build_head(start, headers):
    lines = [start] + ["%s: %s" % kv for kv in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _abort(sock):
    """Close with SO_LINGER 0: the kernel sends RST instead of FIN, so the
    client sees 'connection reset by peer' rather than a clean EOF."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _error_xml(code, message):
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>%s</Code><Message>%s</Message>"
        "<RequestId>fault-proxy</RequestId></Error>" % (code, message)
    ).encode()


class FaultRule:
    """One entry of the rule list; see FaultProxy.set_rules for the JSON."""

    def __init__(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("rule must be an object")
        match = spec.get("match") or {}
        self.method = match.get("method")
        self.path = match.get("path")
        self.query = match.get("query")
        self.action = spec.get("action")
        if self.action not in ACTIONS:
            raise ValueError("unknown action %r (expected one of %s)" % (self.action, ", ".join(ACTIONS)))
        self.status = int(spec.get("status", 503))
        self.code = spec.get("code") or _DEFAULT_CODES.get(self.status, "InternalError")
        self.message = spec.get("message") or "Injected by fault_proxy"
        self.seconds = float(spec.get("seconds", 5.0))
        self.before_body = bool(spec.get("before_body", False))
        self.headers = dict(spec.get("headers") or {})  # extra response headers
        # times < 0 means "every matching request from now on".
        self.times = int(spec.get("times", 1))
        self.skip = int(spec.get("skip", 0))
        self.spec = spec
        self.matched = 0  # matching requests that reached this rule
        self.fired = 0

    def matches(self, method, path, query_keys):
        if self.method and self.method.upper() != method.upper():
            return False
        if self.path and self.path not in path:
            return False
        if self.query and self.query not in query_keys:
            return False
        return True

    def state(self):
        return dict(self.spec, matched=self.matched, fired=self.fired)


class FaultProxy:
    """Forwards HTTP/1.1 from 127.0.0.1:<port> to an upstream 127.0.0.1 port,
    applying fault rules and logging every request."""

    def __init__(self, upstream_port, upstream_host="127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._rules = []
        self._log = []
        self._seq = 0
        self._stopping = threading.Event()
        self._conns = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)

    # ---- lifecycle -------------------------------------------------------

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stopping.set()
        # shutdown() wakes the accept() blocked in the other thread; close()
        # alone does not on Linux.
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)

    # ---- rules and log (called from the control server) ------------------

    def set_rules(self, specs):
        """Replace the rule list.  Each spec is
        {"match": {"method": "PUT", "path": "/obj", "query": "partNumber"},
         "action": "status"|"reset"|"stall"|"truncate"|"delay",
         "status": 503, "code": "SlowDown", "message": "...",   # status
         "before_body": false, "headers": {"Retry-After": "1"}, # status
         "seconds": 5,                                          # stall, delay
         "times": 1, "skip": 0}
        Rules are checked in order; the first one that fires handles the
        request and later rules do not see it."""
        rules = [FaultRule(s) for s in specs]  # validate all before replacing
        with self._lock:
            self._rules = rules

    def rules_state(self):
        with self._lock:
            return [r.state() for r in self._rules]

    def clear_rules(self):
        with self._lock:
            self._rules = []

    def log(self):
        with self._lock:
            return [dict(e) for e in self._log]

    def clear_log(self):
        with self._lock:
            self._log = []

    def _pick_rule(self, method, path, query_keys):
        with self._lock:
            for i, rule in enumerate(self._rules):
                if not rule.matches(method, path, query_keys):
                    continue
                rule.matched += 1
                if rule.matched <= rule.skip:
                    continue
                if rule.times >= 0 and rule.fired >= rule.times:
                    continue
                rule.fired += 1
                return i, rule
        return None, None

    def _record(self, entry):
        with self._lock:
            self._seq += 1
            entry["seq"] = self._seq
            self._log.append(entry)

    # ---- connection handling ---------------------------------------------

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(sock)
            threading.Thread(target=self._serve_client, args=(sock,), daemon=True).start()

    def _serve_client(self, sock):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(_CLIENT_IDLE_TIMEOUT)
        reader = _Reader(sock)
        keep = True
        try:
            while keep and not self._stopping.is_set():
                head = reader.read_head()
                if head is None:
                    break
                keep = self._serve_request(sock, reader, head)
        except (OSError, _Closed, ValueError):
            keep = False
        finally:
            with self._lock:
                self._conns.discard(sock)
            # A socket already aborted (RST) by an action is closed; close()
            # again is harmless.
            try:
                sock.close()
            except OSError:
                pass

    def _serve_request(self, sock, reader, head):
        """Handle one request whose head has been read.  Returns whether the
        client connection may carry another request."""
        start, headers = _parse_head(head)
        method, target, version = start.split(" ", 2)
        parsed = urllib.parse.urlsplit(target)
        query_keys = {k for k, _ in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)}
        entry = {
            "time": time.time(),
            "method": method,
            "path": parsed.path,
            "query": parsed.query,
            "headers": {k.lower(): v for k, v in headers},
            "action": "forward",
            "rule": None,
            "status": None,
            "req_body_bytes": 0,
            "resp_body_bytes": 0,
            "done": False,
        }
        client_keep = version == "HTTP/1.1" and (_get(headers, "connection", "").lower() != "close")
        expects_continue = _get(headers, "expect", "").lower() == "100-continue"
        index, rule = self._pick_rule(method, parsed.path, query_keys)
        if rule is not None:
            entry["action"] = rule.action
            entry["rule"] = index
        # Logged now, completed in place: a test polling the log while a
        # request is stalled can already see it.
        self._record(entry)

        def take_body(sink):
            # The client holds the body back until it sees 100 Continue (curl
            # waits a second, then sends anyway); answer it ourselves, since
            # the upstream never sees the Expect header.
            if expects_continue:
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            entry["req_body_bytes"] = self._relay_request_body(reader, headers, sink)

        try:
            if rule is None or rule.action in ("delay", "truncate"):
                if rule is not None and rule.action == "delay":
                    self._stopping.wait(rule.seconds)
                return self._forward(sock, reader, method, target, version, headers, take_body, entry, client_keep,
                                     truncate=rule is not None and rule.action == "truncate")
            if rule.action == "reset":
                # Headers are read, the body (if any) is not: like a server or
                # load balancer dying mid-request.
                _abort(sock)
                return False
            if rule.action == "stall":
                # The whole request arrives, no answer does; a client without
                # a timeout eventually sees an empty reply (clean close).
                take_body(None)
                self._stopping.wait(rule.seconds)
                sock.close()
                return False
            # action == "status"
            entry["status"] = rule.status
            if rule.before_body and (_get(headers, "content-length", "0") != "0"
                                     or _get(headers, "transfer-encoding")):
                # Answer before the body, like S3 rejecting a request on its
                # headers.  The unread body makes the connection unusable.
                client_keep = False
            else:
                take_body(None)
            body = _error_xml(rule.code, rule.message)
            resp = [("Content-Type", "application/xml"), ("Content-Length", str(len(body))),
                    ("x-amz-request-id", "fault-proxy")]
            resp += list(rule.headers.items())
            if not client_keep:
                resp.append(("Connection", "close"))
            reason = http.server.BaseHTTPRequestHandler.responses.get(rule.status, ("Error",))[0]
            head = _build_head("HTTP/1.1 %d %s" % (rule.status, reason), resp)
            sock.sendall(head if method == "HEAD" else head + body)
            return client_keep
        finally:
            entry["done"] = True

    def _relay_request_body(self, reader, headers, sink):
        """Read the request body per its framing, passing raw bytes to sink
        (or discarding them).  Returns the payload size."""
        if "chunked" in _get(headers, "transfer-encoding", "").lower():
            size = 0
            for raw, size in reader.iter_chunked_raw():
                if sink:
                    sink(raw)
            return size
        n = int(_get(headers, "content-length", "0") or 0)
        for piece in reader.iter_exact(n):
            if sink:
                sink(piece)
        return n

    def _forward(self, sock, reader, method, target, version, headers, take_body, entry, client_keep, truncate):
        def upstream_failed(action):
            # Directly, the client would have seen "connection refused" (s3rver
            # down) or a dropped connection (s3rver died mid-request); on an
            # accepted connection the nearest equivalent is a reset.
            entry["action"] = action
            _abort(sock)
            return False

        try:
            up = socket.create_connection(self.upstream, timeout=_UPSTREAM_TIMEOUT)
        except OSError:
            return upstream_failed("upstream_down")
        with up:
            try:
                up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # Expect is dropped: the proxy answered it (take_body) and
                # sends the body straight away.  Everything else goes as sent.
                up.sendall(_build_head("%s %s %s" % (method, target, version), _without(headers, "expect")))
            except OSError:
                return upstream_failed("upstream_error")

            # s3rver may answer early (an error, say) and stop reading.  Keep
            # draining the client's body so its connection stays in sync, and
            # relay whatever s3rver answered.  Failures reading from the
            # client propagate and end the client connection.
            upstream_broken = []

            def send_up(data):
                if not upstream_broken:
                    try:
                        up.sendall(data)
                    except OSError:
                        upstream_broken.append(True)

            take_body(send_up)
            try:
                status_line, status, resp_headers, body = self._read_response(_Reader(up), method)
            except (OSError, _Closed, ValueError):
                return upstream_failed("upstream_error")

        entry["status"] = status
        entry["resp_body_bytes"] = len(body)
        # Hop-by-hop headers belong to the upstream connection; the body is
        # always re-framed with Content-Length (s3rver may stream chunked).
        out = _without(resp_headers, "connection", "keep-alive", "transfer-encoding")
        if not (method == "HEAD" or status in (204, 304)):
            out = _without(out, "content-length") + [("Content-Length", str(len(body)))]
        if truncate or not client_keep:
            out.append(("Connection", "close"))
        sock.sendall(_build_head(status_line, out))
        if truncate:
            # Headers promise the full length; half arrives, then EOF.
            sock.sendall(body[: len(body) // 2])
            entry["resp_body_bytes"] = len(body) // 2
            sock.close()
            return False
        sock.sendall(body)
        return client_keep

    def _read_response(self, reader, method):
        while True:
            head = reader.read_head()
            if head is None:
                raise _Closed()
            start, headers = _parse_head(head)
            status = int(start.split(" ", 2)[1])
            if status >= 200:  # skip interim 1xx responses, if any
                break
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in _get(headers, "transfer-encoding", "").lower():
            body = reader.read_chunked_decoded()
        elif _get(headers, "content-length") is not None:
            body = reader.read_exact(int(_get(headers, "content-length")))
        else:
            body = reader.read_to_eof()
        return start, status, headers, body


class ControlServer:
    """JSON control API on its own 127.0.0.1 port, so that tests (in any
    language) can program faults and read the log with a plain HTTP client.

      GET    /health   -> {"ok": true, "s3rver_running": bool|null}
      GET    /faults   -> {"rules": [rule + {"matched": n, "fired": n}, ...]}
      POST   /faults   {"rules": [rule, ...]} -> replaces the list; 400 on a bad rule
      DELETE /faults   -> clears the list
      GET    /log      -> {"requests": [entry, ...]}
      DELETE /log      -> clears the log
      POST   /kill     -> SIGKILLs s3rver, returns once it is dead
      POST   /restart  -> starts s3rver on the same port and data dir,
                          returns once it answers HTTP (500 if it does not)

    backend: an object with kill(), restart() and running(); None disables
    the last two endpoints (they answer 501)."""

    def __init__(self, proxy, backend=None):
        self.proxy = proxy
        self.backend = backend
        control = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def _dispatch(self):
                try:
                    code, obj = control.handle(self.command, self.path.split("?", 1)[0], self._body)
                except Exception as e:  # report, don't kill the handler thread silently
                    code, obj = 500, {"error": "%s: %s" % (type(e).__name__, e)}
                self._reply(code, obj)

            do_GET = do_POST = do_DELETE = do_PUT = _dispatch

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-control", daemon=True)

    def handle(self, method, path, body):
        p, b = self.proxy, self.backend
        if (method, path) == ("GET", "/health"):
            return 200, {"ok": True, "s3rver_running": b.running() if b else None}
        if (method, path) == ("GET", "/faults"):
            return 200, {"rules": p.rules_state()}
        if (method, path) == ("POST", "/faults"):
            try:
                rules = body().get("rules")
            except (ValueError, AttributeError):
                rules = None
            if not isinstance(rules, list):
                return 400, {"error": 'expected {"rules": [...]}'}
            try:
                p.set_rules(rules)
            except (ValueError, TypeError) as e:
                return 400, {"error": str(e)}
            return 200, {"rules": p.rules_state()}
        if (method, path) == ("DELETE", "/faults"):
            p.clear_rules()
            return 200, {"rules": []}
        if (method, path) == ("GET", "/log"):
            return 200, {"requests": p.log()}
        if (method, path) == ("GET", "/log/lines"):
            # One line per request, "METHOD path?query status action", for tests in C++
            # that would rather not parse nested JSON.
            return 200, {"lines": ["%s %s%s %s %s" % (e["method"], e["path"], "?" + e["query"] if e["query"] else "",
                                                       e["status"], e["action"]) for e in p.log()]}
        if (method, path) == ("DELETE", "/log"):
            p.clear_log()
            return 200, {"requests": []}
        if path in ("/kill", "/restart") and method == "POST":
            if b is None:
                return 501, {"error": "no s3rver backend attached"}
            if path == "/kill":
                b.kill()
            else:
                b.restart()
            return 200, {"ok": True, "s3rver_running": b.running()}
        return 404, {"error": "no such endpoint: %s %s" % (method, path)}

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()


def main():
    """Stand-alone use, for poking at a running s3rver by hand:
    fault_proxy.py UPSTREAM_PORT  (prints the proxy and control ports)."""
    import sys

    proxy = FaultProxy(int(sys.argv[1])).start()
    control = ControlServer(proxy).start()
    print("proxy http://127.0.0.1:%d  control http://127.0.0.1:%d" % (proxy.port, control.port), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        control.stop()
        proxy.stop()


if __name__ == "__main__":
    main()
