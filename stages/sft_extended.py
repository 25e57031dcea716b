"""python -m stages.sft_extended

The compute-matched baseline for GRPO: SFT on the gold rationales continues
from models/sft for as much compute as GRPO spent (`token_passes` in the
manifest of models/grpo, which holds GRPO's metrics without their timings:
its rollout tokens times the forward-pass equivalents each cost), times
`sft_extended.compute_factor`. An SFT step costs three passes per token it
trains on, and its tokens are the rows' mean length times the sequences per
step, so the step count is fixed before training from counts alone: the same
on every machine, whatever its speed.

Same optimizer settings as `sft` except the learning rate and schedule of this
section (the model is already at SFT's plateau; the full rate would undo it).
"""

from __future__ import annotations

import shutil

from pipeline.core import paths
from pipeline.core.io import InputError, atomic_dir, live_atomic_dir, read_json, read_rows, write_metrics
from pipeline.core.params import load_section
from pipeline.core.phases import stage_logger
from pipeline.data.task_data import gold_rows
from pipeline.modeling import cards, chat
from pipeline.modeling.models import MASTER_DTYPE, load_model, save_model
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.training.params import SFTConfig, SFTExtendedConfig
from pipeline.training.trainer import sft_train

SFT_PASSES_PER_TOKEN = 3  # forward and backward, in forward-pass equivalents (pipeline.rl.grpo.passes_per_token)


def planned_steps(target_passes: float, tokens_per_step: float) -> int:
    """Optimizer steps that spend `target_passes` token passes, `tokens_per_step` a step (at least one)."""
    return max(1, round(target_passes / (SFT_PASSES_PER_TOKEN * tokens_per_step)))


def tokens_per_step(tokenizer, rows: list[dict], sft: SFTConfig) -> float:
    """Tokens one SFT step trains on: the rows' mean prompt-and-rationale length as the model reads it (end of
    sequence included, cut at `sft.max_length`) times the sequences per optimizer step."""
    texts = [chat.render(tokenizer, r["prompt"]) + r["rationale"] for r in rows[: sft.max_train_samples]]
    lengths = [min(len(ids) + 1, sft.max_length) for ids in tokenizer(texts)["input_ids"]]
    return sum(lengths) / max(len(lengths), 1) * sft.per_device_train_batch_size * sft.gradient_accumulation_steps


def _flow(cfg: SFTExtendedConfig, sft: SFTConfig) -> None:
    grpo_file = paths.model_dir("grpo") / paths.MODEL_MANIFEST
    grpo = read_json(grpo_file).get("metrics", {})
    if "token_passes" not in grpo:
        raise InputError(f"{grpo_file}: missing key metrics.token_passes (re-run its stage: dvc repro grpo)")
    target = grpo["token_passes"] * cfg.compute_factor
    train_file, val_file = paths.split_file("train"), paths.split_file("val")
    rows = gold_rows(sft.rationale_share)  # the rows SFT had: the compute-matched baseline sees no more rationales
    val_rows = read_rows(val_file, required=("prompt", "rationale"))
    model, tokenizer = load_model(paths.model_dir("sft"), dtype=MASTER_DTYPE)
    per_step = tokens_per_step(tokenizer, rows, sft)
    steps = planned_steps(target, per_step)
    with atomic_dir(paths.model_dir("sft_extended")) as out, live_atomic_dir(paths.live_dir("sft_extended")) as live:
        metrics = sft_train(
            sft, model, tokenizer, rows, val_rows, out / ".trainer", live, max_steps=steps,
            learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=0.0,
            eval_steps=max(1, steps // 4),
        )
        metrics = {"target_token_passes": round(target), "tokens_per_step": round(per_step, 1),
                   "planned_steps": steps, **metrics}
        stage_logger().info("sft_extended: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        save_model(model, tokenizer, out)
        cards.write_model_manifest(out, "sft_extended", cfg, inputs=[paths.model_dir("sft"), train_file, val_file],
                                   metrics=metrics, sft=sft.model_dump(mode="json"))
    write_metrics(paths.metrics_file("sft_extended"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("sft_extended", SFTExtendedConfig)
        sft = load_section("sft", SFTConfig)
    run_stage("sft_extended", _flow, cfg, sft)


if __name__ == "__main__":
    main()
