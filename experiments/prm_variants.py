"""python -m experiments.prm_variants '{}' '{"num_train_epochs": 6}' '{"perturbed": 2}' '{"init": {"hidden_size": 256}}'

One PRM per JSON argument, each measured the way the issue's targets are stated:
held-out AUROC and within-question pair accuracy on data/prm_data/val.parquet
(pipeline.prm.model.held_out), and best-of-N accuracy against greedy and maj@N on the
first `--questions` test questions, all variants picking among the same N samples
of the policy (`prm_data.policy`, at `evaluate.k_temperature`).

Each variant trains on what the `prm` stage would under its params (labelled paths,
`contrast` paths, gold chains), plus `perturbed` ones. Keys are `prm` params, and:
- "perturbed": k adds, for each of `--perturbed-questions` training questions, its
  gold chain (every line 1) and k copies cut after one step whose value is changed
  (that step 0): contrast pairs that differ in one looked-up value;
- "chain_questions": k adds the gold chains of k more new questions, the ones
  `prm_data.chain_questions` = k would add (to the chain loss and the contrast paths);
- "init": {base params} trains the PRM from a fresh LM of that size (vocabulary of
  models/base) SFT-trained on the gold rationales first ("epochs": SFT epochs,
  default `sft.num_train_epochs`; "sft": {other sft params}) instead of from the policy;
- "policy": DIR trains the PRM from the model in DIR (one with the policy's tokenizer, e.g. one that
  `python -m experiments.rank_probe --save DIR` drilled otherwise) instead of from `prm_data.policy`.
`--save DIR` keeps each PRM (DIR/prm-i). Nothing under models/ or data/ changes. Needs data/prm_data and the policy
(run `make run`).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from pipeline.core import paths
from pipeline.core.io import read_rows, sample_rows
from pipeline.core.params import load_section
from pipeline.data.grading import step_value
from pipeline.data.params import SynthesizeConfig
from pipeline.evaluation.decoding import Decoder
from pipeline.evaluation.metrics import score
from pipeline.evaluation.params import DecodingConfig, EvaluateConfig
from pipeline.inference.generation import LocalSampler
from pipeline.modeling.models import build_student, default_device, load_model, load_tokenizer, save_model
from pipeline.modeling.params import BaseModelConfig
from pipeline.orchestration.sections import load_named
from pipeline.prm.model import (
    AGGREGATIONS,
    PRMScorer,
    chain_rows,
    held_out,
    line_labels,
    new_questions,
    prm_from_policy,
    training_rows,
)
from pipeline.prm.params import PRMConfig, PRMDataConfig
from pipeline.training import trainer as training

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z]+")
_TABLE_VALUE = re.compile(r":\s*(\d+(?:\.\d+)?)")


def perturb_step(line: str, prompt: str, rng: random.Random) -> str | None:
    """The step line with one part of its value changed to another plausible one; None if it has no value.

    Numbers become another number of the chart or a nearby one (the policy's own
    misreadings look like that); words become another word of the chart's table
    line (a colour, a category) and Yes/No flip.
    """
    value = step_value(line)
    if not value or not line.rstrip(".").endswith(value):
        return None
    cut = line.rstrip(".").rfind(value)
    table = prompt.split("\n")[1] if prompt.count("\n") > 1 else prompt  # "Lions: 20 pink | Tigers: 19 blue"
    numbers = list(_NUMBER.finditer(value))
    if numbers:
        m = rng.choice(numbers)
        pool = sorted({n for n in _TABLE_VALUE.findall(table) if n != m.group()})
        if pool and rng.random() < 0.5:
            new = rng.choice(pool)
        else:
            x = float(m.group())
            new = str(int(x) + rng.choice([-3, -2, -1, 1, 2, 3])) if x.is_integer() else f"{x + 1:g}"
    else:
        words = list(_WORD.finditer(value))
        if not words:
            return None
        m = rng.choice(words)
        if m.group() in ("Yes", "No"):
            new = "No" if m.group() == "Yes" else "Yes"
        else:
            pool = sorted(set(_WORD.findall(table)) - {m.group()})
            if not pool:
                return None
            new = rng.choice(pool)
    changed = value[: m.start()] + new + value[m.end() :]
    return line[:cut] + changed + line[cut + len(value) :]


def perturbed_rows(questions: list[dict], copies: int, rng: random.Random) -> list[dict]:
    """Each question's gold chain (all lines right) and `copies` chains cut after one wrong step (labelled by the
    same gold check as the policy's samples, so a change that happens to stay right keeps its 1)."""
    out = []
    for q in questions:
        lines = [line.strip() for line in q["rationale"].splitlines() if line.strip()]
        out.append({"prompt": q["prompt"], "steps": lines, "labels": line_labels(lines, q), "source": "gold"})
        steps = [line for line in lines if line.startswith("Step")]
        for _ in range(copies if steps else 0):
            k = rng.randrange(len(steps))
            wrong = perturb_step(steps[k], q["prompt"], rng)
            if wrong is None or wrong == steps[k]:
                continue
            path = steps[:k] + [wrong]
            out.append({"prompt": q["prompt"], "steps": path, "labels": line_labels(path, q), "source": "gold"})
    return out


