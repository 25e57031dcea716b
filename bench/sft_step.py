"""python bench/sft_step.py [--steps 30]

SFT step time, side by side in one process on the same model, data and batch:
1. the pipeline's SFT (pipeline.training.trainer.trainer_args and sft_trainer_class: TRL's SFTTrainer with CPU
   settings and length-grouped batches, and without CUDA its loss through the model's plain LM head);
2. TRL's own SFTTrainer (its fused LM head) with the same settings and batches;
3. raw TRL SFTTrainer with the same settings but random batches;
4. raw TRL SFTTrainer with TRL's own defaults (bf16 autocast, gradient
   checkpointing) and `use_cpu=True`, which TRL demands on a machine without CUDA.
Needs data/synthesize and models/base (run `make run` first).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from trl import SFTConfig as TRLSFTConfig
from trl import SFTTrainer

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import give
from pipeline.modeling.models import load_model
from pipeline.orchestration.sections import load_named, run_settings
from pipeline.training.trainer import StepTimer, prompt_completion_dataset, sft_trainer_class, trainer_args


def median_step(args: TRLSFTConfig, rows: list[dict], warmup: int = 3, trainer_class=SFTTrainer) -> float:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # each trainer sets its own precision
    model, tokenizer = load_model(paths.model_dir("base"))
    timer = StepTimer()
    trainer = trainer_class(model=model, args=args, train_dataset=prompt_completion_dataset(rows),
                         processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    return statistics.median(timer.times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    cli = parser.parse_args()
    give(*run_settings())  # how models load, checkpoints and trackers, as a stage run here has them
    cfg = load_named("sft").model_copy(update={"max_steps": cli.steps, "eval_steps": 10**6, "logging_steps": 10**6})
    rows = read_rows(paths.split_file("train"))
    with tempfile.TemporaryDirectory() as tmp:
        ours = trainer_args(cfg, Path(tmp) / "ours")
        ours.eval_strategy = "no"
        raw_same = trainer_args(cfg, Path(tmp) / "raw")
        raw_same.eval_strategy, raw_same.train_sampling_strategy = "no", "random"
        raw_default = TRLSFTConfig(
            output_dir=str(Path(tmp) / "default"), max_steps=max(cli.steps // 2, 8), report_to="none",
            per_device_train_batch_size=cfg.per_device_train_batch_size, learning_rate=cfg.learning_rate,
            save_strategy="no", seed=cfg.seed,  # bf16 and checkpointing stay TRL's defaults
            use_cpu=not torch.cuda.is_available(),
        )
        if torch.cuda.is_available():
            # The first trainer of a process pays CUDA's start-up (context, kernels, allocator): an untimed run first,
            # or the row measured first looks slower (it did on an H200: BENCHMARKS.md).
            median_step(ours, rows, trainer_class=sft_trainer_class())
        results = {
            "pipeline SFT": median_step(ours, rows, trainer_class=sft_trainer_class()),
            "TRL's SFTTrainer (its fused LM head), same settings and batches": median_step(ours, rows),
            "raw TRL, same settings, random batches": median_step(raw_same, rows),
            "raw TRL defaults (bf16, gradient checkpointing)": median_step(raw_default, rows),
        }
    base = results["pipeline SFT"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"batch {cfg.per_device_train_batch_size} on {device}, median seconds per optimizer step:")
    for name, seconds in results.items():
        print(f"  {name:66s} {seconds:.3f} s  ({seconds / base:.2f}x the pipeline)")


if __name__ == "__main__":
    main()
