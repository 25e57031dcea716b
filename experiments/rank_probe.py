"""python -m experiments.rank_probe [--init models/sft] [--curriculum 1200,1200] [--steps 7200] [--replay 8] \
[--lr 1e-3] [--threads 1] [--save DIR]

Can the student's architecture learn the ranking step that best-of-N and the
PRM miss most (docs/experiments/best-of-n-on-500-questions.md)? Runs the `sft` stage's
ranking drill (its last phase, `sft.rank_drill`; pipeline/drills.train_rank_drill:
"The largest of them is" after a listed set, worded as the rationales word it,
on new random tables) on a saved model (`--init`: the drilled `models/base`, or
`models/sft`, which has had the stage's drill, or an undrilled SFT student, e.g.
`sft.rank_drill` with no steps in a scratch copy of the repo) with the
curriculum, step count and learning rate given, outside the DAG. `--curriculum 1200,1200`: 1,200 steps asking the
largest alone, 1,200 asking largest and smallest, then `--steps` on every rank.
`--replay 8`: 8 gold rows of data/synthesize/train.parquet in each batch.
Prints the loss and the greedy exact match on the held-out tables five times
a phase (a key of the list at random gets about 1/4), then the drill's
metrics, per rank asked and per phase. `--save DIR` keeps the drilled model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import load_section
from pipeline.data.params import SynthesizeConfig
from pipeline.modeling.models import load_model, save_model
from pipeline.training.drills import train_rank_drill
from pipeline.training.params import RankDrillConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", type=Path, default=Path("models/sft"))
    parser.add_argument("--curriculum", default="", help="comma-separated steps of each phase (phase i: the first "
                        "i + 1 ranks) before --steps on every rank")
    parser.add_argument("--steps", type=int, default=7200)
    parser.add_argument("--replay", type=int, default=0, help="gold rows beside the drills in each batch")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", type=Path, default=None, help="save the drilled model and tokenizer here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    synth = load_section("synthesize", SynthesizeConfig)
    cfg = RankDrillConfig(seed=args.seed, steps=args.steps,
                          curriculum=[int(n) for n in args.curriculum.split(",") if n], learning_rate=args.lr,
                          batch_size=args.batch_size, replay=args.replay, val_tables=args.val)
    gold = read_rows(paths.split_file("train"), required=("prompt", "rationale")) if args.replay else []
    model, tokenizer = load_model(args.init)

    def log(name: str, step: int, value: float) -> None:
        print(json.dumps({"step": step, name: round(value, 4)}), flush=True)

    print(json.dumps({"init": str(args.init)} | train_rank_drill(model, tokenizer, cfg, synth, log, replay=gold)),
          flush=True)
    if args.save:
        save_model(model, tokenizer, args.save)


if __name__ == "__main__":
    main()
