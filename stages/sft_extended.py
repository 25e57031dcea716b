"""python -m stages.sft_extended

The compute-matched baseline for GRPO: SFT on the gold rationales continues
from models/sft for as long as GRPO trained (metrics/grpo.json, train_seconds,
times `sft_extended.time_factor`). The step count is fixed before training from
the SFT stage's own measured seconds per step (metrics/sft.json), so the run is
deterministic for its inputs; the seconds it really took are reported beside
the target.

Same optimizer settings as `sft` except the learning rate and schedule of this
section (the model is already at SFT's plateau; the full rate would undo it).
"""

from __future__ import annotations

import shutil

from pipeline import paths
from pipeline.config import SFTConfig, SFTExtendedConfig, load_section
from pipeline.flows import expected_errors, run_stage, stage_logger
from pipeline.io import InputError, atomic_dir, read_json, read_rows, write_json, write_manifest
from pipeline.models import load_model, save_model
from pipeline.task_data import gold_rows
from pipeline.training import sft_train


def planned_steps(target_seconds: float, sft_metrics: dict) -> int:
    """Optimizer steps that take `target_seconds` at SFT's measured pace (at least one)."""
    pace = sft_metrics["train_seconds"] / max(sft_metrics["steps"], 1)
    return max(1, round(target_seconds / pace))


def _flow(cfg: SFTExtendedConfig, sft: SFTConfig) -> None:
    grpo_file, sft_file = paths.metrics_file("grpo"), paths.metrics_file("sft")
    grpo, sft_metrics = read_json(grpo_file), read_json(sft_file)
    for name, data, key in ((grpo_file, grpo, "train_seconds"), (sft_file, sft_metrics, "steps")):
        if key not in data:
            raise InputError(f"{name}: missing key {key!r} (re-run its stage: dvc repro)")
    target = grpo["train_seconds"] * cfg.time_factor
    steps = planned_steps(target, sft_metrics)
    train_file, val_file = paths.split_file("train"), paths.split_file("val")
    rows = gold_rows(sft.rationale_share)  # the rows SFT had: the compute-matched baseline sees no more rationales
    val_rows = read_rows(val_file, required=("prompt", "rationale"))
    model, tokenizer = load_model(paths.model_dir("sft"))
    with atomic_dir(paths.model_dir("sft_extended")) as out, atomic_dir(paths.live_dir("sft_extended")) as live:
        metrics = sft_train(
            sft, model, tokenizer, rows, val_rows, out / ".trainer", live, max_steps=steps,
            learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=0.0,
            eval_steps=max(1, steps // 4),
        )
        metrics = {"target_seconds": round(target, 1), "planned_steps": steps, **metrics}
        stage_logger().info("sft_extended: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        save_model(model, tokenizer, out)
        write_manifest(out, "sft_extended", cfg, inputs=[paths.model_dir("sft"), train_file, val_file],
                       name=paths.MODEL_MANIFEST, metrics=metrics, sft=sft.model_dump(mode="json"))
    write_json(paths.metrics_file("sft_extended"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("sft_extended", SFTExtendedConfig)
        sft = load_section("sft", SFTConfig)
    run_stage("sft_extended", _flow, cfg, sft)


if __name__ == "__main__":
    main()
