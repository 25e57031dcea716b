"""Shared fixtures: tiny params, and one real Prefect server on loopback for the session."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from pipeline.orchestration import workspace
from pipeline.orchestration.profiles import resolve

ROOT = Path(__file__).resolve().parents[1]

# The `tiny` profile (profiles/tiny.yaml), resolved: small enough for 2 cores, the same stages and code paths
# as the research recipe.
TINY_PARAMS = resolve("tiny", root=ROOT)


# The whole Chain-of-Functions generator (every chart type, multi-series tables, long
# chains), not only the narrower distribution that params.yaml picks for the CPU student.
FULL_SYNTHESIS = {
    "chart_types": ["bar", "grouped_bar", "stacked_bar", "line", "pie"], "max_categories": 5, "max_series": 3,
    "value_max": 60, "max_chain_length": 5, "ood_min_chain_length": 6, "ood_max_chain_length": 8,
}


def api_post(api_url: str, route: str, body: dict) -> list[dict]:
    """POST a filter to the Prefect REST API and return the JSON answer."""
    req = urllib.request.Request(f"{api_url}/{route}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def write_params(folder: Path, params: dict = TINY_PARAMS, profile: str = "tiny") -> Path:
    """params.yaml for `params` (default: the tiny profile), as `python -m pipeline params` writes it."""
    return workspace.write_params(folder, params, profile)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real Prefect API server (SQLite in a temp PREFECT_HOME), used in-process and by subprocesses."""
    from pipeline.orchestration.flows import prefect_server

    home = tmp_path_factory.mktemp("prefect_home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ.pop("PREFECT_API_URL", None)
    os.environ["PREFECT_HOME"] = str(home)
    with prefect_server(home=home) as api_url:
        os.environ["PREFECT_API_URL"] = api_url  # for subprocesses
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api_url}):  # for this process
            yield api_url
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def copy_project(dest: Path) -> Path:
    """The tracked project files (no data, models or venv) into `dest`."""
    return workspace.copy_project(dest, ROOT)


def venv_env(**extra: str) -> dict[str, str]:
    """The environment a stage subprocess gets: this interpreter's folder first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1", **extra}
