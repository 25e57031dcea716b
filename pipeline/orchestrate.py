"""The orchestrator flow: `dvc repro` under one Prefect flow, then the metrics as artifacts.

DVC decides what is stale; this flow only runs it, shares one Prefect API server
with every stage process (through `PREFECT_API_URL` in their environment), and
publishes this version's metrics and their diff against git HEAD.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow

from pipeline import paths
from pipeline.config import validate_all
from pipeline.flows import publish_markdown, publish_table, stage_logger
from pipeline.report import decoding_markdown, generalisation_markdown, load_evaluations


def dvc(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """Run the venv's DVC with the venv's `python` first on PATH (stage cmds say `python -m ...`)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], env=env, text=True, capture_output=capture, check=False
    )


def flatten(data: dict, prefix: str = "") -> dict[str, float]:
    """Nested metrics to dotted keys with numeric leaves."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def metrics_rows(root: Path = paths.METRICS) -> list[dict]:
    """One row per metric of every metrics/*.json file."""
    rows = []
    for file in sorted(root.rglob("*.json")):
        for key, value in flatten(json.loads(file.read_text())).items():
            rows.append({"file": str(file), "metric": key, "value": value})
    return rows


def diff_markdown(rev: str = "HEAD", after: str | None = None) -> str:
    """`dvc metrics diff` of `after` (None: the workspace) against `rev`, as a markdown table."""
    revs = [rev] + ([after] if after else [])
    proc = dvc("metrics", "diff", *revs, "--json", capture=True)
    if proc.returncode != 0:
        return f"`dvc metrics diff {' '.join(revs)}` failed: {proc.stderr.strip()[:500]}"
    diff = json.loads(proc.stdout or "{}")  # DVC 3: {file: {metric: {old, new, diff}}}, no wrapper key
    lines = ["| file | metric | old | new | change |", "|---|---|---|---|---|"]
    for file, entries in sorted(diff.items()):
        for key, d in sorted(entries.items()):
            change = d.get('diff')
            change = round(change, 4) if isinstance(change, float) else change
            lines.append(f"| {file} | {key} | {d.get('old')} | {d.get('new')} | {change} |")
    return "\n".join(lines) if len(lines) > 2 else f"No metric changed against {rev}."


def models_markdown(root: Path = paths.METRICS) -> str:
    """Every evaluated model side by side (greedy accuracy, pass@k, maj@k), then the RL yardstick:
    p0 (the SFT policy's sampled success on the RL pool), p*(p0, beta) and the success measured after GRPO."""
    lines = ["| model | test | ood | step accuracy | pass@k | maj@k | sampled accuracy | tokens/question |",
             "|---|---|---|---|---|---|---|---|"]
    for name, m in load_evaluations(root).items():
        sampled = m.get("sampled", {})
        k = sampled.get("k")
        lines.append(
            f"| {name} | {m.get('accuracy')} | {m.get('accuracy_ood')} | {m.get('step_accuracy')} | "
            f"{m.get(f'pass_at_{k}')} (k={k}) | {m.get(f'maj_at_{k}')} | {sampled.get('sampled_accuracy')} | "
            f"{m.get('tokens_per_question')} |"
        )
    prm_file = root / "prm.json"
    if prm_file.exists():
        p = json.loads(prm_file.read_text())
        lines += ["", f"PRM on held-out gold step labels ({p['held_out']['lines']} lines): AUROC {p.get('auroc')} "
                      f"(steps {p['held_out'].get('auroc_steps')}, answers {p['held_out'].get('auroc_answers')}), "
                      f"accuracy {p.get('accuracy')}, ECE {p.get('ece')}; within one question, a right answer "
                      f"ranked above a wrong one in {p['held_out'].get('within_question', {}).get('pair_accuracy_mean')} "
                      "of pairs (mean of line scores; 0.5 is chance)."]
    grpo_file = root / "grpo.json"
    if grpo_file.exists():
        g = json.loads(grpo_file.read_text())
        lines += ["", f"RL ({g.get('algorithm')}, {g.get('steps')} steps, {g.get('rollouts')} rollouts): "
                      f"p0 = {g.get('p0')} on the RL pool; success-amplification fixed point p*(p0, beta) = "
                      f"{g.get('p_star')}; measured on {g.get('success_prompts')} pool prompts: "
                      f"{g.get('p_before')} before, {g.get('p_after')} after."]
    return "\n".join(lines)


@flow(name="repro", persist_result=False)
def repro_flow(targets: list[str] | None = None, force: bool = False, pull: bool = False, push: bool = False) -> dict:
    """Run `dvc repro` (optionally pull first / push after) and publish the metrics."""
    log = stage_logger()
    validate_all()  # every section, before DVC starts anything
    if pull and dvc("pull").returncode != 0:
        raise RuntimeError("dvc pull failed")
    start = time.perf_counter()
    proc = dvc("repro", *(["--force"] if force else []), *(targets or []))
    if proc.returncode != 0:
        raise RuntimeError(f"dvc repro failed with exit code {proc.returncode}")
    log.info("dvc repro finished in %.1f s", time.perf_counter() - start)
    if push and dvc("push").returncode != 0:
        raise RuntimeError("dvc push failed")
    rows = metrics_rows()
    if rows:
        publish_table("pipeline-metrics", rows, "Metrics of this pipeline version (metrics/*.json)")
    publish_markdown("pipeline-metrics-diff", diff_markdown(), "dvc metrics diff against git HEAD")
    publish_markdown("pipeline-models", models_markdown(), "Every evaluated model side by side, and the RL yardstick")
    evaluations = load_evaluations()
    publish_markdown("pipeline-decoding", decoding_markdown(evaluations),
                     "Decoding strategies at one sample budget: accuracy beside cost; faithfulness")
    publish_markdown("pipeline-generalisation", generalisation_markdown(evaluations),
                     "Accuracy per task type, in-domain and out-of-domain, every model and strategy")
    return {r["file"] + ":" + r["metric"]: r["value"] for r in rows}
