"""python bench/lookup_probe.py --task lookup --steps 1500 [--lr 1e-3] [--fresh] [--digits spaced] [--warmup-colour 2400] [--base '{"num_hidden_layers": 4}']

Can the student's architecture learn to read a table, trained on that alone? A
fresh model of `base`'s config (models/base's tokenizer, or with `--digits
spaced` one trained here on the same corpus) is trained from scratch on one
drill built from the synthesized charts' header and table line:

- copy: "...table...\\nCopy:" -> " Wed 17, Thu 9, Fri 4." (every key and value, in order);
- lookup: "...table...\\nValue for Fri:" -> " Fri 4." (one key's value: associative recall);
- multi: the lookup, then every other key of the table asked in turn.

`--values` rewrites the table line (`colour`: every value a colour word) and
`--format` what separates keys and values; `--warmup-colour N` (the multi drill
on colour-valued new tables) or `--induction N` (random token runs said twice)
trains N steps on another drill first. The run that reads numbers:
`--fresh --lr 1e-3 --digits spaced --warmup-colour 2400 --steps 3000`.

`--fresh` draws a new random table for every example (no table seen twice)
instead of the 6,000 training tables. Five times in the run it prints the
greedy exact-match rate on 200 validation tables (the copy drill for copy, the
single lookup otherwise); a value of the table picked at random gets 0.33.
Lookups are also split by the key asked: a year (a run of digit tokens, in
tables whose years are consecutive), the line's first key (a word with no
space before it, so another token than in the question, unless `--format
lead`) or a later word key.
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
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from pipeline import paths
from pipeline.cof.tables import COLOURS, random_table
from pipeline.cof.verbalize import format_prompt
from pipeline.config import BaseModelConfig, load_section
from pipeline.generation import pad as pad_batch, pad_id
from pipeline.io import read_rows
from pipeline.models import EOS, PAD, build_student, load_tokenizer

# How the table line is written: what sits between a key and its value, and
# what comes before the first key ("lead": a bar, so that the first key, like
# every other, follows a space and is the same token as in the question).
FORMATS = {"colon": ("", ": "), "nocolon": ("", " "), "tight": ("", ":"), "lead": ("| ", ": ")}


def drill(task: str, row: dict, fmt: str, rng: random.Random, values: str = "chart") -> tuple[str, str]:
    """(prompt, target) of one drill on a synthesized row's chart."""
    table = json.loads(row["table"])
    head, line = row["prompt"].split("\n")[:2]
    pairs = [(c, f"{v[0]:g}") for c, v in zip(table["categories"], table["values"])]
    if values == "colour":  # every value a one-token word: no space token, no digits to chain
        pairs = [(c, COLOURS[int(float(v)) % len(COLOURS)]) for c, v in pairs]
    if values != "chart":  # the first series only, nothing after a value
        line = " | ".join(f"{c}: {v}" for c, v in pairs)
    lead, sep = FORMATS[fmt]
    line = lead + line.replace(": ", sep)
    if task == "copy":
        return f"{head}\n{line}\nCopy:", " " + ", ".join(f"{c} {v}" for c, v in pairs) + "."
    if task == "multi":
        order = pairs[:]
        rng.shuffle(order)
        (c, v), rest = order[0], order[1:]
        return f"{head}\n{line}\nValue for {c}:", f" {c} {v}." + "".join(f"\nValue for {k}: {k} {x}." for k, x in rest)
    c, v = rng.choice(pairs)
    return f"{head}\n{line}\nValue for {c}:", f" {c} {v}."


def key_kind(prompt: str, target: str) -> str:
    """Which key a lookup asks: a year, the table line's first key, or a later (word) key."""
    key = target.split()[0]
    if key.isdigit():
        return "year"
    return "first" if prompt.split("\n")[1].lstrip("| ").startswith(key) else "later"


