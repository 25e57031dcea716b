"""python -m experiments.rl_sweep '{"learning_rate": 3e-4, "guided_replay": false}' [...more JSON overrides]

One GRPO (or TBRM) or DPO run per JSON argument, from models/sft on data/mine, each
followed by greedy test accuracy (and ood with --ood): the quick loop behind the
sweep tables of docs/experiments/rl-sweep-5-epoch-student.md. Keys are `grpo` params; also `"weights": {...}` for the
`rewards` weights, `"drop_buckets": ["unsolved"]` to leave mined buckets out, and
`"dpo": {...}` to run DPO with those `dpo` params instead. Nothing under models/ changes.
Needs data/mine and models/sft (run `make run` first).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from pipeline.core import paths  # noqa: E402
from pipeline.core.io import read_rows  # noqa: E402
from pipeline.core.params import load_section  # noqa: E402
from pipeline.evaluation.metrics import score, summarize  # noqa: E402
from pipeline.inference.generation import LocalSampler  # noqa: E402
from pipeline.modeling.models import load_model  # noqa: E402
from pipeline.rl.params import DPOStageConfig, GRPOStageConfig, RewardsConfig


def greedy_accuracy(model, tokenizer, splits: list[str]) -> dict[str, float]:
    sampler = LocalSampler(model, tokenizer, batch_size=64)
    out = {}
    for split in splits:
        rows = read_rows(paths.split_file(split))
        gens = sampler.sample([r["prompt"] for r in rows], n=1, temperature=0.0, max_new_tokens=192)
        out[split] = summarize([score(r, g[0].text, g[0].tokens) for r, g in zip(rows, gens)])["accuracy"]
    return out


def run(overrides: dict, splits: list[str], work: Path) -> dict:
    from pipeline.rl.grpo import rl_train
    from pipeline.training.trainer import dpo_train

    overrides = dict(overrides)
    model, tokenizer = load_model(paths.model_dir("sft"))
    if "dpo" in overrides:
        cfg = load_section("dpo", DPOStageConfig).model_copy(update=overrides.pop("dpo"))
        pairs = read_rows(paths.split_file("pairs", stage="mine"))
        metrics = dpo_train(cfg, model, tokenizer, pairs, work / "dpo", work / "dpo-live")
    else:
        rewards = load_section("rewards", RewardsConfig)
        if "weights" in overrides:
            rewards = RewardsConfig(**{**rewards.model_dump(), "weights": overrides.pop("weights")})
        drop = set(overrides.pop("drop_buckets", []))
        cfg = GRPOStageConfig(**{**load_section("grpo", GRPOStageConfig).model_dump(), **overrides})
        rows = [r for r in read_rows(paths.split_file("rl", stage="mine")) if r["bucket"] not in drop]
        metrics = rl_train(cfg, rewards, model, tokenizer, rows, work / "rl", work / "rl-live")
    return {**metrics, **{f"greedy_{k}": v for k, v in greedy_accuracy(model, tokenizer, splits).items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("overrides", nargs="+", help="one JSON object of params overrides per run")
    parser.add_argument("--ood", action="store_true", help="also greedy accuracy on ood")
    cli = parser.parse_args()
    splits = ["test", "ood"] if cli.ood else ["test"]
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_model(paths.model_dir("sft"))
        print("sft", json.dumps(greedy_accuracy(model, tokenizer, splits)), flush=True)
        for i, text in enumerate(cli.overrides):
            result = run(json.loads(text), splits, Path(tmp) / str(i))
            print(text, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
