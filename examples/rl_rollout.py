#!/usr/bin/env python3
"""An RL rollout on dsec: N parallel episodes of a scripted "agent" fixing a
buggy Python project, scored by its tests.

Each sandbox stacks three layers: a base with Python (examples/
build_debian_base.sh makes debian:12), a workspace layer with the buggy
project and its tests, and a toolkit layer with the harness that runs the
tests and prints the reward. An episode is several exec turns: look around,
read the code, run the tests, apply a fix, run the harness for the reward.

Two ways to run the episodes are timed, with the same agent and the same
parallelism:

  reset    create the sandboxes once (one batch call), then after each
           episode reset the sandbox in place for the next one;
  create   create a fresh sandbox for every episode and destroy it after.

    DSEC_URL=... DSEC_API_KEY=... python3 examples/rl_rollout.py --parallel 32 --episodes 4
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import libdsec  # noqa: E402

# The workspace: a small project with two bugs, and its tests.
OPS_PY = '''\
"""Small numeric helpers."""


def add(a, b):
    return a - b


def mean(xs):
    if not xs:
        raise ValueError("mean of nothing")
    return sum(xs) / (len(xs) + 1)


def clamp(x, lo, hi):
    return max(lo, min(x, hi))
'''

TEST_OPS_PY = '''\
import unittest

from calc.ops import add, clamp, mean


class OpsTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_negative(self):
        self.assertEqual(add(-2, -3), -5)

    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_mean_empty(self):
        with self.assertRaises(ValueError):
            mean([])

    def test_clamp(self):
        self.assertEqual(clamp(5, 0, 3), 3)
        self.assertEqual(clamp(-1, 0, 3), 0)
'''

# The toolkit: the harness that scores an episode.
HARNESS_PY = '''\
"""Runs the workspace's tests and prints the reward as JSON."""
import json
import sys
import unittest

