"""python bench/rank_probe.py [--init models/base] [--steps 2400] [--lr 1e-3] [--threads 1]

Can the student's architecture learn the ranking step that best-of-N and the
PRM miss most (README, "Where best-of-4 still loses")? Trains a saved model
(`--init`: the drilled `models/base`, or `models/sft`, the policy) on one drill
built like the rationales' ranking steps, on new random tables
(pipeline/cof/tables.random_table, first series):

  "<chart header>\\n<table line>\\nStep 1: Select all bars: Lions 15, Bears 16, Eagles 3.\\n
   Step 2: The largest of them is" -> " Bears 16."

asking the largest, smallest, second largest or second smallest (tables whose
values tie are skipped). Prints the greedy exact match on 200 held-out tables
before training and five times during it, per rank asked; a key of the list
picked at random gets about 1/4. The loss is on the answer only; AdamW, 5%
warm-up, cosine (pipeline/drills.fit). The held-out tables are drawn first
from the seeded stream, so a run repeats exactly. `--save DIR` keeps the
drilled model (e.g. to train a PRM from it in a scratch copy).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from pipeline.cof.tables import MARK_NOUNS, random_table
from pipeline.cof.verbalize import STEPS, format_prompt
from pipeline.config import SynthesizeConfig, load_section
from pipeline.drills import encode, exact, fit
from pipeline.generation import pad_id
from pipeline.models import load_model, save_model

# rank asked -> (the rationales' step function, its index in ascending order)
RANKS = {"largest": ("max_one_object", -1), "smallest": ("min_one_object", 0),
         "second largest": ("second_max", -2), "second smallest": ("second_min", 1)}


def rank_drill(rng: random.Random, synth: SynthesizeConfig) -> tuple[str, str, str]:
    """(prompt, target, rank asked) of one ranking drill on a new random table without ties."""
    while True:
        table = random_table(rng, synth)
        pairs = [(c, v[0]) for c, v in zip(table["categories"], table["values"])]
        if len({v for _, v in pairs}) == len(pairs) and len(pairs) >= 3:
            break
    head, line = format_prompt(table, "x").split("\n")[:2]
    rank = rng.choice(list(RANKS))
    function, index = RANKS[rank]
    key, value = sorted(pairs, key=lambda p: p[1])[index]
    # the steps worded as the rationales word them (pipeline/cof/verbalize.STEPS); the answer is the value slot
    nouns = MARK_NOUNS[table["chart_type"]][1]
    listed = STEPS["select_all"].format(nouns=nouns, v=", ".join(f"{c} {v}" for c, v in pairs))
    asked = STEPS[function].split("{v}")[0].rstrip()
    return f"{head}\n{line}\nStep 1: {listed}\nStep 2: {asked}", f" {key} {value}.", rank


def scores(model, tokenizer, val: list[tuple[str, str, str]]) -> dict:
    """Greedy exact match on the held-out drills, in all and per rank asked."""
    out = {"all": exact(model, tokenizer, [(p, t) for p, t, _ in val])["all"]}
    for rank in RANKS:
        out[rank] = exact(model, tokenizer, [(p, t) for p, t, r in val if r == rank])["all"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", type=Path, default=Path("models/base"))
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", type=Path, default=None, help="save the drilled model and tokenizer here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    synth = load_section("synthesize", SynthesizeConfig)
    model, tokenizer = load_model(args.init)
    rng = random.Random(args.seed)
    val = [rank_drill(rng, synth) for _ in range(args.val)]
    print(json.dumps({"init": str(args.init), "step": 0, "exact": scores(model, tokenizer, val)}), flush=True)

    def batch():
        return [encode(tokenizer, *rank_drill(rng, synth)[:2]) for _ in range(args.batch_size)]

    def report(step: int, loss: float) -> None:
        print(json.dumps({"step": step, "loss": round(loss, 4), "exact": scores(model, tokenizer, val)}), flush=True)

    fit(model, pad_id(tokenizer), args.steps, batch, args.lr, report)
    if args.save:
        save_model(model, tokenizer, args.save)


if __name__ == "__main__":
    main()
