"""python -m pipeline.orchestration.tether -- CMD...: run CMD, and stop it when the process that started us dies.

`python -m pipeline repro` starts its Prefect server through this, in a session of its own (so a Ctrl-C
in the terminal reaches the run first, which then stops the server in order). The starter holds the
write end of our stdin and never writes: when it exits for any reason, SIGKILL included, stdin reaches
end-of-file and the whole session (the server and what it started) gets SIGTERM, then SIGKILL after
`GRACE` seconds. SIGTERM to this process does the same, which is how the starter stops it normally.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

GRACE = 15.0  # seconds the server gets to shut down before SIGKILL


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m pipeline.orchestration.tether -- CMD...", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the starter decides when the server stops
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)  # our session and process group

    def starter_gone() -> None:
        while sys.stdin.buffer.read(1 << 12):
            pass
        stop.set()

    threading.Thread(target=starter_gone, daemon=True).start()
    while not stop.wait(0.5):
        if child.poll() is not None:
            return child.returncode
    stop_session(child)
    return 0


def stop_session(child: subprocess.Popen) -> None:
    """SIGTERM to this process's whole group (`child`, the server, and what it started), SIGKILL after `GRACE` s
    if `child` has not exited (this process, in the same group, dies with it then)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    try:
        child.wait(GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(os.getpgrp(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
