#!/usr/bin/env python3
"""A scripted computer-use agent on a full VM's screen, or a container's.

It boots a fullvm sandbox from a vm layer (default vm:debian-12, the small
image of `dsec layer build --vm`, whose screen is a text console with root
logged in; `desktop:debian-12` of `make desktop-image` shows a desktop with a
terminal), or with --container a container sandbox with a desktop toolkit
(default desktop:toolkit, from examples/build_desktop_toolkit.sh: Xvfb and a
terminal), takes a screenshot, types a command that writes a file, takes
another screenshot, and scores the episode by reading the file through exec.

    DSEC_URL=http://127.0.0.1:7070 DSEC_API_KEY=... python3 examples/computer_use.py [vm-layer]
    DSEC_URL=... DSEC_API_KEY=... python3 examples/computer_use.py --container [toolkit]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sdk", "python"))

from libdsec import Client  # noqa: E402


def main() -> int:
    args = sys.argv[1:]
    client = Client()
    if args[:1] == ["--container"]:
        toolkit = args[1] if len(args) > 1 else "desktop:toolkit"
        sb = client.create(base="base:minimal", toolkit=toolkit, memory_mb=256, timeout=120)
    else:
        image = args[0] if args else "vm:debian-12"
        sb = client.create(backend="fullvm", base=image, memory_mb=1024, timeout=900)
    with sb:
        print("booted", sb.id)
        for _ in range(60):  # a container's X server starts with it
            try:
                before = sb.screenshot()
                break
            except Exception:  # 400: no screen yet
                time.sleep(0.5)
        else:
            print("no screen")
            return 1
        open("before.png", "wb").write(before)
        sb.click(200, 200)  # focus the terminal (a desktop's or the toolkit's)
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
