"""libdsec's profile, node, tenant-quota and burst calls against a real dsec
server ($DSEC_URL with an admin $DSEC_API_KEY; internal/e2e/python_test.go
starts it with one node and the profile named in $DSEC_TEST_PROFILE)."""

import os
import sys
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import libdsec  # noqa: E402

BASE = os.environ.get("DSEC_TEST_BASE", "base:minimal")
SMALL = {"memory_mb": 64}


def skip_without_server(test: unittest.TestCase) -> None:
    if not os.environ.get("DSEC_URL") or not os.environ.get("DSEC_API_KEY"):
        test.skipTest("DSEC_URL and DSEC_API_KEY name no server")


class ProfilesTest(unittest.TestCase):
    def setUp(self):
        skip_without_server(self)
        self.client = libdsec.Client()
        self.addCleanup(self.client.close)

    def test_builtin_profile(self):
        swe = self.client.profiles()["swe"]
        self.assertIsInstance(swe, libdsec.Profile)
        self.assertEqual((swe.name, swe.phase), ("swe", "setup"))
        self.assertEqual(set(swe.phases), {"setup", "agent", "eval"})
        self.assertEqual(swe.phases["agent"]["network"]["mode"], "none")

    def test_server_profile_creates_sandboxes(self):
        name = os.environ.get("DSEC_TEST_PROFILE")
        if not name:
            self.skipTest("the server was started without a profile of the suite")
        profiles = self.client.profiles()
        self.assertIn(name, profiles)
        p = profiles[name]
        with self.client.create(base=BASE, resources=SMALL, profile=name) as sb:
            self.assertEqual(sb.info.phase, p.phase)
            other = next(ph for ph in p.phases if ph != p.phase)
            self.assertEqual(sb.set_phase(other).info.phase, other)


class NodeDrainTest(unittest.TestCase):
    def setUp(self):
        skip_without_server(self)
        # No retries: a create refused for want of a node must fail at once.
        self.client = libdsec.Client(retries=0)
        self.addCleanup(self.client.close)

    def test_node(self):
        nodes = self.client.nodes()
        self.assertTrue(nodes)
        n = self.client.node(nodes[0]["id"])
        self.assertEqual((n["id"], n["state"]), (nodes[0]["id"], "up"))
        self.assertIn("container", n["backends"])
        with self.assertRaises(libdsec.NotFoundError):
            self.client.node("no-such-node")
        with self.assertRaises(libdsec.NotFoundError):
            self.client.drain_node("no-such-node")

    def test_drained_node_keeps_its_sandboxes_and_takes_no_new_ones(self):
        nodes = [n for n in self.client.nodes() if n["state"] == "up"]
        if len(nodes) != 1:
            self.skipTest("wants a server with one node (the e2e server has one)")
        node = nodes[0]["id"]
        with self.client.create(base=BASE, resources=SMALL) as sb:
            self.addCleanup(self.client.undrain_node, node)  # also if an assertion fails
            self.assertEqual(self.client.drain_node(node)["state"], "draining")
            self.assertEqual(self.client.drain_node(node)["state"], "draining")  # twice is once
            self.assertEqual(self.client.node(node)["state"], "draining")
            with self.assertRaises(libdsec.ResourceExhaustedError) as cm:
                self.client.create(base=BASE, resources=SMALL).close()
            self.assertEqual(cm.exception.status, 429)
            self.assertEqual(sb.exec("echo still here").stdout, "still here\n")

            self.assertEqual(self.client.undrain_node(node)["state"], "up")
            with self.client.create(base=BASE, resources=SMALL) as again:
                self.assertEqual(again.info.node, node)

    def test_drain_needs_an_admin_key(self):
        admin = libdsec.Client()
        self.addCleanup(admin.close)
        tenant = admin.create_tenant("py-drain-" + uuid.uuid4().hex[:8])
        key = admin.create_key(tenant["id"])
        self.addCleanup(lambda: [admin.delete_key(k["id"]) for k in admin.keys(tenant["id"])])
        user = libdsec.Client(api_key=key)
        self.addCleanup(user.close)
        node = admin.nodes()[0]["id"]
        for call in (user.nodes, lambda: user.node(node), lambda: user.drain_node(node),
                     lambda: user.set_quota(tenant["id"], sandboxes=100)):
            with self.subTest(call=call):
                with self.assertRaises(libdsec.PermissionDeniedError):
                    call()
        self.assertEqual(admin.node(node)["state"], "up")


