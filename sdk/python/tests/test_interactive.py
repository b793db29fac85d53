"""Terminals (and later ports and live logs) through libdsec, blocking and
asyncio, against a real server ($DSEC_URL, $DSEC_API_KEY)."""

import asyncio
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import libdsec  # noqa: E402

BASE = os.environ.get("DSEC_TEST_BASE", "base:minimal")


def read_until(term, needle: bytes, timeout: float = 60) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} never came; got {buf!r}")
        b = term.recv(timeout=timeout)
        if not b:
            raise AssertionError(f"terminal ended before {needle!r}; got {buf!r}")
        buf += b
    return buf


class TerminalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.environ.get("DSEC_URL"):
            raise unittest.SkipTest("no server")
        cls.client = libdsec.Client()
        cls.sb = cls.client.create(base=BASE, resources={"memory_mb": 64}, labels={"suite": "py-interactive"})

    @classmethod
    def tearDownClass(cls):
        cls.sb.close()
        cls.client.close()

    def test_exec_tty(self):
        r = self.sb.exec("stty size; tty >/dev/null && echo on-a-tty", tty=(9, 33))
        self.assertEqual(r.stdout, "9 33\r\non-a-tty\r\n")

    def test_terminal(self):
        with self.sb.terminal(["/bin/sh"], rows=12, cols=40, env={"X": "y"}) as t:
            t.send("echo $X-$((20+1)); stty size\n")
            read_until(t, b"y-21\r\n12 40\r\n")
            t.resize(30, 90)
            t.send(b"stty size\n")
            read_until(t, b"30 90\r\n")
            t.send("exit 4\n")
            t.read_all()
            self.assertEqual(t.exit_code, 4)

    def test_terminal_url(self):
        # A signed URL opens the terminal without a key (as a browser does).
        from urllib.parse import urlsplit
        from libdsec._terminal import Terminal
        from libdsec._websocket import WebSocket
        url = self.sb.terminal_url()
        self.assertTrue(url.startswith("ws://") and "/terminal?token=" in url, url)
        u = urlsplit(url)
        target = u.path + "?" + u.query + "&cmd=/bin/sh&cmd=-c&cmd=echo+signed-$((40%2B2))"
        with Terminal(WebSocket.connect("http://" + u.netloc, target, {}, 60)) as t:
            read_until(t, b"signed-42")

        async def run():
            async with libdsec.AsyncClient() as c:
                return await c.sandbox(self.sb.id).vnc_url()
        self.assertIn("/vnc?token=", asyncio.run(run()))

    def test_terminal_bad_size(self):
        with self.assertRaises(libdsec.InvalidArgumentError):
            self.sb.terminal(rows=0)
        with self.assertRaises(libdsec.InvalidArgumentError):
            self.sb.exec("true", tty=(100000, 80))
        with self.sb.terminal() as t:
            t.resize(100000, 5)
            with self.assertRaises(libdsec.InvalidArgumentError):
                t.read_all()

    def test_async_terminal(self):
        async def run():
            async with libdsec.AsyncClient() as c:
                sb = c.sandbox(self.sb.id)
                t = await sb.terminal("cat", rows=5, cols=6)
                await t.send(b"ping\n")
                buf = b""
                while b"ping\r\nping\r\n" not in buf:
                    buf += await asyncio.wait_for(t.recv(), 60)
                await t.resize(7, 8)
                await t.signal("INT")
                rest = await asyncio.wait_for(t.read_all(), 60)
                await t.close()
                return t.exit_code, rest
        code, _ = asyncio.run(run())
        self.assertEqual(code, 130)

    def test_logs_follow(self):
        p = self.sb.spawn("echo one; echo err >&2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; exit 2")
        other = libdsec.Client()  # any client of the tenant
        try:
            proc = other.sandbox(self.sb.id).process(p.id)
            seen = {"stdout": b"", "stderr": b""}
            for chunk in proc.logs(follow=True):
                self.assertEqual(chunk.offset, len(seen[chunk.stream]))
                seen[chunk.stream] += chunk.data
                if seen == {"stdout": b"one\n", "stderr": b"err\n"}:
                    self.sb.write_file("/tmp/go", b"")
            self.assertEqual(seen, {"stdout": b"one\ntwo\n", "stderr": b"err\n"})
            self.assertEqual(proc.info.result.exit_code, 2)
            rest = list(proc.logs(stream="stdout", offset=4))
            self.assertEqual([(c.offset, c.data) for c in rest], [(4, b"two\n")])
        finally:
            other.close()

    def test_async_logs(self):
        async def run():
            async with libdsec.AsyncClient() as c:
                sb = c.sandbox(self.sb.id)
                p = await sb.spawn("printf 'a\\n'; sleep 0.3; printf 'b\\n'")
                out = b""
                async for chunk in p.logs(follow=True):
                    out += chunk.data
                return out, p.info.result.exit_code
        self.assertEqual(asyncio.run(run()), (b"a\nb\n", 0))

    def test_port_url(self):
        import urllib.request
        self.sb.exec("mkdir -p /pw && echo port-page > /pw/index.html && httpd -p 8300 -h /pw", check=True)
        url = self.sb.port_url(8300, path="/index.html", ttl_seconds=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    self.assertEqual(r.read(), b"port-page\n")
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        async def run():
            async with libdsec.AsyncClient() as c:
                return await c.sandbox(self.sb.id).port_url(8300)
        self.assertIn("/ports/8300/?token=", asyncio.run(run()))


if __name__ == "__main__":
    unittest.main()
