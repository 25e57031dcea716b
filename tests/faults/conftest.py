"""Fixtures of the fault suite: a tiny project in a temporary git repository, runs killed on purpose."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import copy_project, venv_env, write_params


def sh(args: list[str], cwd: Path, check: bool = True, timeout: float = 900, environ: dict[str, str] | None = None,
       **env: str) -> subprocess.CompletedProcess:
    """Run `args` in `cwd` with the venv first on PATH and `env` added (or exactly `environ`)."""
    proc = subprocess.run(args, cwd=cwd, env=environ if environ is not None else venv_env(**env), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def make_repo(folder: Path, params: dict | None = None) -> Path:
    copy_project(folder)
    write_params(folder, **({"params": params} if params else {}))
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.com"],
                ["git", "config", "user.name", "ci"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        sh(cmd, folder)
    return folder


@pytest.fixture(scope="session")
def repo(tmp_path_factory, prefect_api):
    """One tiny project for the whole fault suite: each test makes the state it needs (a stage stale or built)
    and leaves every stage it ran complete, so the suite pays for the copy and for synthesize once."""
    return make_repo(tmp_path_factory.mktemp("faults"))


def own_server_env(home: Path) -> dict[str, str]:
    """The environment of a `python -m pipeline repro` that starts (and must stop) its own Prefect server."""
    env = venv_env(PREFECT_HOME=str(home))
    env.pop("PREFECT_API_URL", None)
    return env


def start(args: list[str], cwd: Path, env: dict[str, str], log: Path | None = None) -> subprocess.Popen:
    """A run in a session of its own: the fault hook's SIGKILL of its process group spares pytest. Its output
    goes to a pipe (read it with communicate) or, for a run left alone a while, to `log`."""
    out = open(log, "w") if log is not None else subprocess.PIPE
    # A suite started in the background (`make test &`) ignores SIGINT, and a run that starts with it ignored
    # keeps ignoring it, as a shell's background job should: the run here starts as a terminal's would, with
    # SIGINT at its default.
    try:
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    finally:
        if log is not None:
            out.close()


def live_processes(pgid: int | None = None, sid: int | None = None) -> list[int]:
    """PIDs (not zombies) in process group `pgid` or session `sid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # state ppid pgrp session ...
        if fields[0] == "Z":
            continue
        if (pgid is not None and int(fields[2]) == pgid) or (sid is not None and int(fields[3]) == sid):
            found.append(int(stat.parent.name))
    return found


def wait_gone(pids_of, timeout: float = 30.0) -> list[int]:
    """Poll until `pids_of()` is empty or `timeout` s pass; what is left."""
    deadline = time.monotonic() + timeout
    while (left := pids_of()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def lock_record(repo: Path) -> dict:
    path = repo / ".dvc/tmp/pipeline-repro.lock"
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


PYTHON = sys.executable
