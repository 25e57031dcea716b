"""python -m stages.sft

Supervised fine-tuning of models/base on the gold Chain-of-Functions
rationales with TRL's SFTTrainer (loss on the completion only). Curves go
through dvclive into plots/sft/, the summary into metrics/sft.json, the model
into models/sft/.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path


from trl import SFTConfig as TRLSFTConfig
from trl import SFTTrainer

from pipeline import paths
from pipeline.config import SFTConfig, load_section
from pipeline.flows import expected_errors, run_stage, stage_logger
from pipeline.io import atomic_dir, read_rows, write_json, write_manifest
from pipeline.models import load_model, save_model
from pipeline.training import device_kwargs, dvclive_callback, prompt_completion_dataset, snapshot, weights_changed


def trainer_args(cfg: SFTConfig, output_dir: Path) -> TRLSFTConfig:
    return TRLSFTConfig(
        output_dir=str(output_dir),
        seed=cfg.seed,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        per_device_eval_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type=cfg.lr_scheduler_type,
        weight_decay=cfg.weight_decay,
        max_length=cfg.max_length,
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
        completion_only_loss=True,
        eval_strategy="steps",
        eval_steps=cfg.eval_steps,
        logging_steps=cfg.logging_steps,
        save_strategy="no",  # DVC keeps the one model that matters; no checkpoints
        report_to="none",  # dvclive is attached explicitly, with its folder
        **device_kwargs(),
        dataloader_num_workers=0,
    )


def run(cfg: SFTConfig, model, tokenizer, train_rows, val_rows, work_dir: Path, live_dir: Path) -> dict:
    """Train in place; returns the summary metrics."""
    train = prompt_completion_dataset(train_rows[: cfg.max_train_samples])
    val = prompt_completion_dataset(val_rows[: cfg.max_eval_samples])
    before = snapshot(model)
    trainer = SFTTrainer(
        model=model,
        args=trainer_args(cfg, work_dir),
        train_dataset=train,
        eval_dataset=val,
        processing_class=tokenizer,
        callbacks=[dvclive_callback(live_dir)],
    )
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    final_eval = trainer.evaluate()
    # TRL logs the running count of trained (non-padding) tokens as `num_tokens`.
    tokens = max((log.get("num_tokens", 0) for log in trainer.state.log_history), default=0)
    return {
        "train_loss": round(result.training_loss, 4),
        "eval_loss": round(final_eval["eval_loss"], 4),
        "steps": result.global_step,
        "examples": len(train),
        "train_seconds": round(seconds, 1),
        "tokens_per_second": round(tokens / seconds, 1),
        "weights_changed": round(weights_changed(before, model), 3),
    }


def _flow(cfg: SFTConfig) -> None:
    train_file, val_file = paths.split_file("train"), paths.split_file("val")
    train_rows = read_rows(train_file, required=("prompt", "rationale"))
    val_rows = read_rows(val_file, required=("prompt", "rationale"))
    model, tokenizer = load_model(paths.model_dir("base"))
    with atomic_dir(paths.model_dir("sft")) as out, atomic_dir(paths.live_dir("sft")) as live:
        metrics = run(cfg, model, tokenizer, train_rows, val_rows, out / ".trainer", live)
        stage_logger().info("sft: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        save_model(model, tokenizer, out)
        write_manifest(
            out, "sft", cfg, inputs=[paths.model_dir("base"), train_file, val_file], name=paths.MODEL_MANIFEST,
            metrics=metrics,
        )
    write_json(paths.metrics_file("sft"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("sft", SFTConfig)
    run_stage("sft", _flow, cfg)


if __name__ == "__main__":
    main()
