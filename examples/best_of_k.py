#!/usr/bin/env python3
"""Best-of-K on dsec: an agent works on a task for a few steps, then forks
its sandbox into K branches; each branch tries a different fix from the
same state, and the branch with the best reward wins.

The task runs on base:minimal (busybox), so the example needs nothing but
a dsec server: a tiny shell "project" with a buggy function and a test
script whose reward is the number of tests that pass.

Every step is keyed into a trajectory log. The fork carries the log along:
each branch has its own trajectory holding the shared prefix, so a trainer
that is preempted and replays a branch from the start gets the first three
steps from the log (replayed) and runs only the branch's own.

    DSEC_URL=... DSEC_API_KEY=... python3 examples/best_of_k.py
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import libdsec  # noqa: E402

# The project: max3 should print the largest of its three arguments.
PROJECT = r'''
max3() {
  m=$1
  [ "$2" -gt "$m" ] && m=$2
  echo $m
}
'''

# Each test prints PASS or FAIL; the reward is the number of PASS lines.
TESTS = r'''
. /task/max3.sh
t() { got=$(max3 $1 $2 $3); [ "$got" = "$4" ] && echo PASS || echo "FAIL max3 $1 $2 $3 = $got, want $4"; }
t 1 2 3 3
t 3 2 1 3
t 1 3 2 3
t -5 -2 -9 -2
t 7 7 7 7
'''

# The agent's first steps, shared by every branch.
PREFIX = [
    "mkdir -p /task && cat > /task/max3.sh <<'EOF'\n" + PROJECT + "EOF",
    "cat > /task/test.sh <<'EOF'\n" + TESTS + "EOF",
    "sh /task/test.sh; true",  # look at what fails
]

# The branches' candidate fixes (only one is right).
FIXES = [
    # forgets the third argument still
    "sed -i 's/\\[ \"\\$2\" -gt \"\\$m\" \\] \\&\\& m=\\$2/[ \"$2\" -ge \"$m\" ] \\&\\& m=$2/' /task/max3.sh",
    # handles the third argument: the right fix
    "sed -i 's/^  echo \\$m$/  [ \"$3\" -gt \"$m\" ] \\&\\& m=$3\\n  echo $m/' /task/max3.sh",
    # breaks it: always the first argument
    "sed -i 's/m=\\$2/true/' /task/max3.sh",
    # compares as strings
    "sed -i 's/^  echo \\$m$/  [ \"$3\" \\\\> \"$m\" ] \\&\\& m=$3\\n  echo $m/' /task/max3.sh",
]


def reward(sb: libdsec.Sandbox, traj: str, step: int) -> int:
    r = sb.exec("sh /task/test.sh", trajectory=(traj, step))
    return r.stdout.count("PASS")


def main() -> None:
    client = libdsec.Client()
    traj = "best-of-k-" + uuid.uuid4().hex[:8]
    parent = client.create(base="base:minimal", resources={"memory_mb": 64})
    branches: list[libdsec.Sandbox] = []
    try:
        for step, cmd in enumerate(PREFIX, 1):
            parent.exec(cmd, trajectory=(traj, step), check=True)
        print(f"prefix: {len(PREFIX)} steps in {parent.id}; reward now {reward(parent, traj, len(PREFIX) + 1)}")

        t0 = time.monotonic()
        branches = parent.fork(len(FIXES), labels={"example": "best-of-k"}, trajectory=traj)
        print(f"forked into {len(branches)} branches in {time.monotonic() - t0:.2f}s")

        def run_branch(i: int) -> tuple[int, int]:
            sb = branches[i]
            # A replay of the prefix in the branch answers from the log.
            assert sb.exec(PREFIX[0], trajectory=(sb.trajectory, 1)).replayed
            sb.exec(FIXES[i], trajectory=(sb.trajectory, len(PREFIX) + 1), check=True)
            return i, reward(sb, sb.trajectory, len(PREFIX) + 2)

        with ThreadPoolExecutor(len(branches)) as pool:
            results = sorted(pool.map(run_branch, range(len(branches))), key=lambda r: -r[1])
        for i, rw in results:
            print(f"  branch {i} ({branches[i].id}, trajectory {branches[i].trajectory}): reward {rw}/5")
        best, best_reward = results[0]
        print(f"best: branch {best} with reward {best_reward}/5")
        print(branches[best].read_text("/task/max3.sh"))
        # The parent never saw any branch's fix.
        assert parent.read_text("/task/max3.sh").count("$3") == 0
    finally:
        for sb in branches:
            sb.close()
        parent.close()
        client.delete_trajectory(traj)
        for sb in branches:
            if sb.trajectory:
                client.delete_trajectory(sb.trajectory)


if __name__ == "__main__":
    main()