def spaced_digit_tokenizer(texts, vocab_size: int) -> PreTrainedTokenizerFast:
    """The stage's byte-level BPE, except that a space stays with the digit after it.

    " 19" is then " 1", "9" instead of " ", "1", "9", so a value's first token
    follows its key's ": " directly, as a colour word does. A copy of
    pipeline.models.train_tokenizer with one pre-tokenizer changed, kept here
    because that module is a DVC dependency of every stage.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    fast.padding_side = "left"
    return fast


def table_row(table: dict) -> dict:
    """A random table as a synthesized row with the fields `drill` reads (no question)."""
    return {"table": json.dumps(table), "prompt": format_prompt(table, "x")}


def target_loss(model, batch: list[tuple[list[int], list[int]]], pad: int) -> torch.Tensor:
    """The LM loss of (prompt, target) id pairs, on the target tokens only."""
    ids, mask = pad_batch([a + b for a, b in batch], pad)
    labels, _ = pad_batch([[-100] * len(a) + b for a, b in batch], -100)
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def fit(model, pad: int, steps: int, batch, lr: float, report, reports: int = 5) -> None:
    """`steps` AdamW steps on batch(): 5% warmup, cosine decay; report(step, loss) `reports` times."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1.0, 0.05 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1, (i + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(i, steps) / steps)))
    model.train()
    for step in range(steps):
        loss = target_loss(model, batch(), pad)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if (step + 1) % max(steps // reports, 1) == 0:
            report(step + 1, loss.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["copy", "lookup", "multi"], default="lookup")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--fresh", action="store_true", help="a new random table for every training example")
    parser.add_argument("--format", choices=sorted(FORMATS), default="colon")
    parser.add_argument("--values", choices=["chart", "plain", "colour"], default="chart",
                        help="the chart's own table line; plain: first series only, nothing after a value; "
                        "colour: plain with every value replaced by a colour word")
    parser.add_argument("--digits", choices=["split", "spaced"], default="split",
                        help="models/base's tokenizer (a space before a number is a token of its own), "
                        "or one trained here that keeps the space with the first digit")
    parser.add_argument("--warmup-colour", type=int, default=0,
                        help="steps of the multi drill with colour-word values on new tables before the drill")
    parser.add_argument("--induction", type=int, default=0,
                        help="steps on repeated random token runs (induction heads) before the drill")
    parser.add_argument("--base", default="{}", help="JSON overrides of the base params (the architecture)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng, table_rng = random.Random(0), random.Random(1)
    tokenizer = load_tokenizer(paths.model_dir("base"))
    if args.digits == "spaced":  # on stage base's corpus, with as many tokens as its tokenizer ended with
        rows = read_rows(paths.split_file("train"))
        tokenizer = spaced_digit_tokenizer((r["prompt"] + r["rationale"] for r in rows), len(tokenizer))
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

    train = [encode(drill(args.task, r, args.format, rng, args.values)) for r in read_rows(paths.split_file("train"))]
    val_task = "copy" if args.task == "copy" else "lookup"
    val = [drill(val_task, r, args.format, rng, args.values) for r in read_rows(paths.split_file("val"))][:200]

    def on_table(task: str, table: dict, drill_rng: random.Random, values: str) -> tuple[list[int], list[int]]:
        return encode(drill(task, table_row(table), args.format, drill_rng, values))

    def fresh() -> tuple[list[int], list[int]]:
        return on_table(args.task, random_table(table_rng, synth), rng, args.values)

    @torch.no_grad()
    def exact(val=val, val_task=val_task) -> dict[str, float]:
        """Greedy exact match on val, overall and (lookups) by the key's kind."""
        model.eval()
        right: dict[str, list[bool]] = {}
        for prompt, target in val:
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            new = len(tokenizer(target, add_special_tokens=False)["input_ids"]) + 2
            out = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=pad)
            hit = tokenizer.decode(out[0, ids.shape[1] :]).startswith(target)
            for name in ["all"] + ([key_kind(prompt, target)] if val_task == "lookup" else []):
                right.setdefault(name, []).append(hit)
        model.train()
        return {name: round(sum(hits) / len(hits), 3) for name, hits in right.items()} | {
            f"n_{name}": len(hits) for name, hits in right.items() if name != "all"}

    start = time.time()
    if args.induction:
        # Random token runs said twice, the loss on the repeat: the classic task that
        # grows induction heads, over the whole vocabulary (a separate rng, so the
        # drill that follows sees what it would without this).
        specials = set(tokenizer.all_special_ids)
        vocab = [i for i in range(len(tokenizer)) if i not in specials]
        induction_rng = random.Random(2)

        def repeats() -> list[tuple[list[int], list[int]]]:
            runs = [[induction_rng.choice(vocab) for _ in range(32)] for _ in range(16)]
            return [(run, run) for run in runs]

        fit(model, pad, args.induction, repeats, args.lr, lambda step, loss: print(json.dumps(
            {"induction_step": step, "loss": round(loss, 4), "seconds": round(time.time() - start)}), flush=True))
    if args.warmup_colour:
        # Every key of a new table asked in turn, its values colour words: a drill the
        # architecture learns to bind in a few thousand steps (own rngs, as above).
        warm_rng, warm_tables = random.Random(3), random.Random(4)
        warm_val = [drill("lookup", r, args.format, warm_rng, "colour") for r in read_rows(paths.split_file("val"))]
        warm_val = warm_val[:200]

        def colour_drills() -> list[tuple[list[int], list[int]]]:
            return [on_table("multi", random_table(warm_tables, synth), warm_rng, "colour") for _ in range(16)]

        fit(model, pad, args.warmup_colour, colour_drills, args.lr, lambda step, loss: print(json.dumps(
            {"warmup_step": step, "loss": round(loss, 4), "seconds": round(time.time() - start),
             "colour_exact": exact(warm_val, "lookup") if step == args.warmup_colour else None}), flush=True))
    fit(model, pad, args.steps, lambda: [fresh() for _ in range(16)] if args.fresh else rng.sample(train, 16), args.lr,
        lambda step, loss: print(json.dumps({**vars(args), "step": step, "loss": round(loss, 4),
                                             "seconds": round(time.time() - start), "val_exact": exact()}), flush=True))

if __name__ == "__main__":
    main()
