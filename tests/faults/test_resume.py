"""Resume and the divergence guard on a real TRL run (tests/faults/sft_run.py: SFT steps of a tiny model).

Killed at step 6 (or 12, in its second epoch) of 12 with a checkpoint every 2 steps, the next run continues from
step 4's (10's) checkpoint and trains exactly the remaining steps on the same batches (every step's loss, and the
run's mean `train_loss`, equal an uninterrupted run's); a changed run never resumes an old one; checkpoint state loads
with weights_only; a NaN at step 5 stops the run naming the step and keeps step 4's checkpoint.
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
    (folder / "params.yaml").write_text(f"repro: {{lock_timeout: 0, checkpoint_steps: {checkpoint_steps}, "
                                        f"resume: true}}\n")
    env = venv_env(PYTHONPATH=str(ROOT), **({"PIPELINE_FAULT": fault} if fault else {}))
    return subprocess.run([sys.executable, str(SCRIPT), "out.json", *extra], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300, start_new_session=True)


def losses(folder: Path) -> dict[int, float]:
    return {int(k): v for k, v in json.loads((folder / "out.json").read_text())["losses"].items()}


MAX_STEPS = "12"  # 8 optimizer steps an epoch (64 rows, batch 8): the run goes on into a second epoch


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("whole")
    assert run(folder, 0, "0.003", MAX_STEPS).returncode == 0
    assert not (folder / ".checkpoints").exists()  # checkpoint_steps 0: none
    return folder


@pytest.mark.parametrize("kill, kept", [(6, 4), (12, 10)], ids=["in the first epoch", "in the second epoch"])
def test_a_killed_run_resumes_with_exactly_the_remaining_steps_in_the_same_order(tmp_path, uninterrupted, kill, kept):
    """In the second epoch, the length-grouped order is drawn from the RNG as it stood at that epoch's start, which
    a fresh process does not have: the checkpoint carries it (checkpoints.EPOCH_RNG_FILE)."""
    killed = run(tmp_path, 2, "0.003", MAX_STEPS, fault=f"kill@step:{kill}")
    assert killed.returncode == -signal.SIGKILL
    (folder,) = (tmp_path / ".checkpoints").iterdir()
    assert {p.name for p in folder.glob("checkpoint-*")} == {f"checkpoint-{kept - 2}", f"checkpoint-{kept}"}
    saved = json.loads((folder / f"checkpoint-{kept}" / "pipeline_loss_sum.json").read_text())["loss_sum"]
    assert saved == pytest.approx(sum(losses(uninterrupted)[s] for s in range(1, kept + 1)), rel=1e-4)

    resumed = run(tmp_path, 2, "0.003", MAX_STEPS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert sorted(losses(tmp_path)) == list(range(kept + 1, 13))  # the checkpoint's steps are not trained twice
    assert out["metrics"]["steps"] == 12
    whole = json.loads((uninterrupted / "out.json").read_text())
    for step, loss in losses(tmp_path).items():  # the same batches in the same order: the same losses
        assert loss == pytest.approx(losses(uninterrupted)[step], rel=1e-5, abs=1e-6), step
    # the mean over all 12 steps, not transformers' over the resumed ones
    assert out["metrics"]["train_loss"] == pytest.approx(whole["metrics"]["train_loss"], abs=2e-4)
    later = sum(losses(tmp_path).values()) / (12 - kept)
    assert abs(later - whole["metrics"]["train_loss"]) > 1e-3  # the check can fail: the resumed steps' mean differs
    assert out["loads"] and all(w is True for w in out["loads"]), out["loads"]  # optimizer, scheduler, RNG

    if kept == 4:
        # the run's checkpoints are still there (outside a stage nothing removes them), but a changed run, another
        # learning rate and so another key, does not resume them: it trains from step 1 in a folder of its own
        changed = run(tmp_path, 2, "0.002", MAX_STEPS)
        assert changed.returncode == 0, changed.stderr[-3000:]
        assert sorted(losses(tmp_path)) == list(range(1, 13))
        assert len(list((tmp_path / ".checkpoints").iterdir())) == 2


def test_a_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    diverged = run(tmp_path, 2, fault="nan@step:5")
    assert diverged.returncode == 1
    assert "Traceback" not in diverged.stderr
    (folder,) = (tmp_path / ".checkpoints").iterdir()
    assert "training diverged: the loss is nan at optimizer step 5" in diverged.stderr
    assert f"the last good checkpoint, {folder.relative_to(tmp_path) / 'checkpoint-4'}, is kept" in diverged.stderr
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not (tmp_path / "out.json").exists()


def test_a_non_finite_gradient_norm_stops_training_naming_the_step():
    """The second check, for a finite loss whose gradients overflow: run before every optimizer step."""
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from pipeline.training.checkpoints import Diverged, _FiniteGradients

    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    guard = _FiniteGradients("sft", None)
    args, state = TrainingArguments(output_dir="unused", report_to="none"), TrainerState(global_step=6)
    guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)  # finite: nothing happens
    model.weight.grad[0, 0] = float("inf")
    with pytest.raises(Diverged, match="sft: training diverged: the gradient norm is inf at optimizer step 7"):
        guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
