#!/usr/bin/env python3
"""A scripted computer-use agent on a full VM's screen.

It boots a fullvm sandbox from a vm layer (default vm:debian-12, the small
image of `dsec layer build --vm`, whose screen is a text console with root
logged in; `desktop:debian-12` shows a desktop where ctrl+alt+t opens a
terminal), takes a screenshot, types a command that writes a file, takes
another screenshot, and scores the episode by reading the file through exec.

    DSEC_URL=http://127.0.0.1:7070 DSEC_API_KEY=... python3 examples/computer_use.py [vm-layer]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sdk", "python"))

from libdsec import Client  # noqa: E402


def main() -> int:
    image = sys.argv[1] if len(sys.argv) > 1 else "vm:debian-12"
    client = Client()
    with client.create(backend="fullvm", base=image, memory_mb=1024, timeout=900) as sb:
        print("booted", sb.id)
        before = sb.screenshot()
        open("before.png", "wb").write(before)
        if image.startswith("desktop"):
            sb.key("ctrl+alt+t")  # open a terminal
            sb.input([{"type": "wait", "ms": 3000}])
        score = 0.0
        for _ in range(10):  # the console's shell may still be starting
            sb.type("echo typed > /tmp/t\n")
            if sb.exec("cat /tmp/t 2>/dev/null || true").stdout == "typed\n":
                score = 1.0
                break
            time.sleep(2)
        after = sb.screenshot()
        open("after.png", "wb").write(after)
        print("screen changed:", before != after, "score:", score)
        return 0 if score == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