def extra_chains(data_cfg: PRMDataConfig, k: int) -> list[dict]:
    """The gold chains that `prm_data.chain_questions` + k would add to chains.parquet (the generator's next k)."""
    if not k:
        return []
    more = data_cfg.model_copy(update={"chain_questions": data_cfg.chain_questions + k})
    return chain_rows(new_questions(more, load_section("synthesize", SynthesizeConfig))[-k:])


def no_dvclive() -> None:
    """Curves are not kept for a sweep (and dvclive may be missing on a bare GPU machine)."""
    training.dvclive_callback = lambda live_dir: TrainerCallback()


def init_model(spec: dict, work: Path, cache: dict) -> Path:
    """A folder with a causal LM of the given size, SFT-trained on the gold rationales (cached per spec)."""
    key = json.dumps(spec, sort_keys=True)
    if key in cache:
        return cache[key]
    spec = dict(spec)
    sft = load_named("sft")
    epochs, sft_overrides = spec.pop("epochs", sft.num_train_epochs), spec.pop("sft", {})
    base = load_named("base").model_copy(update=spec)
    BaseModelConfig.model_validate(base.model_dump())
    tokenizer = load_tokenizer(paths.model_dir("base"))
    model = build_student(base, tokenizer)
    rows, val = read_rows(paths.split_file("train")), read_rows(paths.split_file("val"))
    cfg = sft.model_copy(update={**sft_overrides, "num_train_epochs": epochs, "eval_steps": 10**6})
    type(sft).model_validate(cfg.model_dump())
    metrics = training.sft_train(cfg, model, tokenizer, rows, val, work / "sft", work / "live")
    folder = work / f"init-{len(cache)}"
    save_model(model, tokenizer, folder)
    print(f"init {key}: {sum(p.numel() for p in model.parameters())} parameters, SFT {metrics}", flush=True)
    cache[key] = folder
    return folder


