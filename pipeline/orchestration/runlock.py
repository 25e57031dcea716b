"""One `python -m pipeline repro` (or scheduled repro flow) at a time in a repository.

The lock is an advisory `flock` on `.dvc/tmp/pipeline-repro.lock`: the kernel drops it when its holder
exits, however it exits, so a killed run never leaves the repository locked. The file holds the holder's
PID (and its Prefect server, once started) for the message a second run prints. Holding is re-entrant
within one process: the CLI takes it before rewriting params.yaml, and the repro flow it then runs takes it
again (a deployment's run only takes the latter).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.processes import running

LOCK_FILE = Path(".dvc/tmp/pipeline-repro.lock")
POLL = 0.5  # seconds between tries while waiting

_held: dict[str, object] = {}  # this process's lock: {"file": open file, "depth": int, "record": dict}


class AlreadyRunning(Exception):
    """Another run holds the lock; the message names its PID."""


def holder(path: Path = LOCK_FILE) -> dict:
    """What the lock file says about the run that holds it ({} when unreadable or empty)."""
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def hold(timeout: float, path: Path = LOCK_FILE) -> Iterator[None]:
    """Hold the repository's run lock, waiting up to `timeout` seconds (0: not at all) for another run."""
    if _held:
        _held["depth"] += 1  # type: ignore[operator]
        try:
            yield
        finally:
            _held["depth"] -= 1  # type: ignore[operator]
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                fh.close()
                other = holder(path).get("pid", "unknown")
                waited = f" (waited {timeout:g} s; repro.lock_timeout)" if timeout else ""
                raise AlreadyRunning(f"the pipeline is already running in {Path.cwd()} (PID {other}){waited}; "
                                     "wait for it to finish or stop it") from None
            time.sleep(POLL)
    _held.update(file=fh, depth=1, record={"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    _write()
    try:
        yield
    finally:
        fh.truncate(0)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()
        _held.clear()


def annotate(**fields: object) -> None:
    """Add `fields` to the held lock's record (nothing when this process holds no lock)."""
    if _held:
        _held["record"].update(fields)  # type: ignore[union-attr]
        _write()


def _write() -> None:
    fh = _held["file"]
    fh.seek(0)  # type: ignore[union-attr]
    fh.truncate(0)  # type: ignore[union-attr]
    fh.write(json.dumps(_held["record"]))  # type: ignore[union-attr]
    fh.flush()  # type: ignore[union-attr]


def release_dead_dvc_locks(tmp: Path = Path(".dvc/tmp")) -> list[int]:
    """Drop the entries of dead processes from DVC's `rwlock` file, and the file when a killed dvc left it empty;
    the PIDs dropped.

    DVC removes an entry itself only when its PID does not exist, and a killed `dvc repro` whose parent died
    too can linger as a zombie until init reaps it, which DVC counts as running: the next `dvc` then refuses
    with "is busy". Edited under DVC's own guard file, so a `dvc` running beside us is not disturbed.
    """
    from dvc.lock import make_lock

    path = tmp / "rwlock"
    if not path.exists():
        return []
    with make_lock(str(tmp / "rwlock.lock"), tmp_dir=str(tmp)):
        text = path.read_text()
        if not text.strip():
            # DVC rewrites this file in place (opened "w", then json.dump): a dvc killed between the two (Ctrl-C
            # reaches it with the run) leaves it empty, and every later dvc refuses it as corrupted. Under the guard
            # no edit is under way, and DVC reads a missing file as no locks held.
            path.unlink()
            return []
        try:
            data = json.loads(text)
        except ValueError:
            return []  # DVC names a corrupted file itself
        dropped: set[int] = set()

        def alive(info: dict) -> bool:
            pid = int(info.get("pid", 0))
            if running(pid):
                return True
            dropped.add(pid)
            return False

        data["write"] = {p: info for p, info in data.get("write", {}).items() if alive(info)}
        data["read"] = {p: kept for p, infos in data.get("read", {}).items()
                        if (kept := [i for i in infos if alive(i)])}
        if dropped:
            path.write_text(json.dumps(data))
    return sorted(dropped)


# atomic_dir's and atomic_write_text's temporaries: `.<name>.tmp-<pid>-<random>`, `.<name>.old-<pid>`,
# `.<name>.<pid>-<random>`
_TEMPORARY = re.compile(r"^\..+?\.(?:tmp-|old-)?(\d+)(?:-[^/]*)?$")


def remove_dead_temporaries(roots: tuple[str, ...] = ("data", "models", "plots", "metrics"),
                            depth: int = 3) -> list[Path]:
    """Remove the temporary files and folders that killed stages left beside their outputs, and the `.live` links
    to them; the paths removed.

    A stage that runs again cleans its own (`pipeline.core.io.atomic_dir`), but DVC may restore a killed stage's
    outputs from its run-cache instead of running it, so the run sweeps them too. Only those whose process is
    gone (or a zombie) go; a stage writing beside this run keeps its own.
    """
    import shutil

    removed, links = [], []
    folders = [Path(r) for r in roots if Path(r).is_dir()]
    for _ in range(depth):
        deeper = []
        for folder in folders:
            for path in folder.iterdir():
                if path.is_symlink():
                    links.append(path)
                    continue
                match = _TEMPORARY.match(path.name) if path.name.startswith(".") else None
                if match is None:
                    if path.is_dir() and not path.name.startswith("."):
                        deeper.append(path)
                    continue
                if running(int(match.group(1))):
                    continue
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
                removed.append(path)
        folders = deeper
    for link in links:  # a `.live` link (io.live_atomic_dir) whose stage's folder is gone points nowhere
        if link.name.endswith(".live") and not link.exists():
            link.unlink(missing_ok=True)
            removed.append(link)
    return removed