class QuotaTest(unittest.TestCase):
    def setUp(self):
        skip_without_server(self)
        self.admin = libdsec.Client()
        self.addCleanup(self.admin.close)
        self.tenant = self.admin.create_tenant("py-quota-" + uuid.uuid4().hex[:8])
        key = self.admin.create_key(self.tenant["id"])
        self.addCleanup(lambda: [self.admin.delete_key(k["id"]) for k in self.admin.keys(self.tenant["id"])])
        # No retries: a create over quota must fail at once.
        self.user = libdsec.Client(api_key=key, retries=0)
        self.addCleanup(self.user.close)

    def test_quota_set_then_exceeded(self):
        tid = self.tenant["id"]
        t = self.admin.set_quota(tid, sandboxes=1, memory_mb=512)
        self.assertEqual(t["quota"], {"sandboxes": 1, "memory_mb": 512})
        self.assertEqual(self.admin.tenant(tid)["quota"], t["quota"])
        with self.user.create(base=BASE, resources=SMALL) as sb:
            usage = self.admin.tenant(tid)["usage"]
            self.assertEqual((usage["sandboxes"], usage["memory_mb"]), (1, 64))
            with self.assertRaises(libdsec.ResourceExhaustedError) as cm:
                self.user.create(base=BASE, resources=SMALL).close()
            self.assertIn("quota", cm.exception.message)
            with self.user.create_batch(2, base=BASE, resources=SMALL) as batch:
                self.assertEqual((batch.created, batch.failed), (0, 2))
                self.assertIsInstance(batch.errors[0].error, libdsec.ResourceExhaustedError)

            # Lifting it (0 is unlimited) lets the tenant create again.
            self.assertNotIn("sandboxes", self.admin.set_quota(tid).get("quota") or {})
            with self.user.create(base=BASE, resources=SMALL) as second:
                self.assertEqual(second.exec("echo ok").stdout, "ok\n")
            self.assertEqual(sb.exec("echo first").stdout, "first\n")

    def test_bad_quota_is_typed(self):
        with self.assertRaises(libdsec.InvalidArgumentError):
            self.admin.set_quota(self.tenant["id"], sandboxes=-1)
        with self.assertRaises(libdsec.NotFoundError):
            self.admin.set_quota("tn-nope", sandboxes=1)
        with self.assertRaises(libdsec.NotFoundError):
            self.admin.tenant("tn-nope")


class BurstTest(unittest.TestCase):
    def setUp(self):
        skip_without_server(self)
        self.client = libdsec.Client()
        self.addCleanup(self.client.close)

    def test_burst_is_sent_and_kept(self):
        # A sandbox that may burst still goes to a regular node while the
        # cluster is below the burst threshold (the e2e server has no burst node).
        with self.client.create(base=BASE, resources=SMALL, burst=True) as sb:
            self.assertTrue(sb.info.burst)
            self.assertTrue(self.client.get(sb.id).info.burst)
            self.assertEqual(sb.exec("echo b").stdout, "b\n")
        with self.client.create(base=BASE, resources=SMALL) as sb:
            self.assertFalse(sb.info.burst)
        with self.client.create_batch(2, base=BASE, resources=SMALL, burst=True) as batch:
            self.assertEqual(batch.created, 2)
            self.assertTrue(all(self.client.get(s.id).info.burst for s in batch.sandboxes))


class AsyncAdminTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        skip_without_server(self)
        self.client = libdsec.AsyncClient(retries=0)

    async def asyncTearDown(self):
        await self.client.close()

    async def test_profiles_nodes_tenants_and_burst(self):
        self.assertEqual((await self.client.profiles())["swe"].phase, "setup")

        node = (await self.client.nodes())[0]["id"]
        self.assertEqual((await self.client.node(node))["id"], node)
        try:
            self.assertEqual((await self.client.drain_node(node))["state"], "draining")
            with self.assertRaises(libdsec.ResourceExhaustedError):
                await (await self.client.create(base=BASE, resources=SMALL)).close()
        finally:
            self.assertEqual((await self.client.undrain_node(node))["state"], "up")

        t = await self.client.create_tenant("py-aquota-" + uuid.uuid4().hex[:8])
        self.assertIn(t["id"], [x["id"] for x in await self.client.tenants()])
        key = await self.client.create_key(t["id"])
        self.assertEqual(len(await self.client.keys(t["id"])), 1)
        self.assertEqual((await self.client.set_quota(t["id"], sandboxes=1))["quota"], {"sandboxes": 1})
        self.assertEqual((await self.client.tenant(t["id"]))["quota"], {"sandboxes": 1})
        async with libdsec.AsyncClient(api_key=key, retries=0) as user:
            async with await user.create(base=BASE, resources=SMALL, burst=True) as sb:
                self.assertTrue(sb.info.burst)
                with self.assertRaises(libdsec.ResourceExhaustedError):
                    await (await user.create(base=BASE, resources=SMALL)).close()
        for k in await self.client.keys(t["id"]):
            await self.client.delete_key(k["id"])
        self.assertEqual(await self.client.keys(t["id"]), [])


if __name__ == "__main__":
    unittest.main()
