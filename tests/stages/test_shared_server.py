"""Stages run outside `python -m pipeline repro` (plain `dvc repro`, `dvc exp run`, the queue) share one
background Prefect server instead of starting a temporary one each; `python -m pipeline server --stop`
stops it, and it stops itself once unused for PIPELINE_SERVER_IDLE_SECONDS. Each stage publishes its metrics
file as an artifact of its flow run."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from pipeline.orchestration.idle import in_use, quiet
from tests.conftest import ROOT, api_post, venv_env

PROBE = """
import json, pathlib
from pipeline.orchestration.flows import run_stage
def body():
    pathlib.Path("metrics").mkdir(exist_ok=True)
    pathlib.Path("metrics/probe.json").write_text(json.dumps({"accuracy": 0.5, "by": {"a": 1}}))
    print("probe ran")
run_stage("probe", body)
"""


def test_stage_processes_without_an_api_url_share_one_background_server(tmp_path):
    env = venv_env(PREFECT_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    env.pop("PREFECT_API_URL", None)
    state = tmp_path / "home" / "pipeline-server.json"
    pids = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0 and "probe ran" in proc.stdout, proc.stderr[-2000:]
        pids.append(json.loads(state.read_text())["pid"])
    assert pids[0] == pids[1]  # the second stage found the first one's server
    url = json.loads(state.read_text())["url"]
    runs = api_post(url, "flow_runs/filter", {})
    assert [r["state_type"] for r in runs] == ["COMPLETED", "COMPLETED"]
    # each stage publishes its own metrics file as a table artifact of its flow run
    artifacts = [a for a in api_post(url, "artifacts/filter", {}) if a["key"] == "probe-metrics"]
    assert len(artifacts) == 2 and {r["id"] for r in runs} == {a["flow_run_id"] for a in artifacts}
    data = artifacts[0]["data"]
    assert {"metric": "by.a", "value": 1} in (json.loads(data) if isinstance(data, str) else data)
    stop = subprocess.run([sys.executable, "-m", "pipeline", "server", "--stop"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and f"(PID {pids[0]})" in stop.stdout and not state.exists()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pids[0], 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the shared server still runs after --stop")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_unused_shared_server_stops_itself_and_the_next_stage_starts_a_fresh_one(tmp_path):
    home = tmp_path / "home"
    env = venv_env(PREFECT_HOME=str(home), PYTHONPATH=str(ROOT), PIPELINE_SERVER_IDLE_SECONDS="3")
    env.pop("PREFECT_API_URL", None)
    state, log = home / "pipeline-server.json", home / "pipeline-server.log"
    stopping = "stopping the shared Prefect server (PIPELINE_SERVER_IDLE_SECONDS)"
    # the second stage outlasts the idle time: a stage on the server keeps it up
    probes = [PROBE, PROBE.replace('print("probe ran")', 'import time; time.sleep(5); print("probe ran")')]
    pids: list[int] = []
    try:
        for probe in probes:
            proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=180)
            assert proc.returncode == 0 and "probe ran" in proc.stdout, proc.stderr[-2000:]
            pids.append(json.loads(state.read_text())["pid"])
            # the recorded PID leads the session and process group the server runs in (what --stop signals)
            leader = psutil.Process(pids[-1])
            (server,) = [p for p in (leader, *leader.children()) if p.cmdline()[1:4] == ["-m", "prefect", "server"]]
            assert os.getpgid(server.pid) == os.getsid(server.pid) == pids[-1]
            if len(pids) == 1:
                deadline = time.monotonic() + 60
                while not (gone(pids[0]) and gone(server.pid)) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert gone(pids[0]) and gone(server.pid), "the unused shared server still runs after 60 s"
                assert not state.exists() and log.read_text().count(stopping) == 1
        assert pids[1] != pids[0]  # a fresh server
    finally:
        for pid in pids:
            if not gone(pid):
                os.killpg(pid, signal.SIGTERM)


def test_the_shared_server_stays_up_while_a_stage_holds_it_or_the_state_file_is_fresh(tmp_path):
    now = 1_000_000.0
    assert quiet(now, busy_at=now - 601, touched_at=now - 700, seconds=600)
    assert not quiet(now, busy_at=now - 10, touched_at=now - 700, seconds=600)  # a stage ran 10 s ago
    assert not quiet(now, busy_at=now - 700, touched_at=now - 10, seconds=600)  # a stage just took the URL
    assert quiet(now, busy_at=now - 700, touched_at=None, seconds=600)  # the state file is gone
    assert not quiet(now, busy_at=now - 10**6, touched_at=None, seconds=0)  # 0: never
    # a stage process holds a shared flock on the in-use file from taking the server until it exits
    path = tmp_path / "pipeline-server.in-use"
    assert not in_use(path)
    with open(path, "a") as stage:
        fcntl.flock(stage, fcntl.LOCK_SH)
        assert in_use(path)
    assert not in_use(path)


PHASES = """
from pipeline.orchestration.flows import phase, run_stage
from pipeline.core.io import InputError

@phase("load")
def load(rows):
    return len(rows)

@phase("check")
def check(n):
    if n > 2:
        raise InputError(f"data/probe.parquet: {n} rows, at most 2")

def body():
    check(load([{"x": i} for i in range(3)]))

run_stage("phases", body)
"""


def test_a_stage_s_phases_are_tasks_of_its_flow_run_and_a_failing_one_is_named(tmp_path, prefect_api):
    """Each phase is a task run of the stage's flow run; a phase that fails for a reason (bad input) fails its
    task and its flow with that message, the stage exits 2 naming the file, and no traceback is printed."""
    proc = subprocess.run([sys.executable, "-c", PHASES], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          env=venv_env(PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2 and "error: data/probe.parquet: 3 rows, at most 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    (flow_run,) = [r for r in api_post(prefect_api, "flow_runs/filter", {"flows": {"name": {"any_": ["phases"]}}})]
    assert flow_run["state_type"] == "FAILED" and "3 rows, at most 2" in flow_run["state"]["message"]
    tasks = api_post(prefect_api, "task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
    states = {t["name"].rsplit("-", 1)[0]: t["state_type"] for t in tasks}
    assert states == {"load": "COMPLETED", "check": "FAILED"}
