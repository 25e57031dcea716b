"""Shared fixtures: tiny params, and one real Prefect server on loopback for the session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# Small enough for 2 cores; the same stages and code paths as the default run.
TINY_PARAMS = {
    "synthesize": {"seed": 0, "n_train": 240, "n_val": 24, "n_test": 40, "n_ood": 24, "render_charts": 2},
    "base": {"seed": 0, "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
             "drills": {"seed": 0, "colour_steps": 6, "number_steps": 6, "batch_size": 4, "val_tables": 8}},
    "teacher": {"seed": 0, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1,
                "train": {"seed": 0, "learning_rate": 0.003, "max_steps": 12, "per_device_train_batch_size": 8,
                          "max_eval_samples": 16, "eval_steps": 6, "logging_steps": 3}},
    # min_step_accuracy 0: a 12-step teacher gets some yes/no answers right, never whole chains
    "distill": {"seed": 0, "max_questions": 48, "k": 4, "max_new_tokens": 48, "batch_size": 64,
                "min_step_accuracy": 0.0, "logit_steps": 2, "logit_max_new_tokens": 16},
    "sft": {"seed": 0, "learning_rate": 0.003, "max_steps": 12, "per_device_train_batch_size": 8,
            "max_eval_samples": 16, "eval_steps": 6, "logging_steps": 3,
            "rank_drill": {"curriculum": [1, 1], "steps": 1, "batch_size": 2, "val_tables": 4, "replay": 2}},
    "mine": {"seed": 0, "pool_size": 48, "rollouts": 4, "max_new_tokens": 48, "batch_size": 64},
    "grpo": {"seed": 0, "max_steps": 3, "prompts_per_step": 2, "num_generations": 4, "max_completion_length": 32,
             "logging_steps": 1, "success_prompts": 8},
    "dpo": {"seed": 0, "num_train_epochs": 1, "per_device_train_batch_size": 4, "logging_steps": 1},
    "prm_data": {"seed": 0, "gold_questions": 24, "val_questions": 12, "samples": 2, "max_new_tokens": 48,
                 "batch_size": 64, "mcts_questions": 4, "chain_questions": 4, "iterations": 2, "children": 2, "step_tokens": 24,
                 "max_steps": 4},
    "prm": {"seed": 0, "num_train_epochs": 1, "per_device_train_batch_size": 8, "logging_steps": 1},
    "evaluate": {"batch_size": 32, "max_new_tokens": 64, "splits": ["test", "ood"], "k_samples": 8,
                 "decoding": {"questions": 8, "n": 2, "beam_width": 1, "mcts_iterations": 2, "mcts_children": 2, "max_steps": 4,
                              "step_tokens": 24}},
    "animate": {"seed": 0, "samples": 6, "frames": 10, "width": 160, "height": 120, "contact_sheet": 2},
}


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


def write_params(folder: Path, params: dict = TINY_PARAMS) -> Path:
    """params.yaml with every key of every section spelled out, as in the repo's own file
    (dvc.yaml names single keys such as `distill.k`, which DVC requires to be present)."""
    from pipeline.config import SECTIONS

    full = {name: SECTIONS[name].model_validate(params.get(name) or {}).model_dump(mode="json") for name in SECTIONS}
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(full, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real Prefect API server (SQLite in a temp PREFECT_HOME), used in-process and by subprocesses."""
    from pipeline.flows import prefect_server

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
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file() and not rel.startswith(("tests/", "bench/")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def venv_env(**extra: str) -> dict[str, str]:
    """The environment a stage subprocess gets: this interpreter's folder first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1", **extra}
