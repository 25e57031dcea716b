"""Experiment trackers beside dvclive (the `tracking` section), and curves readable while a stage trains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from transformers import TrainerCallback

from pipeline.core import params, phases
from pipeline.core.io import ConfigError, live_atomic_dir
from pipeline.core.params import parse_section
from pipeline.modeling.models import build_student, train_tokenizer
from pipeline.orchestration.sections import SECTIONS
from pipeline.training import checkpoints, trackers
from pipeline.training.params import TRACKERS, TrackingConfig
from pipeline.training.trainer import PLACE_ARGS, sft_train

PROMPT, COMPLETION = "Tom has 3 apples and buys 4 more. How many?\n", "Step 1: 3 + 4 = 7.\nAnswer: 7"
STEPS = 6


def test_every_tracker_name_is_a_transformers_integration():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(TRACKERS) <= set(INTEGRATION_TO_CALLBACK) - {"dvclive"}


def test_a_tracker_that_is_not_installed_is_named_at_validation():
    with pytest.raises(ConfigError,
                       match=r"tracking.*report_to.*wandb: its package is not installed \(pip install wandb\)"):
        parse_section("tracking", SECTIONS["tracking"], {"report_to": ["wandb"]}, "params.yaml")
    with pytest.raises(ConfigError, match="report_to"):
        parse_section("tracking", SECTIONS["tracking"], {"report_to": ["dvclive"]}, "params.yaml")  # attached always


def test_the_phase_is_read_from_the_dvclive_folder():
    assert trackers.phase_of(Path("plots/.sft.tmp-123-abc"), "sft") == ""
    assert trackers.phase_of(Path("plots/.sft.tmp-123-abc/phase2"), "sft") == "phase2"
    assert trackers.phase_of(Path("plots/sft/rank_drill"), "sft") == "rank_drill"


class Probe(TrainerCallback):
    """At the third log, what a reader outside the process sees: the TensorBoard events and dvclive's curve through
    the `.live` link (the stage has not ended: its folder is still the temporary one)."""

    def __init__(self, runs: Path, link: Path) -> None:
        self.runs, self.link, self.logs, self.seen = runs, link, 0, None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in (logs or {}):
            self.logs += 1
            if self.logs == 3:
                loss_tsv = self.link / "plots" / "metrics" / "loss.tsv"
                self.seen = {"tensorboard": len(scalars(self.runs, "train/loss")),
                             "dvclive": len(loss_tsv.read_text().splitlines()) - 1 if loss_tsv.exists() else 0}


def scalars(runs: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one tag over every event file under `runs`, read as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for folder in sorted({p.parent for p in runs.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out += [(e.step, e.value) for e in acc.Scalars(tag)]
    return out


def column(tsv: Path) -> list[float]:
    return [float(line.split("\t")[1]) for line in tsv.read_text().splitlines()[1:]]


def test_a_tiny_sft_with_tensorboard_writes_the_scalars_dvclive_writes_as_it_trains(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from pipeline.modeling.params import BaseModelConfig
    from pipeline.training.params import TrainConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(params, "_given", {**params._given})  # taken back after the test
    params.give(TrackingConfig(report_to=["tensorboard"], logging_dir="runs"))  # as run_stage hands it over
    monkeypatch.delenv(trackers.TENSORBOARD_DIR, raising=False)
    monkeypatch.setattr(phases, "current_stage", "sft")
    tok = train_tokenizer([PROMPT + COMPLETION] * 30, 300)
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64), tok)
    rows = [{"prompt": PROMPT, "rationale": COMPLETION}] * 8
    cfg = TrainConfig(max_steps=STEPS, per_device_train_batch_size=2, logging_steps=1, eval_steps=3,
                      learning_rate=1e-2, max_eval_samples=4)
    final = Path("plots/sft")
    probe = Probe(Path("runs"), Path("plots/sft.live"))
    real_train = checkpoints.train
    monkeypatch.setattr(checkpoints, "train", lambda trainer, *a, **k: (trainer.add_callback(probe),
                                                                        real_train(trainer, *a, **k))[1])
    with live_atomic_dir(final) as live:
        metrics = sft_train(cfg, model, tok, rows, rows[:4], tmp_path / "work", live)
        assert os.readlink("plots/sft.live") == live.name  # the run's temporary folder, while it lasts
    assert not Path("plots/sft.live").is_symlink() and (final / "plots" / "metrics" / "loss.tsv").exists()
    assert metrics["steps"] == STEPS
    # both were readable mid-run: three steps logged of six
    assert probe.seen == {"tensorboard": 3, "dvclive": 3}
    # the event files sit under runs/<stage>/<commit>-<start>/ and hold the losses dvclive wrote, step by step
    (run,) = Path("runs/sft").iterdir()
    assert run.name.startswith(f"{trackers.version()}-")
    train = scalars(Path("runs"), "train/loss")
    assert [step for step, _ in train] == list(range(1, STEPS + 1))
    assert [value for _, value in train] == pytest.approx(column(final / "plots/metrics/loss.tsv"), rel=1e-6)
    evals = scalars(Path("runs"), "eval/loss")
    assert len(evals) >= 2 and [v for _, v in evals] == pytest.approx(column(final / "plots/metrics/eval/loss.tsv"),
                                                                       rel=1e-6)
    # what dvclive records of the arguments (a DVC output) does not depend on the trackers
    recorded = yaml.safe_load((final / "params.yaml").read_text())
    assert not set(PLACE_ARGS) & set(recorded)


def test_without_trackers_the_trainers_report_to_none(tmp_path, monkeypatch):
    assert trackers.arguments(tmp_path / "plots" / "sft") == {"report_to": "none"}


def test_no_stage_declares_the_tracking_section_among_its_params():
    """Adding a tracker re-runs nothing: DVC does not see the section."""
    stages = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())["stages"]
    named = [p for stage in stages.values() for entry in stage.get("params", [])
             for p in (entry if isinstance(entry, dict) else {entry: None})]
    assert named and not any(str(p).split(".")[0] == "tracking" for p in named)
