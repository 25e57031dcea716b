"""python -m experiments.drill_variants --seeds 0 1 2 --colour-steps 2000 --variants '{"name": "lr3e-4", "lr": 3e-4}' \
...

Which numbers drill learns the lookup from most inits? For each seed, stage
base's colour drill once (its tokenizer, a fresh student at that seed, the
drill tables of `base.drills.seed`; every step, no early stop), then each variant of the numbers drill
from a copy of that drilled student and of the table stream, so the variants
differ in nothing but their own keys:

- lr: peak learning rate (default base.drills.learning_rate)
- steps: optimizer steps (default base.drills.number_steps)
- task: lookup (one key asked, the stage's) or multi (every key in turn)
- mix: share of each batch that stays colour drills (every key in turn), so the
  lookup circuit the colour drill built keeps a gradient while number values
  arrive (0: the stage's drill)
- batch: drills per step (default base.drills.batch_size)

Prints one JSON line per (seed, variant): colour and numbers held-out exact
match (numbers also by key kind), and seconds. Needs data/synthesize; nothing is
saved. Results depend on the thread count (`--threads`).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time

import torch

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import load_section
from pipeline.data.cof.tables import random_table
from pipeline.data.params import SynthesizeConfig
from pipeline.inference.generation import pad_id
from pipeline.modeling.models import base_model, build_student
from pipeline.modeling.params import BaseModelConfig
from pipeline.training.drills import drill, encode, exact, fit, table_row, train_drills

KEYS = {"name", "lr", "steps", "task", "mix", "batch"}


def numbers_drill(model, tokenizer, cfg, synth, rng: random.Random, variant: dict, val) -> dict:
    lr = variant.get("lr", cfg.learning_rate)
    steps = variant.get("steps", cfg.number_steps)
    task, mix = variant.get("task", "lookup"), variant.get("mix", 0.0)
    size = variant.get("batch", cfg.batch_size)
    colour = round(mix * size)

    def batch():
        numbers = [encode(tokenizer, *drill(task, table_row(random_table(rng, synth)), rng, "chart"))
                   for _ in range(size - colour)]
        return numbers + [encode(tokenizer, *drill("multi", table_row(random_table(rng, synth)), rng, "colour"))
                          for _ in range(colour)]

    losses = []
    fit(model, pad_id(tokenizer), steps, batch, lr, lambda step, loss: losses.append(round(loss, 4)))
    scores = exact(model, tokenizer, val["chart"], by_kind=True)
    return {"numbers": scores.pop("all"), "by_key": {k: v for k, v in scores.items() if not k.startswith("n_")},
            "colour_after": exact(model, tokenizer, val["colour"])["all"], "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--colour-steps", type=int, default=None, help="default: base.drills.colour_steps")
    parser.add_argument("--colour-lr", type=float, default=None, help="default: base.drills.learning_rate")
    parser.add_argument("--colour-batch", type=int, default=None, help="default: base.drills.batch_size")
    parser.add_argument("--variants", nargs="+", default=['{"name": "stage"}'], help="JSON objects, keys " + str(KEYS))
    args = parser.parse_args()
    variants = [json.loads(v) for v in args.variants]
    for v in variants:
        if set(v) - KEYS:
            parser.error(f"unknown variant keys {sorted(set(v) - KEYS)}")
    torch.set_num_threads(args.threads)
    cfg = load_section("base", BaseModelConfig)
    colour_args = {"colour_steps": args.colour_steps, "learning_rate": args.colour_lr, "batch_size": args.colour_batch}
    # every colour step runs (no early stop), so that the table stream below can be replayed step for step
    drills = cfg.drills.model_copy(update={"number_steps": 0, "check_every": 0} | {
        k: v for k, v in colour_args.items() if v is not None})
    synth = load_section("synthesize", SynthesizeConfig)
    rows = read_rows(paths.split_file("train"), required=("prompt", "rationale"))
    _, tokenizer = base_model(cfg, rows)
    for seed in args.seeds:
        start = time.time()
        model = build_student(cfg.model_copy(update={"seed": seed}), tokenizer)
        # train_drills draws its validation tables, then the colour drill's, from one stream; replay it to
        # hand each variant the stream where the stage's numbers drill would pick it up.
        rng = random.Random(drills.seed)
        val_tables = [table_row(random_table(rng, synth)) for _ in range(drills.val_tables)]
        val = {values: [drill("lookup", row, rng, values) for row in val_tables] for values in ("colour", "chart")}
        colour = train_drills(model, tokenizer, drills, synth).get("colour", {"exact": None})
        state = random.Random(drills.seed)
        for _ in range(len(val_tables)):
            random_table(state, synth)
        for values in ("colour", "chart"):
            for row in val_tables:
                drill("lookup", row, state, values)
        for _ in range(drills.colour_steps * drills.batch_size):
            drill("multi", table_row(random_table(state, synth)), state, "colour")
        colour_seconds = round(time.time() - start)
        for variant in variants:
            begin = time.time()
            result = numbers_drill(copy.deepcopy(model), tokenizer, cfg.drills, synth, copy.deepcopy(state),
                                   variant, val)
            print(json.dumps({"seed": seed, "variant": variant.get("name", str(variant)), "colour": colour["exact"],
                              "colour_seconds": colour_seconds, **result,
                              "seconds": round(time.time() - begin)}), flush=True)


if __name__ == "__main__":
    main()
