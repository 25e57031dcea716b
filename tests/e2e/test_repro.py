"""The real thing: `python -m pipeline repro` (which runs `dvc repro`) in a temporary git repository.

Checks the outputs and metrics, that a second run re-executes nothing, and that
changing one `sft` param re-runs exactly `sft` and what depends on it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import api_post, copy_project, venv_env, write_params

pytestmark = pytest.mark.e2e


def sh(args: list[str], cwd, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=venv_env(), capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def dvc(*args: str, cwd, check: bool = True) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "dvc", *args], cwd, check)


def ran_stages(output: str) -> list[str]:
    return sorted(set(re.findall(r"Running stage '([^']+)'", output)))


@pytest.fixture(scope="module")
def repo(tmp_path_factory, prefect_api):
    folder = copy_project(tmp_path_factory.mktemp("repo"))
    write_params(folder)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.com"],
                ["git", "config", "user.name", "ci"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        sh(cmd, folder)
    return folder


def test_repro_builds_everything(repo, prefect_api):
    proc = sh([sys.executable, "-m", "pipeline", "repro"], repo)
    out = proc.stdout + proc.stderr
    assert ran_stages(out) == ["base", "distill", "evaluate@sft", "evaluate@teacher", "sft", "synthesize", "teacher"]
    for path in ("data/synthesize/test.parquet", "models/base/model.safetensors", "models/teacher/model.safetensors",
                 "data/distill/train.parquet", "data/distill/hard.parquet", "data/distill/pairs.parquet",
                 "metrics/distill.json", "plots/distill/pass_rate.png", "models/sft/model.safetensors",
                 "data/evaluate/sft/predictions.parquet", "metrics/evaluate/sft.json",
                 "metrics/evaluate/teacher.json", "dvc.lock"):
        assert (repo / path).exists(), path
    shown = json.loads(dvc("metrics", "show", "--json", cwd=repo).stdout)
    metrics = shown[""]["data"]["metrics/evaluate/sft.json"]["data"]  # "" is the workspace
    assert 0 <= metrics["accuracy"] <= 1 and "accuracy_ood" in metrics
    # every stage ran as a flow on the shared server, and the orchestrator published the metrics
    flows = {f["name"] for f in api_post(prefect_api, "flows/filter", {})}
    assert {"repro", "synthesize", "base", "teacher", "distill", "sft", "evaluate"} <= flows
    keys = {a["key"] for a in api_post(prefect_api, "artifacts/filter", {})}
    assert {"pipeline-metrics", "pipeline-metrics-diff"} <= keys


def test_second_repro_runs_nothing(repo):
    proc = dvc("repro", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == []
    assert "up to date" in dvc("status", cwd=repo).stdout.lower() or dvc("status", cwd=repo).stdout.strip() == ""


def test_changing_an_sft_param_reruns_exactly_sft_and_dependents(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["sft"]["learning_rate"] = 0.002
    write_params(repo, params)
    # Only sft is stale before it runs; evaluate@sft becomes stale when models/sft changes.
    status = json.loads(dvc("status", "--json", cwd=repo).stdout)
    assert list(status) == ["sft"]
    dry = dvc("repro", "--dry", cwd=repo)
    assert ran_stages(dry.stdout + dry.stderr) == ["sft"]
    base_lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["base"]
    proc = dvc("repro", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == ["evaluate@sft", "sft"]
    assert yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["base"] == base_lock
    diff = json.loads(dvc("params", "diff", "--json", cwd=repo).stdout)
    changed = diff["params.yaml"]["sft.learning_rate"]
    assert (changed["old"], changed["new"]) == (0.003, 0.002)


def test_distill_params_split_between_sampling_and_sft(repo):
    """distill.k re-samples (not the teacher); distill.logit_steps only matters to sft."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["distill"]["logit_steps"] = 3
    write_params(repo, params)
    assert list(json.loads(dvc("status", "--json", cwd=repo).stdout)) == ["sft"]
    params["distill"]["k"] = 3
    write_params(repo, params)
    assert sorted(json.loads(dvc("status", "--json", cwd=repo).stdout)) == ["distill", "sft"]
    proc = dvc("repro", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == ["distill", "evaluate@sft", "sft"]
    distilled = json.loads((repo / "metrics/distill.json").read_text())
    assert distilled["samples"] == 3 * distilled["questions_sampled"]


def test_dvc_exp_run_with_a_changed_param(repo):
    """`dvc exp run -S` runs an experiment and `dvc exp show` lists its metrics beside the baseline."""
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "lr 0.002"], repo)
    proc = dvc("exp", "run", "-S", "sft.learning_rate=0.004", "-n", "lr4", cwd=repo)
    assert ran_stages(proc.stdout + proc.stderr) == ["evaluate@sft", "sft"]
    shown = json.dumps(json.loads(dvc("exp", "show", "--json", cwd=repo).stdout))  # normalised spacing
    assert '"lr4"' in shown and '"learning_rate": 0.004' in shown
