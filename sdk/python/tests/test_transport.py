"""The transports' retry, timeout and error behaviour, against small local
HTTP servers that answer the way a busy or broken server would."""

import asyncio
import json
import os
import socket
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import libdsec  # noqa: E402
from libdsec import _retry  # noqa: E402
from libdsec.errors import error_from_response  # noqa: E402


class Script(BaseHTTPRequestHandler):
    """Answers each request with the next (status, body) of the server's script."""

    protocol_version = "HTTP/1.1"

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        srv = self.server
        with srv.lock:
            srv.hits.append((self.command, self.path))
            entry = srv.script.pop(0) if srv.script else (200, {"ok": True})
        status, body = entry[0], entry[1]
        # A 429 says when to come back, as dsec's does, unless the entry
        # gives its own headers (a used-up quota has no Retry-After).
        headers = entry[2] if len(entry) > 2 else ({"Retry-After": "0"} if status == 429 else {})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *a):
        pass


def err(code, msg):
    return {"error": {"code": code, "message": msg}}


class ScriptedServer:
    def __init__(self, script):
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Script)
        self.srv.script, self.srv.hits, self.srv.lock = list(script), [], threading.Lock()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    @property
    def hits(self):
        return self.srv.hits

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


class RetryTest(unittest.TestCase):
    def setUp(self):
        _retry.BASE_DELAY = 0.001

    def run_case(self, script, call, retries=3):
        srv = ScriptedServer(script)
        self.addCleanup(srv.close)
        client = libdsec.Client(srv.url, "k", retries=retries)
        self.addCleanup(client.close)
        return srv, client, call

    def test_idempotent_calls_retry_on_503_and_429(self):
        srv, client, _ = self.run_case([(503, err("unavailable", "node away")), (429, err("resource_exhausted", "x")),
                                        (200, {"layers": []})], None)
        self.assertEqual(client.layers(), [])
        self.assertEqual(len(srv.hits), 3)

    def test_retries_are_bounded(self):
        srv, client, _ = self.run_case([(503, err("unavailable", "down"))] * 10, None, retries=2)
        with self.assertRaises(libdsec.UnavailableError) as cm:
            client.layers()
        self.assertEqual((len(srv.hits), cm.exception.message), (3, "down"))

    def test_non_idempotent_exec_is_not_retried_on_503(self):
        srv, client, _ = self.run_case([(503, err("unavailable", "agent gone"))], None)
        with self.assertRaises(libdsec.UnavailableError):
            client.sandbox("sb-x").exec("true")
        self.assertEqual(len(srv.hits), 1)

    def test_create_retries_when_no_room(self):
        sb = {"id": "sb-1", "backend": "container", "state": "running"}
        srv, client, _ = self.run_case([(429, err("resource_exhausted", "no room")), (201, sb)], None)
        self.assertEqual(client.create(base="b").id, "sb-1")
        self.assertEqual(len(srv.hits), 2)

    def test_quota_refusal_is_not_retried(self):
        quota = (429, err("resource_exhausted", "tenant quota exceeded"), {})
        srv, client, _ = self.run_case([quota, quota], None)
        with self.assertRaises(libdsec.ResourceExhaustedError):
            client.create(base="b")
        with self.assertRaises(libdsec.ResourceExhaustedError):
            client.layers()
        self.assertEqual(len(srv.hits), 2)

    def test_create_waits_for_admission(self):
        # A create waits in the server's admission queue while the nodes with
        # room are busy: the call's timeout covers that wait and the build.
        from libdsec import _ops
        self.assertGreaterEqual(_ops.create(_ops.spec(base="b"), None).timeout, 60 + 120)
        long = _ops.create(_ops.spec(base="b", admission_timeout_seconds=600), None)
        self.assertEqual(json.loads(long.body)["admission_timeout_seconds"], 600)
        self.assertGreaterEqual(long.timeout, 600 + 120)
        now = _ops.create(_ops.spec(base="b", admission_timeout_seconds=-1), None)
        self.assertEqual(json.loads(now.body)["admission_timeout_seconds"], -1)
        self.assertGreaterEqual(now.timeout, 120)
        # When its wait runs out the server answers 504: not retried (it
        # would only wait again).
        srv, client, _ = self.run_case([(504, err("deadline_exceeded", "waited 1m0s for a node that is not busy"))], None)
        with self.assertRaises(libdsec.DeadlineExceededError):
            client.create(base="b")
        self.assertEqual(len(srv.hits), 1)

    def test_errors_map_to_classes(self):
        cases = [
            (400, err("invalid_argument", "bad"), libdsec.InvalidArgumentError),
            (401, err("unauthenticated", "who"), libdsec.UnauthenticatedError),
            (403, err("permission_denied", "no"), libdsec.PermissionDeniedError),
            (404, err("not_found", "gone"), libdsec.NotFoundError),
            (409, err("already_exists", "dup"), libdsec.AlreadyExistsError),
            (409, err("failed_precondition", "paused"), libdsec.FailedPreconditionError),
            (413, err("too_large", "big"), libdsec.TooLargeError),
            (504, err("deadline_exceeded", "slow"), libdsec.DeadlineExceededError),
            (500, err("internal", "boom"), libdsec.InternalError),
            (502, "proxy says no", libdsec.UnavailableError),
        ]
        for status, body, cls in cases:
            with self.subTest(cls=cls.__name__):
                e = error_from_response(status, json.dumps(body).encode())
                self.assertIsInstance(e, cls)
                self.assertIsInstance(e, libdsec.ApiError)
                self.assertEqual(e.status, status)

    def test_async_retries_the_same_way(self):
        srv = ScriptedServer([(503, err("unavailable", "x")), (200, {"layers": []})])
        self.addCleanup(srv.close)

        async def main():
            async with libdsec.AsyncClient(srv.url, "k") as c:
                self.assertEqual(await c.layers(), [])
                with self.assertRaises(libdsec.NotFoundError):
                    srv.srv.script.append((404, err("not_found", "nope")))
                    await c.get("sb-x")

        asyncio.run(main())
        self.assertEqual(len(srv.hits), 3)


class TimeoutTest(unittest.TestCase):
    """A server that accepts and never answers: every call ends in its timeout."""

    def setUp(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addCleanup(self.sock.close)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def test_sync(self):
        c = libdsec.Client(self.url, "k", timeout=0.3, retries=0)
        self.addCleanup(c.close)
        with self.assertRaises(libdsec.DsecTimeoutError):
            c.layers()

    def test_async(self):
        async def main():
            c = libdsec.AsyncClient(self.url, "k", timeout=0.3, retries=0)
            with self.assertRaises(libdsec.DsecTimeoutError):
                await c.layers()
            await c.close()

        asyncio.run(main())

    def test_refused(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        c = libdsec.Client(f"http://127.0.0.1:{port}", "k", retries=1)
        with self.assertRaises(libdsec.DsecConnectionError):
            c.layers()


class StaleConnectionTest(unittest.TestCase):
    def test_server_closing_idle_connections(self):
        """A pooled connection the server closed is replaced transparently."""
        srv = ScriptedServer([])
        self.addCleanup(srv.close)
        c = libdsec.Client(srv.url, "k", retries=0)
        self.addCleanup(c.close)
        c.health()
        for conn in c._pool._idle:  # the server "restarts": idle connections die
            conn.sock.shutdown(socket.SHUT_RDWR)
        c.health()
        self.assertEqual(len(srv.hits), 2)


if __name__ == "__main__":
    unittest.main()
