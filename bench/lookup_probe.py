"""python bench/lookup_probe.py --task lookup --steps 1500 [--lr 1e-3] [--fresh] [--format nocolon] [--base '{"num_hidden_layers": 4}']

Can the student's architecture learn to read a table, trained on that alone? A
fresh model of `base`'s config (models/base's tokenizer) is trained from scratch
on one drill built from the synthesized charts' header and table line:

- copy: "...table...\\nCopy:" -> " Wed 17, Thu 9, Fri 4." (every key and value, in order);
- lookup: "...table...\\nValue for Fri:" -> " Fri 4." (one key's value: associative recall);
- multi: the lookup, then every other key of the table asked in turn.

`--fresh` draws a new random table for every example (no table seen twice)
instead of the 6,000 training tables. Five times in the run it prints the
greedy exact-match rate on 200 validation tables (the copy drill for copy, the
single lookup otherwise); a value of the table picked at random gets 0.33.
The validation keys come from the same seeded stream after the training
drills, so a run repeats exactly (multi draws its drills differently, so it
asks other keys of the same tables). The README's "Does the student read the
table at all?" quotes it. One thread, batch 16; needs data/synthesize and
models/base (run `make run`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch

from pipeline import paths
from pipeline.cof.tables import random_table
from pipeline.cof.verbalize import format_prompt
from pipeline.config import BaseModelConfig, load_section
from pipeline.generation import pad as pad_batch, pad_id
from pipeline.io import read_rows
from pipeline.models import build_student, load_tokenizer

FORMATS = {"colon": ": ", "nocolon": " ", "tight": ":"}  # what sits between a key and its value in the table


def drill(task: str, row: dict, fmt: str, rng: random.Random) -> tuple[str, str]:
    """(prompt, target) of one drill on a synthesized row's chart."""
    table = json.loads(row["table"])
    head, line = row["prompt"].split("\n")[:2]
    line = line.replace(": ", FORMATS[fmt])
    pairs = [(c, v[0]) for c, v in zip(table["categories"], table["values"])]
    if task == "copy":
        return f"{head}\n{line}\nCopy:", " " + ", ".join(f"{c} {v:g}" for c, v in pairs) + "."
    if task == "multi":
        order = pairs[:]
        rng.shuffle(order)
        (c, v), rest = order[0], order[1:]
        return f"{head}\n{line}\nValue for {c}:", f" {c} {v:g}." + "".join(f"\nValue for {k}: {k} {x:g}." for k, x in rest)
    c, v = rng.choice(pairs)
    return f"{head}\n{line}\nValue for {c}:", f" {c} {v:g}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["copy", "lookup", "multi"], default="lookup")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--fresh", action="store_true", help="a new random table for every training example")
    parser.add_argument("--format", choices=sorted(FORMATS), default="colon")
    parser.add_argument("--base", default="{}", help="JSON overrides of the base params (the architecture)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng, table_rng = random.Random(0), random.Random(1)
    tokenizer = load_tokenizer(paths.model_dir("base"))
    overrides = json.loads(args.base)
    unknown = sorted(set(overrides) - set(BaseModelConfig.model_fields))
    if unknown:
        parser.error(f"--base: unknown base params {unknown}")
    base = BaseModelConfig.model_validate({**load_section("base").model_dump(), **overrides})
    model = build_student(base, tokenizer)
    pad = pad_id(tokenizer)
    synth = load_section("synthesize")

    def encode(pair: tuple[str, str]) -> tuple[list[int], list[int]]:
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"] for text in pair)

    train = [encode(drill(args.task, r, args.format, rng)) for r in read_rows(paths.split_file("train"))]
    val_task = "copy" if args.task == "copy" else "lookup"
    val = [drill(val_task, r, args.format, rng) for r in read_rows(paths.split_file("val"))][:200]

    def fresh() -> tuple[list[int], list[int]]:
        table = random_table(table_rng, synth)
        return encode(drill(args.task, {"table": json.dumps(table), "prompt": format_prompt(table, "x")}, args.format, rng))

    def loss_of(batch) -> torch.Tensor:
        ids, mask = pad_batch([a + b for a, b in batch], pad)
        labels, _ = pad_batch([[-100] * len(a) + b for a, b in batch], -100)  # the loss on the target only
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    @torch.no_grad()
    def exact() -> float:
        model.eval()
        right = 0
        for prompt, target in val:
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            new = len(tokenizer(target, add_special_tokens=False)["input_ids"]) + 2
            out = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=pad)
            right += tokenizer.decode(out[0, ids.shape[1] :]).startswith(target)
        model.train()
        return right / len(val)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 0.05 * args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1, (i + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(i, args.steps) / args.steps)))
    start = time.time()
    model.train()
    for step in range(args.steps):
        loss = loss_of([fresh() for _ in range(16)] if args.fresh else rng.sample(train, 16))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if (step + 1) % max(args.steps // 5, 1) == 0:
            print(json.dumps({**vars(args), "step": step + 1, "loss": round(loss.item(), 4),
                              "seconds": round(time.time() - start), "val_exact": exact()}), flush=True)


if __name__ == "__main__":
    main()
