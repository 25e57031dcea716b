"""A stage killed with its whole process group (SIGKILL, as a scheduler kills a job), at a point the fault hook
controls after partial files exist: nothing is accepted as complete, no process is left (the Prefect server
`python -m pipeline repro` started dies with it), and the next run cleans up, redoes the stage and ends clean.

The same for `sft` and `evaluate`: tests/e2e/test_repro.py, which has their upstream stages built already
(`test_sft_and_evaluate_killed_mid_stage_then_the_next_run_finishes`)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.conftest import (
    PYTHON,
    kill_session,
    live_processes,
    lock_record,
    own_server_env,
    sh,
    start,
    wait_gone,
)

pytestmark = pytest.mark.e2e


def killed_repro(repo, target: str, point: str, home, force: bool = False) -> None:
    """`python -m pipeline repro <target>` with `kill@<point>` armed: assert it died by SIGKILL and left nothing
    running, its Prefect server included. `force`: run the target even when it is up to date."""
    env = {**own_server_env(home), "PIPELINE_FAULT": f"kill@{point}"}
    proc = start([PYTHON, "-m", "pipeline", "repro", *(["--force"] if force else []), target], repo, env)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_session(proc)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point} ({proc.returncode}):\n{out[-3000:]}"
    record = lock_record(repo)
    assert record.get("pid") == proc.pid and record.get("server", {}).get("pid"), record
    server = record["server"]["pid"]  # the tether, leader of the server's own session
    assert not wait_gone(lambda: live_processes(pgid=proc.pid)), "a process of the killed run is left"
    assert not wait_gone(lambda: live_processes(sid=server)), "the Prefect server outlived the killed run"


def stale(repo, target: str) -> str:
    return sh([PYTHON, "-m", "pipeline", "status", target], repo).stdout


def test_synthesize_killed_before_its_output_is_in_place(repo, tmp_path):
    killed_repro(repo, "synthesize", "commit:data/synthesize", tmp_path / "home", force=True)
    assert not (repo / "data/synthesize").exists()
    leftovers = list((repo / "data").glob(".synthesize.tmp-*"))
    assert leftovers and any(p.suffix == ".parquet" for p in leftovers[0].iterdir()), "partial files were written"
    assert "synthesize" in stale(repo, "synthesize")

    sh([PYTHON, "-m", "pipeline", "repro", "synthesize"], repo)
    assert not list((repo / "data").glob(".synthesize.tmp-*")), "the next run removes the dead run's folder"
    assert (repo / "data/synthesize/train.parquet").exists()
    assert "up to date" in stale(repo, "synthesize")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM to the run", "Ctrl-C"])
def test_sigterm_to_the_run_stops_its_stage_and_its_server(repo, tmp_path, signum):
    """A scheduler's timeout or a cancelled deployment sends SIGTERM to the run alone: the stage it runs (which
    DVC does not pass the signal to) and its Prefect server stop too, and the run exits 143. Ctrl-C sends SIGINT
    to the whole foreground group: the same, exit 130, one line and no KeyboardInterrupt traceback."""
    seen = {p.name.split("-")[1] for p in (repo / "data").glob(".synthesize.tmp-*")}
    env = {**own_server_env(tmp_path / "home"), "PIPELINE_FAULT": "stall:300@commit:data/synthesize"}
    proc = start([PYTHON, "-m", "pipeline", "repro", "--force", "synthesize"], repo, env, log=tmp_path / "run.log")
    try:
        deadline = time.monotonic() + 120
        # the stage has written and stalls (its folder named with another PID than any earlier run's)
        while "server" not in lock_record(repo) or not [
                p for p in (repo / "data").glob(".synthesize.tmp-*") if p.name.split("-")[1] not in seen]:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.2)
        server = lock_record(repo)["server"]["pid"]
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
        else:
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signum, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_session(proc)
    assert not wait_gone(lambda: live_processes(pgid=proc.pid)), "the stage outlived the run"
    assert not wait_gone(lambda: live_processes(sid=server)), "the Prefect server outlived the run"
    log = (tmp_path / "run.log").read_text()
    assert f"error: stopped by signal {int(signum)} ({signum.name}); what it was running was stopped too" in log
    assert "KeyboardInterrupt" not in log, log[-3000:]
    assert not (repo / "data/synthesize").exists()
    sh([PYTHON, "-m", "pipeline", "repro", "synthesize"], repo)
    assert "up to date" in stale(repo, "synthesize")
