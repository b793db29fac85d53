"""libdsec against a real dsec server ($DSEC_URL, $DSEC_API_KEY): make test
starts one (internal/e2e/python_test.go)."""

import datetime
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import libdsec  # noqa: E402

BASE = os.environ.get("DSEC_TEST_BASE", "base:minimal")
SMALL = {"memory_mb": 64}


def ts(s: str) -> datetime.datetime:
    """An RFC 3339 time from the API (Python 3.9's fromisoformat takes no Z
    and at most six fractional digits)."""
    s = s.replace("Z", "+00:00")
    if "." in s:
        head, rest = s.split(".", 1)
        frac, tz = rest[:rest.index("+")], rest[rest.index("+"):]
        s = head + "." + (frac + "000000")[:6] + tz
    return datetime.datetime.fromisoformat(s)


def server_or_skip(test: unittest.TestCase) -> None:
    if not os.environ.get("DSEC_URL") or not os.environ.get("DSEC_API_KEY"):
        test.skipTest("DSEC_URL and DSEC_API_KEY name no server")


class SandboxTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.environ.get("DSEC_URL"):
            raise unittest.SkipTest("no server")
        cls.client = libdsec.Client()
        cls.sb = cls.client.create(base=BASE, resources=SMALL, labels={"suite": "py-sync"}, env={"SBENV": "s"})

    @classmethod
    def tearDownClass(cls):
        cls.sb.close()
        cls.client.close()

    def test_exec_shell_and_argv(self):
        r = self.sb.exec("echo hello; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (3, "hello\n", "err\n", False))
        r = self.sb.exec(["sh", "-c", 'pwd; echo "$A $SBENV"; cat'], env={"A": "a"}, cwd="/tmp", stdin=b"in")
        self.assertEqual(r.stdout, "/tmp\na s\nin")
        self.assertGreaterEqual(r.duration_ms, 0)
        self.assertFalse(r.replayed)

    def test_exec_check_and_timeout(self):
        with self.assertRaises(libdsec.ExecError) as cm:
            self.sb.exec("exit 5", check=True)
        self.assertEqual(cm.exception.result.exit_code, 5)
        r = self.sb.exec("sleep 10", timeout=0.3)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.signal, "SIGKILL")

    def test_binary_output_and_truncation(self):
        r = self.sb.exec(["sh", "-c", r"printf '\377\000\001'"])
        self.assertEqual(r.stdout_bytes, b"\xff\x00\x01")
        r = self.sb.exec("yes | head -c 100000", max_output_bytes=1000)
        self.assertTrue(r.truncated)
        self.assertEqual(len(r.stdout_bytes) + r.stdout_dropped, 100000)

    def test_stream(self):
        chunks = []
        with self.sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2; exit 2") as st:
            for c in st:
                chunks.append((c.stream, c.data))
        self.assertEqual(b"".join(d for s, d in chunks if s == "stdout"), b"1\n2\n3\n")
        self.assertIn(("stderr", b"e\n"), chunks)
        self.assertEqual(st.result.exit_code, 2)

    def test_files(self):
        self.sb.write_file("/work/deep/a.txt", "text")
        self.sb.write_file("/work/deep/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
        self.assertEqual(self.sb.read_text("/work/deep/a.txt"), "text")
        self.assertEqual(self.sb.exec("/work/deep/run.sh").stdout, "ran\n")
        names = {(f.name, f.type, f.mode) for f in self.sb.list_dir("/work/deep")}
        self.assertEqual(names, {("a.txt", "file", 0o644), ("run.sh", "file", 0o755)})
        self.sb.remove("/work/deep", recursive=True)
        with self.assertRaises(libdsec.NotFoundError):
            self.sb.read_file("/work/deep/a.txt")

    def test_background_process(self):
        p = self.sb.spawn("echo start; sleep 0.3; echo end; echo bad >&2; exit 4")
        self.assertTrue(p.id.startswith("p-"))
        p.wait(timeout=30)
        self.assertFalse(p.running)
        self.assertEqual(p.result.exit_code, 4)
        self.assertEqual(p.output().data, b"start\nend\n")
        self.assertEqual(p.output("stderr").data, b"bad\n")
        page = p.output(offset=6)
        self.assertEqual((page.data, page.offset, page.next_offset), (b"end\n", 6, 10))
        self.assertIn(p.id, [q.id for q in self.sb.processes()])
        p.forget()
        q = self.sb.spawn("for i in 1 2 3; do echo $i; sleep 0.1; done")
        self.assertEqual(b"".join(q.follow()), b"1\n2\n3\n")
        long = self.sb.spawn("sleep 100")
        long.kill()
        self.assertEqual(long.wait(timeout=30).result.signal, "SIGKILL")

    def test_list_get_refresh(self):
        ids = [s.id for s in self.client.list(labels={"suite": "py-sync"})]
        self.assertIn(self.sb.id, ids)
        got = self.client.get(self.sb.id)
        self.assertEqual((got.state, got.info.backend, got.info.labels["suite"]), ("running", "container", "py-sync"))
        self.assertEqual(self.sb.refresh().state, "running")

    def test_trajectory_key_is_sent(self):
        r = self.sb.exec("echo t", trajectory=("traj-py", 1))
        self.assertEqual(r.stdout, "t\n")
        r2 = self.sb.exec("echo t", trajectory=libdsec.Trajectory("traj-py", 1))
        self.assertEqual(r2.stdout, "t\n")  # replayed (a server with the log) or run again


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        server_or_skip(self)
        self.client = libdsec.Client()

    def tearDown(self):
        self.client.close()

    def test_reset_pause_resume_and_close(self):
        with self.client.create(base=BASE, resources=SMALL) as sb:
            sb.exec("echo x > /tmp/x", check=True)
            sb.reset()
            self.assertNotEqual(sb.exec("cat /tmp/x").exit_code, 0)
            with self.assertRaises(libdsec.InvalidArgumentError) as cm:
                sb.pause(memory="disk")  # only microVMs hibernate
            self.assertIn("microVM", cm.exception.message)
            self.assertEqual(sb.pause().state, "paused")
            with self.assertRaises(libdsec.FailedPreconditionError) as cm:
                sb.exec("true")
            self.assertIn("paused", cm.exception.message)
            self.assertEqual(sb.resume().state, "running")
        # Leaving the with block destroyed it: calls on it are typed errors.
        with self.assertRaises(libdsec.NotFoundError) as cm:
            sb.exec("true")
        self.assertIn(sb.id, cm.exception.message)
        self.assertEqual(self.client.get(sb.id).state, "deleted")
        sb.close()  # idempotent

    def test_renew_and_keepalive(self):
        sb = self.client.create(base=BASE, resources=SMALL, ttl_seconds=60, idle_timeout_seconds=600)
        try:
            self.assertEqual(sb.info.raw.get("idle_timeout_seconds"), 600)
            before = ts(sb.info.expires_at)
            sb.renew(3600)
            self.assertGreater(ts(sb.info.expires_at), before)
            first = ts(sb.renew(3).info.expires_at)
            ka = sb.keepalive(ttl_seconds=3)  # renews every second
            for _ in range(50):
                threading.Event().wait(0.1)
                if ts(sb.refresh().info.expires_at) > first:
                    break
            ka.stop()
            self.assertGreater(ts(sb.info.expires_at), first, "keepalive did not renew")
            self.assertIsNone(ka.error)
        finally:
            sb.close()
        with self.assertRaises(libdsec.NotFoundError):
            sb.renew()

    def test_snapshot_and_phase_follow_the_contract(self):
        with self.client.create(base=BASE, resources=SMALL) as sb:
            try:
                ref = sb.snapshot()
                self.assertIsInstance(ref, str)
            except libdsec.ApiError as e:  # a server without pack_diff
                self.assertTrue(400 <= e.status < 500, e)
                self.assertIsInstance(e, (libdsec.NotFoundError, libdsec.InvalidArgumentError,
                                          libdsec.FailedPreconditionError))
                self.assertTrue(e.message)
            try:
                sb.set_phase("agent")
            except libdsec.ApiError as e:  # a server without phases
                self.assertTrue(400 <= e.status < 500, e)
                self.assertTrue(e.message)
        try:
            self.client.create(base=BASE, resources=SMALL, phase="agent").close()
        except libdsec.InvalidArgumentError as e:
            self.assertIn("phase", e.message)

    def test_fork(self):
        with self.client.create(base=BASE, resources=SMALL) as sb:
            sb.exec("echo s1 > /f", trajectory=("traj-fork-py", 1), check=True)
            copies = sb.fork(2, labels={"py": "fork"}, trajectory="traj-fork-py")
            try:
                self.assertEqual(len(copies), 2)
                for i, c in enumerate(copies):
                    self.assertEqual(c.info.labels.get("dsec.fork-of"), sb.id)
                    self.assertEqual(c.read_text("/f"), "s1\n")
                    self.assertTrue(c.exec("echo s1 > /f", trajectory=(c.trajectory, 1)).replayed)
                    c.write_file("/mine", str(i))
                self.assertEqual([c.read_text("/mine") for c in copies], ["0", "1"])
                with self.assertRaises(libdsec.InvalidArgumentError):
                    sb.fork(0)
            finally:
                for c in copies:
                    c.close()

    def test_build_layer(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "msg"), "w") as f:
                f.write("ctx\n")
            df = os.path.join(d, "Dockerfile")
            with open(df, "w") as f:
                f.write("FROM base:minimal\nENV PY_BUILD=1\nWORKDIR /w\nCOPY msg ./\nRUN cat msg > copied\n")
            events = []
            res = self.client.build_layer(df, "py-built:1", on_event=events.append)
            self.assertEqual((res["steps"], res["layer"]["kind"]), (4, "snapshot"))
            self.assertTrue(any("step" in e for e in events))
            with self.client.create(snapshot="py-built:1", resources=SMALL) as sb:
                self.assertEqual(sb.exec("pwd; echo $PY_BUILD; cat copied", check=True).stdout, "/w\n1\nctx\n")
            with open(df, "w") as f:
                f.write("FROM base:minimal\nRUN echo no; exit 4\n")
            with self.assertRaises(libdsec.ApiError) as cm:
                self.client.build_layer(df, "py-built:2")
            self.assertEqual(cm.exception.line, 2)
            self.assertIn("no", cm.exception.output)
            with open(df, "w") as f:
                f.write("FROM base:minimal\nFROB x\n")
            with self.assertRaises(libdsec.InvalidArgumentError):
                self.client.build_layer(df, "py-built:3")

    def test_trajectory_checkpoint_and_restore(self):
        tid = "py-ckpt/%d" % os.getpid()
        sb = self.client.create(base=BASE, resources=SMALL)
        try:
            for step in (1, 2):
                key = libdsec.Trajectory(tid, step, checkpoint_every=2) if step == 1 else (tid, step)
                self.assertFalse(sb.exec("echo %d >> /log" % step, trajectory=key, check=True).replayed)
            for _ in range(600):  # the checkpoint is taken after the answer
                log = self.client.trajectory(tid)
                if log.get("checkpoints"):
                    break
                threading.Event().wait(0.05)
            self.assertEqual(log["checkpoint_every"], 2)
            self.assertEqual([c["step"] for c in log["checkpoints"]], [2])
        finally:
            sb.close()
        restored = self.client.restore_trajectory(tid)
        try:
            self.assertEqual(restored.checkpoint["step"], 2)
            for step in (1, 2):
                self.assertTrue(restored.exec("echo %d >> /log" % step, trajectory=(tid, step)).replayed)
            r = restored.exec("echo 3 >> /log; cat /log", trajectory=(tid, 3))
            self.assertEqual((r.replayed, r.stdout), (False, "1\n2\n3\n"))
        finally:
            restored.close()
        self.client.delete_trajectory(tid)
        with self.assertRaises(libdsec.NotFoundError):
            self.client.trajectory(tid)
        with self.assertRaises(libdsec.NotFoundError):
            self.client.restore_trajectory(tid)

    def test_bad_input_is_typed(self):
        cases = [
            (lambda: self.client.create(base=BASE, backend="quantum"), libdsec.InvalidArgumentError, "unknown backend"),
            (lambda: self.client.create(base="nope:1"), libdsec.NotFoundError, "nope:1"),
            (lambda: self.client.create(base=BASE, memory_mb=1), libdsec.InvalidArgumentError, "memory_mb"),
            (lambda: self.client.create_batch(40000, base=BASE), libdsec.InvalidArgumentError, "32768"),
            (lambda: self.client.create_batch(0, base=BASE), libdsec.InvalidArgumentError, "count"),
            (lambda: self.client.get("sb-nope"), libdsec.NotFoundError, "sb-nope"),
            (lambda: self.client.sandbox("sb-nope").exec("true"), libdsec.NotFoundError, "sb-nope"),
            (lambda: self.client.fncall("true", base="nope:1"), libdsec.NotFoundError, "nope:1"),
            (lambda: self.client.layer("nope:1"), libdsec.NotFoundError, "nope"),
            (lambda: libdsec.Client(api_key="dsec_bad").layers(), libdsec.UnauthenticatedError, ""),
        ]
        for i, (fn, cls, text) in enumerate(cases):
            with self.subTest(i=i, want=cls.__name__):
                with self.assertRaises(cls) as cm:
                    fn()
                self.assertIn(text, cm.exception.message)
                self.assertEqual(cm.exception.status // 100, 4)

    def test_layers(self):
        refs = [l.ref for l in self.client.layers()]
        self.assertIn("base:minimal", refs)
        self.assertEqual(self.client.layer("base:minimal").kind, "base")


class BatchTest(unittest.TestCase):
    def setUp(self):
        server_or_skip(self)
        self.client = libdsec.Client()

    def tearDown(self):
        self.client.close()

    def test_batch_with_progress(self):
        seen = []
        with self.client.create_batch(6, base=BASE, resources=SMALL, labels={"suite": "py-batch"},
                                      progress=seen.append) as batch:
            self.assertEqual((batch.requested, batch.created, batch.failed, len(batch.sandboxes)), (6, 6, 0, 6))
            self.assertTrue(seen and seen[-1].created == 6 and seen[-1].total == 6)
            listed = {s.id for s in self.client.list(labels={"dsec.batch": batch.batch})}
            self.assertEqual(listed, {s.id for s in batch.sandboxes})
            self.assertEqual(batch.sandboxes[3].exec("echo ok").stdout, "ok\n")
        self.assertEqual(list(self.client.list(labels={"suite": "py-batch"})), [])

    def test_partial_batch(self):
        node = self.client.nodes()[0]
        free = node["capacity"]["memory_mb"] - node["allocated"].get("memory_mb", 0)
        with self.client.create_batch(3, base=BASE, memory_mb=free // 2 + 1) as batch:
            self.assertEqual((batch.created, batch.failed), (1, 2))
            self.assertIsInstance(batch.errors[0].error, libdsec.ResourceExhaustedError)


class FnCallTest(unittest.TestCase):
    def setUp(self):
        server_or_skip(self)
        self.client = libdsec.Client()

    def tearDown(self):
        self.client.close()

    def test_calls(self):
        r = self.client.fncall(["sh", "-c", "cat; echo $K"], base=BASE, resources=SMALL, stdin="x", env={"K": "k"})
        self.assertEqual((r.exit_code, r.stdout), (0, "xk\n"))
        for _ in range(3):
            r = self.client.fncall("test -e /tmp/m && echo dirty; touch /tmp/m", base=BASE, resources=SMALL)
            self.assertNotIn("dirty", r.stdout)
        with self.assertRaises(libdsec.ExecError):
            self.client.fncall("exit 9", base=BASE, resources=SMALL, check=True)
        pools = self.client.pools()
        self.assertTrue(any(p.layers.get("base") == BASE and p.calls >= 5 for p in pools), pools)

    def test_backend_fncall_create(self):
        self.client.warm_pool(1, base=BASE, resources=SMALL)
        with self.client.create(base=BASE, resources=SMALL, backend="fncall") as sb:
            self.assertEqual(sb.info.backend, "fncall")
            self.assertEqual(sb.exec("echo warm").stdout, "warm\n")


class ConnectionReuseTest(unittest.TestCase):
    def test_keep_alive_and_threads(self):
        server_or_skip(self)
        client = libdsec.Client()
        made = []
        orig = client._pool._new

        def counting():
            made.append(1)
            return orig()

        client._pool._new = counting
        sb = client.create(base=BASE, resources=SMALL)
        try:
            for _ in range(30):
                self.assertEqual(sb.exec("true").exit_code, 0)
            self.assertEqual(len(made), 1, "sequential calls should share one keep-alive connection")
            errors = []

            def worker():
                try:
                    for _ in range(10):
                        sb.exec("true", check=True)
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertLessEqual(len(made), 9)
        finally:
            sb.close()
            client.close()


if __name__ == "__main__":
    unittest.main()
