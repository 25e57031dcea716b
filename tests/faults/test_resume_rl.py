"""Resume of GRPO (guided replay on), DPO and the PRM trainer, as tests/faults/test_resume.py proves it for SFT.

Each trainer's run (tests/faults/trainer_run.py: 8 optimizer steps of a tiny model through `rl_train`, `dpo_train`,
`prm_train`, past its first epoch) is killed at step 8 with a checkpoint every 3 steps; the next run continues from
step 6's checkpoint (in the second epoch, two steps in for GRPO and DPO, one for the PRM) and must be the uninterrupted
run's: exactly steps 7 and 8 trained, on the same batches (GRPO: the same prompts, the same rollouts and rewards), each
step's loss, the final weights bit for bit, and the metrics (timing keys aside) equal, GRPO's guided-replay counts
included. The last logged window (steps 5 to 8) straddles the checkpoint, so its logged loss and the metrics read
from it (GRPO's `kl_last`, DPO's `reward_margin_last`) must come out as an uninterrupted run's too. Run once more,
each resumes from its last checkpoint (step 8) and must train nothing and report the same weights and metrics.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.io import untimed
from tests.conftest import ROOT, venv_env

SCRIPT = ROOT / "tests/faults/trainer_run.py"
MODES = ("grpo", "dpo", "prm")
KILL, KEPT, STEPS = 8, 6, 8  # killed before step 8; checkpoints at 3 and 6


def run(folder: Path, modes: str, checkpoint_steps: int, fault: str | None = None) -> subprocess.CompletedProcess:
    folder.mkdir(exist_ok=True)
    repro = f"repro: {{lock_timeout: 0, checkpoint_steps: {checkpoint_steps}, resume: true}}\n"
    (folder / "params.yaml").write_text(repro)
    env = venv_env(PYTHONPATH=str(ROOT), **({"PIPELINE_FAULT": fault} if fault else {}))
    return subprocess.run([sys.executable, str(SCRIPT), modes], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300, start_new_session=True)


def out(folder: Path, mode: str) -> dict:
    data = json.loads((folder / f"{mode}.json").read_text())
    data["steps"] = {int(k): v for k, v in data["steps"].items()}
    return data


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("whole")
    done = run(folder, ",".join(MODES), 0)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (folder / ".checkpoints").exists()  # checkpoint_steps 0: none
    return folder


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, str]:
    """Each trainer killed in a process of its own, then one process that resumes all three."""
    folder = tmp_path_factory.mktemp("resumed")
    for mode in MODES:
        killed = run(folder, mode, 3, fault=f"kill@step:{KILL}")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert not (folder / f"{mode}.json").exists()
    again = run(folder, ",".join(MODES), 3)
    assert again.returncode == 0, again.stderr[-3000:]
    return folder, again.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory, resumed) -> Path:
    """The resumed runs' folder run once more: each resumes from its last checkpoint (step 8, the run's end), as a
    stage killed after training, before its outputs were in place, runs again (outside a stage nothing removed the
    checkpoints)."""
    folder = tmp_path_factory.mktemp("finished")
    shutil.copytree(resumed[0], folder, dirs_exist_ok=True)
    again = run(folder, ",".join(MODES), 3)
    assert again.returncode == 0, again.stderr[-3000:]
    return folder


@pytest.mark.parametrize("mode", MODES)
def test_a_killed_run_resumes_as_the_uninterrupted_run(uninterrupted, resumed, mode):
    folder, log = resumed
    (checkpoints,) = (folder / ".checkpoints").glob(f"{mode}-*")
    assert {p.name for p in checkpoints.glob("checkpoint-*")} == {f"checkpoint-{KEPT}", f"checkpoint-{STEPS}"}
    assert f"{mode}: resuming from {checkpoints.relative_to(folder)}/checkpoint-{KEPT} (step {KEPT})" in log
    whole, again = out(uninterrupted, mode), out(folder, mode)

    # exactly the remaining steps: none trained twice (a run started over), none skipped (a run that trained nothing)
    assert sorted(whole["steps"]) == list(range(1, STEPS + 1))
    assert sorted(again["steps"]) == list(range(KEPT + 1, STEPS + 1))
    for step, record in again["steps"].items():
        assert record == whole["steps"][step], step  # the same batch (GRPO: prompts, rollouts, rewards), the same loss
    # the check can fail: a run trained again from step 1 would meet other batches, and its first loss is not step 7's
    assert whole["steps"][1]["batches"] != whole["steps"][KEPT + 1]["batches"]
    assert whole["steps"][1]["loss"] != whole["steps"][KEPT + 1]["loss"]

    # every log, the checkpoint's earlier ones and the resumed run's own: the window open at the checkpoint (steps 5
    # to 8) averaged over all its steps, its loss too. Aside: the end-of-training summary's `train_loss`, transformers'
    # mean over the steps of its own call (`checkpoints.train` corrects the mean it returns, which the metrics report)
    def logs(run):
        return [{k: v for k, v in log.items() if k != "train_loss"} for log in run["logs"]]

    assert logs(again) == logs(whole) and [log["step"] for log in whole["logs"]] == [4, 8, 8]  # and the summary
    assert whole["logs"][1]["loss"] == pytest.approx(sum(whole["steps"][s]["loss"] for s in range(5, 9)) / 4)
    assert again["weights"] == whole["weights"]  # bit for bit
    assert again["metrics"]["steps"] == STEPS
    assert untimed(again["metrics"]) == untimed(whole["metrics"])


def test_grpo_sees_each_epoch_in_its_own_order_after_a_resume(uninterrupted, resumed):
    """TRL's RepeatSampler draws each epoch's order from its own generator, a fresh one in a resumed process: the
    checkpoint carries its state at the epoch's start (checkpoints.EPOCH_RNG_FILE)."""
    whole = out(uninterrupted, "grpo")["steps"]
    again = out(resumed[0], "grpo")["steps"]
    first_epoch = [whole[s]["prompts"] for s in range(1, 5)]
    second_epoch = [whole[s]["prompts"] for s in range(5, 9)]
    assert first_epoch != second_epoch  # the check can fail: the second epoch's order is another
    assert [again[s]["prompts"] for s in (7, 8)] == second_epoch[2:]


