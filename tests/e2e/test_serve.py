"""`python -m pipeline serve` registers prefect.yaml's deployment, with its schedule and parameters, on the real
server."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, api_post, venv_env

pytestmark = pytest.mark.e2e


def test_serve_registers_the_deployment_of_prefect_yaml(prefect_api):
    from pipeline.orchestration.schedule import DEPLOYMENT_FILE, load

    shipped = load(path=ROOT / DEPLOYMENT_FILE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve"],
        cwd=ROOT, env=venv_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = [d for d in api_post(prefect_api, "deployments/filter", {}) if d["name"] == shipped.name]
            if found:
                break
            time.sleep(0.5)
        assert found, "no deployment registered within 60 s"
        assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in found[0]["schedules"]] == [
            (shipped.cron, shipped.timezone)]
        assert found[0]["parameters"] == shipped.parameters
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_without_a_server_fails_clearly():
    env = {k: v for k, v in venv_env().items() if k != "PREFECT_API_URL"}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "serve"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "PREFECT_API_URL is not set" in proc.stderr
