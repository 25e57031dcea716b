"""python bench/grpo_step.py [--steps 12]

GRPO step time, side by side in one process on the same model (models/sft), data
(data/mine/rl.parquet), rewards and batch (grpo.prompts_per_step x grpo.num_generations):
1. the pipeline's GRPO (pipeline.rl.grpo: TRL GRPOTrainer with the pipeline's rollout
   function, guided replay off so both runs do the same work);
2. the same, guided replay on (the default: decoding plus grading and the gold swap);
3. raw TRL GRPOTrainer with the same GRPOConfig, generating with its own
   `model.generate` path.
Prints median seconds per optimizer step and the ratio to raw TRL (< 1: faster).
Needs data/mine and models/sft (run `make run` first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOTrainer  # noqa: E402

from pipeline.core import paths  # noqa: E402
from pipeline.core.io import read_rows  # noqa: E402
from pipeline.core.params import load_section  # noqa: E402
from pipeline.modeling.models import load_model  # noqa: E402
from pipeline.rl.grpo import GuidedRollout, grpo_args, rl_dataset  # noqa: E402
from pipeline.rl.params import GRPOStageConfig, RewardsConfig
from pipeline.rl.rewards import build_rewards  # noqa: E402
from pipeline.training.trainer import StepTimer  # noqa: E402


def median_step(cfg: GRPOStageConfig, rewards: RewardsConfig, rows: list[dict], out: Path, rollout: str,
                warmup: int = 2) -> float:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    model, tokenizer = load_model(paths.model_dir("sft"))
    funcs, weights = build_rewards(rewards)
    extra = {}
    if rollout != "trl":
        extra["rollout_func"] = GuidedRollout(
            {r["prompt"]: r for r in rows}, num_generations=cfg.num_generations,
            max_new_tokens=cfg.max_completion_length, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
            replay=rollout == "replay",
        )
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=grpo_args(cfg, weights, out, logging_steps=10**6),
                          train_dataset=rl_dataset(rows), processing_class=tokenizer, callbacks=[timer], **extra)
    trainer.train()
    return statistics.median(timer.times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    cli = parser.parse_args()
    cfg = load_section("grpo", GRPOStageConfig).model_copy(update={"max_steps": cli.steps, "algorithm": "grpo"})
    rewards = load_section("rewards", RewardsConfig)
    rows = read_rows(paths.split_file("rl", stage="mine"))
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "raw TRL GRPOTrainer (model.generate)": median_step(cfg, rewards, rows, Path(tmp) / "raw", "trl"),
            "pipeline GRPO, guided replay off": median_step(cfg, rewards, rows, Path(tmp) / "off", "plain"),
            "pipeline GRPO, guided replay on (default)": median_step(cfg, rewards, rows, Path(tmp) / "on", "replay"),
        }
    base = results["raw TRL GRPOTrainer (model.generate)"]
    print(f"{cfg.prompts_per_step} prompts x {cfg.num_generations} rollouts per step, "
          f"median seconds per optimizer step over {cli.steps} steps:")
    for name, seconds in results.items():
        print(f"  {name:45s} {seconds:7.3f} s   {seconds / base:5.2f}x raw TRL")


if __name__ == "__main__":
    main()
