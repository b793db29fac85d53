"""libdsec.AsyncClient against a real dsec server."""

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import libdsec  # noqa: E402

BASE = os.environ.get("DSEC_TEST_BASE", "base:minimal")
SMALL = {"memory_mb": 64}


class AsyncTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        if not os.environ.get("DSEC_URL") or not os.environ.get("DSEC_API_KEY"):
            self.skipTest("no server")
        self.client = libdsec.AsyncClient()

    async def asyncTearDown(self):
        await self.client.close()

    async def test_sandbox_flow(self):
        async with await self.client.create(base=BASE, resources=SMALL) as sb:
            r = await sb.exec(["sh", "-c", "cat; exit 3"], stdin=b"in")
            self.assertEqual((r.exit_code, r.stdout), (3, "in"))
            await sb.write_file("/w/f", "data")
            self.assertEqual(await sb.read_text("/w/f"), "data")
            self.assertEqual([f.name for f in await sb.list_dir("/w")], ["f"])
            out = b""
            async with await sb.exec_stream("echo a; sleep 0.05; echo b") as st:
                async for chunk in st:
                    out += chunk.data
            self.assertEqual((out, st.result.exit_code), (b"a\nb\n", 0))
            p = await sb.spawn("echo bg; exit 1")
            await p.wait(timeout=30)
            self.assertEqual((p.result.exit_code, (await p.output()).data), (1, b"bg\n"))
            q = await sb.spawn("echo 1; sleep 0.1; echo 2")
            self.assertEqual(b"".join([c async for c in q.follow()]), b"1\n2\n")
            await sb.reset()
            self.assertNotEqual((await sb.exec("cat /w/f")).exit_code, 0)
        with self.assertRaises(libdsec.NotFoundError):
            await sb.exec("true")

    async def test_fork(self):
        async with await self.client.create(base=BASE, resources=SMALL) as sb:
            await sb.write_file("/f", "x")
            (c,) = await sb.fork(1)
            try:
                self.assertEqual(await c.read_text("/f"), "x")
            finally:
                await c.close()

    async def test_build_layer_refuses_a_bad_dockerfile(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            df = os.path.join(d, "Dockerfile")
            with open(df, "w") as f:
                f.write("FROM base:minimal\nCOPY ../x /x\n")
            with self.assertRaises(libdsec.InvalidArgumentError) as cm:
                await self.client.build_layer(df, "py-bad:1")
            self.assertIn("outside the build context", str(cm.exception))

    async def test_renew_and_keepalive(self):
        async with await self.client.create(base=BASE, resources=SMALL, ttl_seconds=60) as sb:
            self.assertIsNotNone(sb._keepalive)  # async with renews while it runs
            before = sb.info.expires_at
            await sb.renew(3600)
            self.assertNotEqual(sb.info.expires_at, before)
        self.assertTrue(sb._keepalive.cancelled() or sb._keepalive.done())
        with self.assertRaises(libdsec.NotFoundError):
            await sb.renew()

    async def test_concurrent_execs_share_connections(self):
        sb = await self.client.create(base=BASE, resources=SMALL)
        try:
            results = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(20)))
            self.assertEqual([r.stdout for r in results], [f"{i}\n" for i in range(20)])
            self.assertLessEqual(len(self.client._pool._idle), 20)
            self.assertGreater(len(self.client._pool._idle), 0)
        finally:
            await sb.close()

    async def test_batch_and_fncall(self):
        seen = []
        async with await self.client.create_batch(4, base=BASE, resources=SMALL, progress=seen.append) as b:
            self.assertEqual((b.created, len(b.sandboxes)), (4, 4))
            self.assertEqual(seen[-1].done, 4)
            r = await b.sandboxes[0].exec("echo x")
            self.assertEqual(r.stdout, "x\n")
        r = await self.client.fncall("echo fn", base=BASE, resources=SMALL)
        self.assertEqual(r.stdout, "fn\n")

    async def test_bad_input(self):
        with self.assertRaises(libdsec.InvalidArgumentError) as cm:
            await self.client.create(base=BASE, backend="quantum")
        self.assertIn("unknown backend", cm.exception.message)
        with self.assertRaises(libdsec.InvalidArgumentError):
            await self.client.create_batch(40000, base=BASE)
        with self.assertRaises(libdsec.NotFoundError):
            await self.client.get("sb-nope")


if __name__ == "__main__":
    unittest.main()
