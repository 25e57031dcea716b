"""python -m pipeline.orchestration.idle --seconds S --state FILE --lock FILE --in-use FILE -- CMD...: run CMD (the
shared Prefect server), and stop it once nothing has used it for S seconds.

`pipeline.orchestration.flows.shared_server` starts the shared background server through this, in a session of its own
that this process leads: its PID is the one in `--state`, so `python -m pipeline server --stop` (SIGTERM to that
process group) stops both. In use means either of:

- a stage process is running on it: each holds a shared flock on `--in-use` from when it gets the URL until it
  exits (the kernel drops it however the process dies). Flow runs do not count: a stage killed by a signal
  leaves its flow run RUNNING for ever, which would keep the server up for ever;
- `--state` was modified in the last S seconds: each stage (and `python -m pipeline server --start`) that gets the
  URL touches it, so one that has the URL but has not yet started its flow run is not cut off.

Once neither holds for S seconds, it takes `--lock` (which `shared_server` holds while it reads the state file
and takes `--in-use`), checks again, removes the state file if it still names this process, writes one line to
its output (the server's log) and stops the session: SIGTERM, SIGKILL after `tether.GRACE` s. A stage that
comes afterwards starts a fresh server. S <= 0: it never stops for idleness. SIGTERM to this process stops the
session too. S comes from PIPELINE_SERVER_IDLE_SECONDS (`pipeline.orchestration.flows.shared_server`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.orchestration.tether import stop_session


def quiet(now: float, busy_at: float, touched_at: float | None, seconds: float) -> bool:
    """Whether the server has been idle long enough to stop: no stage seen on it since `busy_at`, its state file
    last modified at `touched_at` (None: no file), both more than `seconds` ago (times in seconds since the epoch)."""
    if seconds <= 0:
        return False
    return now - max(busy_at, touched_at or 0.0) >= seconds


def in_use(path: Path) -> bool:
    """Whether a stage process holds its shared flock on `path`."""
    with open(path, "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file, fcntl.LOCK_UN)
        return False


def modified(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with open(path, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield


def names_me(state: Path) -> bool:
    try:
        return json.loads(state.read_text())["pid"] == os.getpid()
    except (OSError, ValueError, KeyError):
        return False


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m pipeline.orchestration.idle")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--in-use", type=Path, required=True)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)  # our session and process group
    if args.seconds > 0:
        print(f"pipeline: this shared Prefect server stops after {args.seconds:g} s with no stage on it "
              "(PIPELINE_SERVER_IDLE_SECONDS)", flush=True)
    poll = min(5.0, max(0.5, args.seconds / 4))
    busy_at = time.time()  # starting counts as use
    while not stop.wait(poll):
        if child.poll() is not None:
            return child.returncode
        if in_use(args.in_use):
            busy_at = time.time()
        if not quiet(time.time(), busy_at, modified(args.state), args.seconds):
            continue
        with locked(args.lock):  # no stage can take the server while this is held
            if in_use(args.in_use):
                busy_at = time.time()
                continue
            if not quiet(time.time(), busy_at, modified(args.state), args.seconds):
                continue
            if names_me(args.state):
                args.state.unlink()
            print(f"pipeline: no stage on it for {args.seconds:g} s; stopping the shared Prefect server "
                  "(PIPELINE_SERVER_IDLE_SECONDS)", flush=True)
            stop_session(child)  # under the lock: the next stage starts its server once this one is gone
            return 0
    stop_session(child)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