sys.path.insert(0, "/work")
suite = unittest.defaultTestLoader.discover("/work/tests", top_level_dir="/work")
result = unittest.TextTestRunner(stream=open("/dev/null", "w"), verbosity=0).run(suite)
total = result.testsRun
failed = len(result.failures) + len(result.errors)
print(json.dumps({"tests": total, "passed": total - failed, "reward": (total - failed) / max(1, total)}))
'''

FIXES = [("return a - b", "return a + b"), ("/ (len(xs) + 1)", "/ len(xs)")]


def tar_of(files: Dict[str, Tuple[str, int]]) -> bytes:
    """A tar stream of {path: (content, mode)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        dirs = set()
        for path in files:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(ti)
        for path, (content, mode) in sorted(files.items()):
            data = content.encode()
            ti = tarfile.TarInfo(path)
            ti.size, ti.mode = len(data), mode
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def upload_layers(client: libdsec.Client, tag: str) -> Tuple[str, str]:
    ws = client.upload_layer(f"rl-demo/calc:{tag}", tar_of({
        "work/calc/__init__.py": ("", 0o644),
        "work/calc/ops.py": (OPS_PY, 0o644),
        "work/tests/__init__.py": ("", 0o644),
        "work/tests/test_ops.py": (TEST_OPS_PY, 0o644),
    }), kind="workspace")
    tk = client.upload_layer(f"rl-demo/harness:{tag}", tar_of({
        "opt/harness/score.py": (HARNESS_PY, 0o755),
    }), kind="toolkit")
    return ws.ref, tk.ref


def episode(sb: libdsec.Sandbox, rng: random.Random) -> float:
    """One episode of the scripted agent; returns the reward."""
    # Turn 1: look around.
    sb.exec("ls -R /work", check=True)
    # Turn 2: read the code.
    src = sb.read_text("/work/calc/ops.py")
    # Turn 3: run the tests to see what fails.
    sb.exec(["python3", "-m", "unittest", "-q"], cwd="/work", timeout=60)
    # Turn 4: apply a fix. Like a policy in training, it does not always
    # find every bug.
    for bad, good in FIXES:
        if bad in src and rng.random() < 0.8:
            src = src.replace(bad, good)
    sb.write_file("/work/calc/ops.py", src)
    # Turn 5: check the change is in place, then score it.
    sb.exec("python3 -c 'import sys; sys.path.insert(0, \"/work\"); import calc.ops'", check=True)
    r = sb.exec(["python3", "/opt/harness/score.py"], timeout=60, check=True)
    return float(json.loads(r.stdout)["reward"])


def run_reset(client: libdsec.Client, spec: dict, parallel: int, episodes: int) -> Tuple[float, List[float], int]:
    """Sandboxes made once in one batch, reset between episodes."""
    batch = client.create_batch(parallel, progress=True, **spec)
    if batch.failed:
        batch.close_all()
        raise SystemExit(f"batch create: {batch.failed} failed: {batch.errors[0].error}")
    boxes = batch.sandboxes
    rewards: List[float] = []
    failed = [0]
    lock = threading.Lock()

    def worker(i: int) -> None:
        rng = random.Random(i)
        for _ in range(episodes):
            try:
                r = episode(boxes[i], rng)
                with lock:
                    rewards.append(r)
            except libdsec.DsecError as e:
                # A trainer loses the episode, not the run.
                print(f"episode failed: {e}", file=sys.stderr)
                with lock:
                    failed[0] += 1
            try:
                boxes[i].reset()
            except libdsec.DsecError:
                boxes[i].close()
                boxes[i] = client.create(**spec)

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(parallel) as ex:
            list(ex.map(worker, range(parallel)))
        wall = time.monotonic() - start
    finally:
        for sb in boxes:
            sb.close()
    return wall, rewards, failed[0]


def run_create(client: libdsec.Client, spec: dict, parallel: int, episodes: int) -> Tuple[float, List[float], int]:
    """A fresh sandbox per episode, destroyed after it."""
    rewards: List[float] = []
    failed = [0]
    lock = threading.Lock()

    def worker(i: int) -> None:
        rng = random.Random(i)
        for _ in range(episodes):
            try:
                with client.create(**spec) as sb:
                    r = episode(sb, rng)
                with lock:
                    rewards.append(r)
            except libdsec.DsecError as e:
                print(f"episode failed: {e}", file=sys.stderr)
                with lock:
                    failed[0] += 1

    start = time.monotonic()
    with ThreadPoolExecutor(parallel) as ex:
        list(ex.map(worker, range(parallel)))
    return time.monotonic() - start, rewards, failed[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="debian:12", help="base layer with python3 (examples/build_debian_base.sh)")
    ap.add_argument("--parallel", type=int, default=32, help="episodes running at once")
    ap.add_argument("--episodes", type=int, default=3, help="episodes per parallel worker")
    ap.add_argument("--memory", type=int, default=256, help="memory_mb of each sandbox")
    ap.add_argument("--mode", choices=["both", "reset", "create"], default="both")
    ap.add_argument("--tag", default="v1", help="tag of the demo layers")
    args = ap.parse_args()

    client = libdsec.Client(timeout=120)
    ws, tk = upload_layers(client, args.tag)
    spec = dict(layers={"base": args.base, "workspace": ws, "toolkit": tk},
                resources={"cpu": 0.5, "memory_mb": args.memory}, labels={"example": "rl_rollout"})
    print(f"rl_rollout: {args.parallel} parallel x {args.episodes} episodes, layers {spec['layers']}")
    rates = {}
    for mode, fn in (("reset", run_reset), ("create", run_create)):
        if args.mode not in ("both", mode):
            continue
        wall, rewards, failed = fn(client, spec, args.parallel, args.episodes)
        rates[mode] = len(rewards) / wall * 60
        print(f"  {mode:6s}: {len(rewards)} episodes in {wall:6.1f}s = {rates[mode]:7.1f} episodes/min, "
              f"mean reward {statistics.mean(rewards) if rewards else 0:.2f}, {failed} failed")
    if len(rates) == 2:
        print(f"  reset vs create/destroy: {rates['reset'] / rates['create']:.2f}x episodes/min")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