def test_guided_replay_counts_carry_on_over_a_resume(uninterrupted, resumed):
    """`GuidedRollout.stats` lives in memory: each checkpoint keeps it (checkpoints.STATE_FILE)."""
    whole, again = out(uninterrupted, "grpo"), out(resumed[0], "grpo")
    groups = STEPS * 2  # two prompts a step, every group wrong and replayed (an untrained model)
    assert whole["metrics"]["guided_replay"] == dict.fromkeys(("groups", "replayed_groups", "replayed_samples"), groups)
    assert again["metrics"]["guided_replay"] == whole["metrics"]["guided_replay"]
    assert again["steps"][KEPT + 1]["replay"]["groups"] == (KEPT + 1) * 2  # counted on from the checkpoint's
    (saved,) = (resumed[0] / ".checkpoints").glob(f"grpo-*/checkpoint-{KEPT}/pipeline_state-0.json")
    assert json.loads(saved.read_text())["objects"]["guided_replay"]["stats"]["groups"] == KEPT * 2


@pytest.mark.parametrize("mode, key, metric, digits", [("grpo", "kl", "kl_last", 5),
                                                        ("dpo", "rewards/margins", "reward_margin_last", 4)])
def test_the_last_logged_window_straddling_the_checkpoint_reports_the_uninterrupted_means(
        uninterrupted, resumed, mode, key, metric, digits):
    """These metrics (and GRPO's reward_last, DPO's reward_accuracy_last, constant in these runs) are TRL's means over
    the last logged window (steps 5 to 8); a resumed run's would cover only the steps it trained (7 and 8) unless the
    checkpoint carries the window (checkpoints.STATE_FILE)."""
    whole, again = out(uninterrupted, mode), out(resumed[0], mode)
    per_step = [whole["steps"][s]["trl"][key] for s in range(1, STEPS + 1)]
    window = round(sum(per_step[4:]) / 4, digits)
    assert whole["metrics"][metric] == window
    assert round(sum(per_step[6:]) / 2, digits) != window  # the check can fail: steps 7 and 8 alone give another mean
    assert again["metrics"][metric] == window


@pytest.mark.parametrize("mode", MODES)
def test_a_run_resumed_from_its_last_checkpoint_trains_nothing_and_reports_the_whole_run(uninterrupted, finished, mode):
    """It trains no step and ends with the checkpoint's weights, and its metrics are still the whole run's: the loss
    of steps 1 to 8, the guided-replay counts of all 16 groups, the last logged window's means."""
    whole, again = out(uninterrupted, mode), out(finished, mode)
    assert again["steps"] == {}
    assert again["weights"] == whole["weights"]
    assert untimed(again["metrics"]) == untimed(whole["metrics"])
