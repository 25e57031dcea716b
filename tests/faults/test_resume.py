"""Resume and the divergence guard on a real TRL run (tests/faults/sft_run.py: 8 SFT steps of a tiny model).

Killed at step 6 with a checkpoint every 2 steps, the next run continues from step 4's checkpoint and trains
exactly steps 5 to 8 on the same batches (every step's loss equals an uninterrupted run's); a changed run never
resumes an old one; checkpoint state loads with weights_only; a NaN at step 5 stops the run naming the step and
keeps step 4's checkpoint.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, venv_env

SCRIPT = ROOT / "tests/faults/sft_run.py"


def run(folder: Path, checkpoint_steps: int, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    folder.mkdir(exist_ok=True)
    (folder / "params.yaml").write_text(f"repro: {{lock_timeout: 0, checkpoint_steps: {checkpoint_steps}, resume: true}}\n")
    env = venv_env(PYTHONPATH=str(ROOT), **({"PIPELINE_FAULT": fault} if fault else {}))
    return subprocess.run([sys.executable, str(SCRIPT), "out.json", *extra], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300, start_new_session=True)


def losses(folder: Path) -> dict[int, float]:
    return {int(k): v for k, v in json.loads((folder / "out.json").read_text())["losses"].items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    folder = tmp_path_factory.mktemp("whole")
    assert run(folder, 0).returncode == 0
    assert not (folder / ".checkpoints").exists()  # checkpoint_steps 0: none
    return losses(folder)


def test_a_killed_run_resumes_with_exactly_the_remaining_steps_in_the_same_order(tmp_path, uninterrupted):
    killed = run(tmp_path, 2, fault="kill@step:6")
    assert killed.returncode == -signal.SIGKILL
    (folder,) = (tmp_path / ".checkpoints").iterdir()
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    resumed = run(tmp_path, 2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert sorted(losses(tmp_path)) == [5, 6, 7, 8]  # steps 1-4 came from the checkpoint, none trained twice
    assert out["metrics"]["steps"] == 8
    for step, loss in losses(tmp_path).items():  # the same batches in the same order: the same losses
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5, abs=1e-6), step
    assert out["loads"] and all(w is True for w in out["loads"]), out["loads"]  # optimizer, scheduler, RNG


def test_a_changed_run_does_not_resume_an_old_checkpoint(tmp_path, uninterrupted):
    assert run(tmp_path, 2, fault="kill@step:6").returncode == -signal.SIGKILL
    changed = run(tmp_path, 2, "0.002")  # another learning rate: another key
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert sorted(losses(tmp_path)) == list(range(1, 9))
    assert len(list((tmp_path / ".checkpoints").iterdir())) == 2  # the old run's folder is not reused


def test_a_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    diverged = run(tmp_path, 2, fault="nan@step:5")
    assert diverged.returncode == 1
    assert "Traceback" not in diverged.stderr
    (folder,) = (tmp_path / ".checkpoints").iterdir()
    assert "training diverged: the loss is nan at optimizer step 5" in diverged.stderr
    assert f"the last good checkpoint, {folder.relative_to(tmp_path) / 'checkpoint-4'}, is kept" in diverged.stderr
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not (tmp_path / "out.json").exists()
