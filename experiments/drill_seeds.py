"""python -m experiments.drill_seeds --vocab-size 866 --seeds 0 1 2 3 [--threads 1] [--colour-steps N --number-steps N]

How often does an init learn the numeric lookup? For each seed, stage base's
recipe without the gate: its tokenizer (trained on the training corpus at
`--vocab-size`), a fresh student of `base`'s size at that seed, then
`base.drills` (pipeline/drills.train_drills) on the same seeded tables. Prints
one JSON line per seed: the colour and numbers drills' held-out exact match
(numbers also by key kind) and seconds. docs/experiments/numeric-lookup-clicks.md
quotes it for `base.drills.gate` and `restarts`. Needs data/synthesize
(`make run`); nothing is saved. Results depend on the thread count (`--threads`;
the same seed can read differently on one thread and on the default run's two).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import load_section
from pipeline.data.params import SynthesizeConfig
from pipeline.modeling.models import base_model, build_student
from pipeline.modeling.params import BaseModelConfig
from pipeline.training.drills import train_drills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=None, help="default: base.vocab_size")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--colour-steps", type=int, default=None, help="default: base.drills.colour_steps")
    parser.add_argument("--number-steps", type=int, default=None, help="default: base.drills.number_steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_section("base", BaseModelConfig)
    if args.vocab_size:
        cfg = cfg.model_copy(update={"vocab_size": args.vocab_size})
    steps = {"colour_steps": args.colour_steps, "number_steps": args.number_steps}
    cfg.drills = cfg.drills.model_copy(update={k: v for k, v in steps.items() if v is not None})
    synth = load_section("synthesize", SynthesizeConfig)
    rows = read_rows(paths.split_file("train"), required=("prompt", "rationale"))
    _, tokenizer = base_model(cfg, rows)  # the stage's own tokenizer (its undrilled model is not used)
    for seed in args.seeds:
        start = time.time()
        model = build_student(cfg.model_copy(update={"seed": seed}), tokenizer)
        checks = {}
        drills = train_drills(model, tokenizer, cfg.drills, synth, lambda name, step, value: checks.setdefault(
            name.split("/")[0], []).append([step, value]) if name.endswith("check_exact") else None)
        print(json.dumps({"vocab": len(tokenizer), "seed": seed, "colour": drills["colour"]["exact"],
                          "numbers": drills["numbers"]["exact"], "by_key": drills["numbers"]["exact_by_key"],
                          "steps": [drills["colour"]["steps"], drills["numbers"]["steps"]], "checks": checks,
                          "seconds": round(time.time() - start)}), flush=True)


if __name__ == "__main__":
    main()
