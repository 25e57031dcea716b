"""The run-wide params sections (the task, the prompt format, model loading, ...) reach the library through the
stage: `run_stage` reads them from params.yaml and hands them over for the run; the library itself reads no
params file (tests/unit/test_layout.py), so a call outside a stage computes with the schemas' defaults."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, venv_env

PROBE = """
from pipeline.core.params import given
from pipeline.data import task
from pipeline.modeling.params import ModelLoadConfig
from pipeline.orchestration.flows import run_stage

def seen():
    return f"{task.active().grader} {given(ModelLoadConfig).dtype}"

print("before", seen())
run_stage("probe", lambda: print("during", seen()))
print("after", seen())
"""


def run_probe(cwd, params: str) -> subprocess.CompletedProcess:
    (cwd / "params.yaml").write_text(params)
    return subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env=venv_env(PYTHONPATH=str(ROOT)))


def test_run_stage_hands_the_run_wide_sections_over_for_the_run_only(tmp_path, prefect_api):
    proc = run_probe(tmp_path, "task: {grader: exact}\nmodel: {dtype: bfloat16}\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("before", "during", "after"))]
    assert lines == ["before relaxed float32", "during exact bfloat16", "after relaxed float32"]


def test_a_bad_run_wide_section_exits_2_naming_the_key_before_the_flow(tmp_path, prefect_api):
    proc = run_probe(tmp_path, "model: {dtype: float8}\n")
    assert proc.returncode == 2 and "params.yaml: model.dtype:" in proc.stderr, proc.stderr[-2000:]
    assert "during" not in proc.stdout and "Traceback" not in proc.stderr
