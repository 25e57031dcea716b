"""Stages run outside `python -m pipeline repro` (plain `dvc repro`, `dvc exp run`, the queue) share one
background Prefect server instead of starting a temporary one each; `python -m pipeline server --stop`
stops it. Each stage publishes its metrics file as an artifact of its flow run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.conftest import ROOT, api_post, venv_env

PROBE = """
import json, pathlib
from pipeline.flows import run_stage
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


PHASES = """
from pipeline.flows import phase, run_stage
from pipeline.io import InputError

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
