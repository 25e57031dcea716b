"""python bench/drill_then_sft.py [--drill 2400] [--digits spaced] [--epochs 3]

Does a table-reading warm-up carry into SFT? A fresh student of `base`'s config
(with the tokenizer bench/lookup_probe.py trains for `--digits`) first learns to read tables from drills on new random tables (`--drill`
steps of every key in turn with colour-word values, then as many of one numeric
lookup; 0 skips them), then is fine-tuned on the 6,000 gold rationales
(`--epochs`, batch 16, learning rate 3e-3 as in `sft`, cosine). Prints the
greedy first `Step` line's exact match and the answer accuracy on the first
200 validation questions. A short stand-in for the base -> sft stages, not
them: one thread, a hand loop, no eval split, its own table streams (stage base
draws its drills from one). Needs data/synthesize (run `make run`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ itself, for lookup_probe
import lookup_probe  # noqa: E402

from pipeline import paths  # noqa: E402
from pipeline.cof.tables import random_table  # noqa: E402
from pipeline.config import BaseModelConfig, load_section  # noqa: E402
from pipeline.generation import pad_id  # noqa: E402
from pipeline.grading import extract_answer, grade  # noqa: E402
from pipeline.io import read_rows  # noqa: E402
from pipeline.drills import drill, encode, fit as drill_fit, table_row  # noqa: E402
from pipeline.models import build_student  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drill", type=int, default=2400, help="steps of each drill before SFT (0: none)")
    parser.add_argument("--digits", choices=["split", "spaced"], default="spaced")
    parser.add_argument("--epochs", type=float, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = read_rows(paths.split_file("train"))
    val = read_rows(paths.split_file("val"))[:200]
    base = load_section("base", BaseModelConfig)
    tokenizer = lookup_probe.probe_tokenizer(args.digits, base.vocab_size)
    model = build_student(base, tokenizer)
    pad = pad_id(tokenizer)
    synth = load_section("synthesize")

    def fit(steps: int, batch, lr: float, name: str) -> None:
        start = time.time()
        drill_fit(model, pad, steps, batch, lr, lambda step, loss: print(json.dumps(
            {"phase": name, "step": step, "loss": round(loss, 4), "seconds": round(time.time() - start)}), flush=True),
            reports=4)

    drill_rng, table_rng = random.Random(3), random.Random(4)

    def drills(task: str, values: str) -> list[tuple[list[int], list[int]]]:
        out = []
        for _ in range(16):
            row = table_row(random_table(table_rng, synth))
            out.append(encode(tokenizer, *drill(task, row, drill_rng, values)))
        return out

    if args.drill:
        fit(args.drill, lambda: drills("multi", "colour"), 1e-3, "colour drill")
        fit(args.drill, lambda: drills("lookup", "chart"), 1e-3, "number drill")
    sft = [encode(tokenizer, r["prompt"], r["rationale"] + tokenizer.eos_token) for r in rows]
    sft_rng, order = random.Random(0), []

    def sft_batch() -> list[tuple[list[int], list[int]]]:
        if len(order) < 16:  # a new shuffled epoch
            order[:] = list(range(len(sft)))
            sft_rng.shuffle(order)
        return [sft[order.pop()] for _ in range(16)]

    steps = int(args.epochs * len(sft) / 16)
    fit(steps, sft_batch, 3e-3, "sft")
    model.eval()
    first = right = 0
    with torch.no_grad():
        for row in val:
            ids = torch.tensor([tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]])
            out = model.generate(ids, max_new_tokens=120, do_sample=False, pad_token_id=pad,
                                 eos_token_id=tokenizer.eos_token_id)
            text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            first += text.split("\n")[0].strip() == row["rationale"].split("\n")[0].strip()
            right += grade(extract_answer(text), row["answer"], row["answer_type"])
    print(json.dumps({**vars(args), "sft_steps": steps, "val_first_step": first / len(val),
                      "val_accuracy": right / len(val)}), flush=True)


if __name__ == "__main__":
    main()