def decode(decoding: DecodingConfig, scorer, rows: list[dict], greedy: list, samples: list, strategies: list[str],
           **update) -> dict:
    """Accuracy per strategy by evaluate's own Decoder, on the fixed greedy and sampled completions."""
    cfg = decoding.model_copy(update={"strategies": strategies, **update})
    return {name: m["accuracy"] for name, m in Decoder(cfg, scorer).run(rows, greedy, 0.0, samples, 0.0).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="JSON objects of overrides")
    parser.add_argument("--questions", type=int, default=200, help="test questions for best-of-N")
    parser.add_argument("--perturbed-questions", type=int, default=3000)
    parser.add_argument("--limit", type=int, default=None,
                        help="the first N training paths per variant, prm_data's before any contrast or perturbed "
                             "ones, and the first N gold chains (smoke runs)")
    parser.add_argument("--save", type=Path, default=None,
                        help="keep variant i's PRM in SAVE/prm-i (compare them with "
                             "`python -m experiments.prm_selection --prm`)")
    parser.add_argument("--out", type=Path, default=None, help="also append one JSON line per variant to this file")
    args = parser.parse_args()
    no_dvclive()
    base_cfg, data_cfg = load_section("prm", PRMConfig), load_section("prm_data", PRMDataConfig)
    ev = load_section("evaluate", EvaluateConfig)
    train = read_rows(paths.split_file("train", "prm_data"))
    val = read_rows(paths.split_file("val", "prm_data"))
    questions = read_rows(paths.split_file("train"))
    test = read_rows(paths.split_file("test"))[: args.questions]
    policy, tokenizer = load_model(paths.model_dir(data_cfg.policy))
    sampler = LocalSampler(policy, tokenizer, ev.batch_size)
    n = ev.decoding.n
    greedy = [(g[0].text, g[0].tokens)
              for g in sampler.sample([r["prompt"] for r in test], max_new_tokens=ev.max_new_tokens)]
    drawn = sampler.sample([r["prompt"] for r in test], n=n, temperature=ev.k_temperature,
                           max_new_tokens=ev.max_new_tokens, seed=0)
    samples = [[(g.text, g.tokens) for g in gens] for gens in drawn]
    graded = [[score(r, t, 0)["correct"] for t, _ in pairs] for r, pairs in zip(test, samples)]
    baseline = {
        "device": str(default_device()), "questions": len(test), "n": n,
        **decode(ev.decoding, None, test, greedy, samples, ["greedy", "maj_at_n"]),
        "pass_at_n": round(sum(any(g) for g in graded) / len(test), 3),
        "mean_sample": round(sum(sum(g) for g in graded) / (len(test) * n), 3),
    }
    print(json.dumps({"baseline": baseline}), flush=True)
    cache: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(args.variants):
            variant = json.loads(text)
            init, copies = variant.pop("init", None), variant.pop("perturbed", 0)
            start_from = variant.pop("policy", None)
            more_chains = extra_chains(data_cfg, variant.pop("chain_questions", 0))
            cfg = base_cfg.model_copy(update=variant)
            PRMConfig.model_validate(cfg.model_dump())
            rows, contrast, chains = training_rows(cfg, more_chains)  # what the stage trains on, under these params
            rows = rows + contrast
            if copies:
                rng = random.Random(cfg.seed)
                used = {r["id"] for r in train}
                pool = sample_rows([q for q in questions if q["id"] not in used], args.perturbed_questions, rng)
                rows = rows + perturbed_rows(pool, copies, rng)
            rows = rows[: args.limit] + chains[: args.limit]
            folder = (init_model(init, Path(tmp), cache) if init else Path(start_from) if start_from
                      else paths.model_dir(data_cfg.policy))
            start = time.perf_counter()  # the init's SFT is timed apart (it runs once per init, then is cached)
            torch.manual_seed(cfg.seed)
            model = prm_from_policy(folder, cfg.extra_layers).to(default_device())
            trained = training.prm_train(cfg, model, tokenizer, rows, Path(tmp) / f"prm-{i}", Path(tmp) / "live")
            scorer = PRMScorer(model, tokenizer, cfg.batch_size)
            metrics, _ = held_out(scorer, val)
            result = {
                "variant": text, "paths": trained["paths"], "steps": trained["steps"],
                "train_seconds": trained["train_seconds"], "seconds": round(time.perf_counter() - start, 1),
                "auroc": metrics["auroc"], "auroc_steps": metrics["auroc_steps"], "accuracy": metrics["accuracy"],
                "ece": metrics["ece"], "pairs_mean": metrics["within_question"]["pair_accuracy_mean"],
                "pairs_min": metrics["within_question"]["pair_accuracy_min"],
                "best_of_n": {how: decode(ev.decoding, scorer, test, greedy, samples, ["prm_best_of_n"],
                                          aggregation=how)["prm_best_of_n"] for how in AGGREGATIONS},
            }
            print(json.dumps(result), flush=True)
            if args.save:
                save_model(model, tokenizer, args.save / f"prm-{i}")
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps({"baseline": baseline, **result}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
