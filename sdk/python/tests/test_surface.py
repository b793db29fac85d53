"""The sync and async clients offer the same calls: every public method
of a sync class has an async twin with the same parameters (names, kinds
and defaults), and what the sync one yields the async one yields with
``async for``. No server needed."""

import inspect
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import libdsec  # noqa: E402

PAIRS = [
    (libdsec.Client, libdsec.AsyncClient),
    (libdsec.Sandbox, libdsec.AsyncSandbox),
    (libdsec.Process, libdsec.AsyncProcess),
    (libdsec.ExecStream, libdsec.AsyncExecStream),
    (libdsec.BatchResult, libdsec.AsyncBatchResult),
    (libdsec.Terminal, libdsec.AsyncTerminal),
]

# Sync protocol methods and their async counterparts, which differ by name.
PROTOCOL = {"__enter__": "__aenter__", "__exit__": "__aexit__", "__iter__": "__aiter__", "__next__": "__anext__"}


def public(cls):
    return {n for n in dir(cls) if not n.startswith("_")}


def params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


class SurfaceTest(unittest.TestCase):
    def test_same_public_names(self):
        for sync, aio in PAIRS:
            with self.subTest(sync.__name__):
                self.assertEqual(sorted(public(sync) - public(aio)), [], "only in " + sync.__name__)
                self.assertEqual(sorted(public(aio) - public(sync)), [], "only in " + aio.__name__)
                for s, a in PROTOCOL.items():
                    self.assertEqual(hasattr(sync, s), hasattr(aio, a), f"{s} / {a}")

    def test_same_parameters(self):
        for sync, aio in PAIRS:
            for name in sorted(public(sync) & public(aio)):
                s, a = inspect.getattr_static(sync, name), inspect.getattr_static(aio, name)
                if isinstance(s, property) or not callable(s):
                    self.assertEqual(isinstance(s, property), isinstance(a, property), f"{sync.__name__}.{name}")
                    continue
                with self.subTest(f"{sync.__name__}.{name}"):
                    self.assertEqual(params(getattr(sync, name)), params(getattr(aio, name)))

    def test_iterators_are_async_iterators(self):
        for sync, aio in PAIRS:
            for name in sorted(public(sync) & public(aio)):
                s = inspect.getattr_static(sync, name)
                if inspect.isgeneratorfunction(s):
                    with self.subTest(f"{sync.__name__}.{name}"):
                        self.assertTrue(inspect.isasyncgenfunction(inspect.getattr_static(aio, name)),
                                        f"{aio.__name__}.{name} is not an async iterator")

    def test_create_has_named_parameters(self):
        for cls in (libdsec.Client, libdsec.AsyncClient):
            ps = inspect.signature(cls.create).parameters
            for name in ("base", "workspace", "memory_mb", "labels", "timeout"):
                self.assertEqual(ps[name].kind, inspect.Parameter.KEYWORD_ONLY, f"{cls.__name__}.create({name})")
            self.assertFalse(any(p.kind == inspect.Parameter.VAR_KEYWORD for p in ps.values()),
                             f"{cls.__name__}.create takes **kwargs")

    def test_answers_are_dataclasses_that_read_as_dicts(self):
        n = libdsec.Node.from_json({"id": "n1", "state": "up", "future_field": 1})
        self.assertEqual((n.id, n.state, n["state"], n.get("future_field")), ("n1", "up", "up", 1))
        self.assertIn("state", n)
        log = libdsec.TrajectoryLog.from_json({"id": "t", "steps": [], "checkpoints": [{"step": 2}]})
        self.assertEqual(log.checkpoints[0].step, 2)
        self.assertEqual(log["checkpoints"], [{"step": 2}])


if __name__ == "__main__":
    unittest.main()
