"""Scheduled runs on a real Prefect server on loopback: prefect.yaml's deployment deployed with
`prefect deploy`, a process worker started by `python -m pipeline worker` (which makes the pool),
a triggered run of one target on the `tiny` profile that completes, records its version and
publishes its artifacts (read back through the Prefect client); and a gate that stops a version,
which then is neither recorded nor counted as a success."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import api_post, copy_project, venv_env, write_params

pytestmark = pytest.mark.e2e


def make_repo(dest):
    repo = copy_project(dest)
    write_params(repo)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.com"],
                ["git", "config", "user.name", "ci"], ["git", "add", "-A"], ["git", "commit", "-qm", "start"]):
        subprocess.run(cmd, cwd=repo, check=True)
    return repo


def commits(repo) -> list[str]:
    return subprocess.run(["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.splitlines()


async def artifacts_of(flow_run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a.data for a in found}


def test_the_shipped_deployment_runs_on_a_process_worker(tmp_path, prefect_api):
    from prefect.deployments import run_deployment

    repo = make_repo(tmp_path / "repo")
    shipped = yaml.safe_load((repo / "prefect.yaml").read_text())["deployments"][0]
    # PWD: prefect.yaml's pull step runs the flow in "{{ $PWD }}", read when `prefect deploy` runs (a shell sets it)
    env = venv_env(PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="1", PWD=str(repo))
    worker = subprocess.Popen([sys.executable, "-m", "pipeline", "worker"], cwd=repo, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not [p for p in api_post(prefect_api, "work_pools/filter", {}) if p["name"] == "pipeline"]:
            assert time.monotonic() < deadline and worker.poll() is None, "the worker made no work pool"
            time.sleep(0.5)
        pool = [p for p in api_post(prefect_api, "work_pools/filter", {}) if p["name"] == "pipeline"][0]
        assert pool["type"] == "process"
        deploy = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"], cwd=repo, env=env,
                                capture_output=True, text=True, timeout=180)
        assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-2000:]
        deployed = [d for d in api_post(prefect_api, "deployments/filter", {}) if d["name"] == shipped["name"]][0]
        assert deployed["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(repo)
        assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in deployed["schedules"]] == [
            (shipped["schedules"][0]["cron"], shipped["schedules"][0]["timezone"])]
        assert deployed["parameters"] == shipped["parameters"] and deployed["work_pool_name"] == "pipeline"

        start = time.monotonic()
        run = run_deployment(f"repro/{shipped['name']}", timeout=600, poll_interval=1, parameters={
            "targets": ["synthesize"], "profile": "tiny", "gate": [], "pull": False, "push": False})
        took = time.monotonic() - start
        assert run.state.is_completed(), run.state
        assert (repo / "data/synthesize/train.parquet").exists()
        assert commits(repo)[0].startswith("Pipeline version of") and "profile tiny" in commits(repo)[0]
        artifacts = asyncio.run(artifacts_of(run.id))
        assert {"pipeline-metrics", "pipeline-comparison", "pipeline-models"} <= set(artifacts), artifacts.keys()
        assert "synthesize.json" in str(artifacts["pipeline-metrics"])
        print(f"triggered run: {took:.1f} s from the request to a completed state")
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a worker still shutting down: its whole session goes
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)


def test_a_gate_that_cannot_pass_stops_the_version(tmp_path, prefect_api):
    repo = make_repo(tmp_path / "repo")
    proc = subprocess.run([sys.executable, "-m", "pipeline", "repro", "synthesize", "--gate", "sft:0.01", "--record"],
                          cwd=repo, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "the gate stopped this version; nothing recorded or pushed: sft: cannot judge a regression" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert commits(repo) == ["start"]  # not recorded
    bad = subprocess.run([sys.executable, "-m", "pipeline", "repro", "--gate", "sft:2"], cwd=repo, env=venv_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--gate 'sft:2': expected MODEL[:MARGIN]" in bad.stderr
    # code changed but not committed: a recorded dvc.lock would name it, so --record refuses before any work
    with open(repo / "stages" / "report.py", "a") as fh:
        fh.write("# an edit\n")
    dirty = subprocess.run([sys.executable, "-m", "pipeline", "repro", "synthesize", "--record"], cwd=repo,
                           env=venv_env(), capture_output=True, text=True, timeout=120)
    assert dirty.returncode == 2, dirty.stderr[-2000:]
    assert "--record: uncommitted changes in stages/report.py" in dirty.stderr and commits(repo) == ["start"]
