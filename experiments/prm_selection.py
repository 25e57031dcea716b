"""python -m experiments.prm_selection [--models sft] [--split val] [--questions 500] [--n 8] [--temperatures 0.5,0.8] \
[--fresh-seed 2]

How should the PRM pick among N samples, and from which samples? Side by side
on the same questions, the same samples and the same PRM (models/prm), for
each policy: greedy, then `--n` samples per question at each temperature
(seed 0), every one scored once by the PRM. Then, for N = 4 and N = `--n`
(the first N samples), the accuracy of:
- `random`: the first sample; `maj`: majority vote; `pass`: some sample right;
- `bo/<agg>`: PRM best-of-N, lines aggregated by min, mean or last
  (evaluate's `prm_best_of_n`);
- `g+bo/min`: best-of-N over greedy and N - 1 samples (the same budget);
- `vote/min`: PRM-weighted vote (each answer's summed min-scores; Math-Shepherd's
  weighted self-consistency; evaluate's `prm_weighted_vote`);
- `lik/mean`: the PRM read as a generator: among the candidates that end in an
  `Answer:` line, the one whose lines' tokens have the highest mean
  log-softmax probability under the PRM's LM head (its verdicts read sigmoids
  of the same logits; a mean, so that a shorter solution is not preferred);
- `rank/mean+lik`: the candidate ranked highest by its rank under the mean
  line score plus its rank under that likelihood.
Then best-of-`--n` by the mean minus greedy per temperature, with its paired
standard error. `--by-type` also counts, per task type (T 0.8, N = `--n`, by
the mean), greedy, best-of-N, pass@N and, among the questions whose samples
mix right and wrong answers, how often best-of-N picks right and how often a
random pick would: where the gain lies and where the PRM misses. Choose on `--split val`, report on test.
Needs the models and models/prm (run `make run` first). Prints a line per temperature and N for each policy;
`--out` also writes them as JSON;
`--dump` every candidate's grade and scores, to try other rules offline.
`--samples DIR` keeps each policy's completions in DIR/<model>.json and reads
them back on the next run of the same questions, n and temperatures: another
PRM (`--prm`) is then compared on the same samples without drawing them again.
`--fresh-seed S` draws `--questions` new val or test questions (new tables, the
split's question texts) instead of reading the split: a held-out set larger
than the split's 300 or 500.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.core.params import load_section
from pipeline.data.cof.generate import more_questions
from pipeline.data.grading import extract_answer
from pipeline.data.params import SynthesizeConfig
from pipeline.evaluation.decoding import paired_difference
from pipeline.evaluation.metrics import majority_vote, weighted_majority
from pipeline.inference.generation import LocalSampler, pad
from pipeline.modeling.models import load_model
from pipeline.prm.model import EMPTY_SCORE, PRMScorer, aggregate, encode_many, is_terminal, scored_lines
from pipeline.rl.rewards import is_correct


@torch.inference_mode()
def log_likelihoods(scorer: PRMScorer, prompt: str, lines: list[list[str]]) -> list[float]:
    """Mean log-softmax probability of the tokens of each candidate's scored lines under the PRM's LM head.

    -inf for a candidate without an Answer line: a solution cut short is never the pick.
    """
    keep = [i for i, ls in enumerate(lines) if ls and is_terminal(ls[-1])]
    out = [-math.inf] * len(lines)
    if not keep:
        return out
    encoded = encode_many(scorer.tokenizer, [prompt] * len(keep), [lines[i] for i in keep])
    ids, mask = pad([ids for ids, _ in encoded], scorer.pad_id)
    logits = scorer.model(input_ids=ids.to(scorer.model.device), attention_mask=mask.to(scorer.model.device)).logits
    picked = F.pad(logits[:, :-1].float().log_softmax(-1).gather(2, ids[:, 1:, None].to(logits.device))[..., 0], (1, 0))
    for row, i, (_, spans) in zip(picked.cpu(), keep, encoded):
        out[i] = sum(row[a:b].sum().item() for a, b in spans) / sum(b - a for a, b in spans)
    return out


def draw(policy_dir: Path, rows: list[dict], n: int, temperatures: list[float]) -> dict:
    """The policy's completions: {"greedy": [[text]], t: [[n texts]]} per question, in `rows` order."""
    policy, tokenizer = load_model(policy_dir)
    sampler = LocalSampler(policy, tokenizer, 64)
    prompts = [r["prompt"] for r in rows]
    drawn = {"greedy": sampler.sample(prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=192, seed=0)}
    for t in temperatures:
        drawn[t] = sampler.sample(prompts, n=n, temperature=t, top_p=1.0, max_new_tokens=192, seed=0)
    return {key: [[g.text for g in gens] for gens in groups] for key, groups in drawn.items()}


def cached_draw(policy_dir: Path, rows: list[dict], n: int, temperatures: list[float], file: Path | None) -> dict:
    """`draw`, read from `file` when an earlier run with the same questions, n and temperatures wrote it there.

    Sampling is most of a run's time; with the samples kept, two PRMs (`--prm`) are compared on the same
    completions in the time it takes to score them.
    """
    key = {"ids": [r["id"] for r in rows], "n": n, "temperatures": temperatures}
    if file is not None and file.exists():
        saved = json.loads(file.read_text())
        if saved["key"] != key:
            raise SystemExit(f"{file}: samples of other questions, n or temperatures; remove it or pass another "
                             "--samples folder")
        return {"greedy": saved["greedy"], **{t: saved[str(t)] for t in temperatures}}
    texts = draw(policy_dir, rows, n, temperatures)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps({"key": key, **{str(k): v for k, v in texts.items()}}))
    return texts


def candidates(texts_by_key: dict, scorer: PRMScorer, rows: list[dict]) -> list[dict]:
    """Per question: greedy and the samples per temperature (`draw`), each with its PRM line scores, likelihood
    and grade."""
    out = []
    for i, row in enumerate(rows):
        texts = {key: groups[i] for key, groups in texts_by_key.items()}
        flat = [text for group in texts.values() for text in group]
        lines = [scored_lines(text) for text in flat]
        scores = scorer.score([row["prompt"]] * len(flat), lines)
        liks = log_likelihoods(scorer, row["prompt"], lines)
        cands = [{"text": text, "scores": s, "lik": lik, "answer": extract_answer(text),
                  "right": is_correct(text, row["answer"], row["answer_type"])}
                 for text, s, lik in zip(flat, scores, liks)]
        by_key, at = {}, 0
        for key, group in texts.items():
            by_key[key] = cands[at : at + len(group)]
            at += len(group)
        out.append({"row": row, **by_key})
    return out


def agg(cand: dict, how: str) -> float:
    """A candidate's PRM score as evaluate's best-of-N aggregates it."""
    return aggregate(cand["scores"], how) if cand["scores"] else EMPTY_SCORE


def rank_sum(cands: list[dict]) -> dict:
    """The candidate whose rank by the mean line score plus its rank by likelihood is highest (ties: the mean)."""
    means, liks = [agg(c, "mean") for c in cands], [c["lik"] for c in cands]
    rank = [0] * len(cands)
    for scores in (means, liks):
        for r, i in enumerate(sorted(range(len(cands)), key=scores.__getitem__)):
            rank[i] += r
    return cands[max(range(len(cands)), key=lambda i: (rank[i], means[i]))]


def weighted_vote(cands: list[dict], answer_type: str) -> dict:
    """The candidate evaluate's `prm_weighted_vote` picks with min-scores (the first when none has an answer)."""
    picked = weighted_majority([c["answer"] for c in cands], [agg(c, "min") for c in cands], answer_type)
    return cands[0] if picked is None else cands[picked]


def rules(questions: list[dict], key: float, n: int) -> dict[str, float]:
    """Accuracy of each selection rule on the first n samples at temperature `key`."""
    hits: dict[str, int] = defaultdict(int)
    for q in questions:
        cands, kind = q[key][:n], q["row"]["answer_type"]
        with_greedy = q["greedy"] + cands[: n - 1]
        voted = majority_vote([c["answer"] for c in cands], kind)
        picks = {
            "random": cands[0],
            **{f"bo/{how}": max(cands, key=lambda c, how=how: agg(c, how)) for how in ("min", "mean", "last")},
            "g+bo/min": max(with_greedy, key=lambda c: agg(c, "min")),
            "vote/min": weighted_vote(cands, kind),
            "lik/mean": max(cands, key=lambda c: c["lik"]),
            "rank/mean+lik": rank_sum(cands),
        }
        for name, c in picks.items():
            hits[name] += c["right"]
        hits["maj"] += voted is not None and is_correct(f"Answer: {voted}", q["row"]["answer"], kind)
        hits["pass"] += any(c["right"] for c in cands)
    return {name: round(v / max(len(questions), 1), 3) for name, v in hits.items()}


def versus_greedy(questions: list[dict], key: float, n: int) -> dict:
    """Best-of-n by the mean line score minus greedy on the same questions, with the paired standard error."""
    picks = [max(q[key][:n], key=lambda c: agg(c, "mean"))["right"] for q in questions]
    return paired_difference(picks, [q["greedy"][0]["right"] for q in questions])


def by_type(questions: list[dict], key: float, n: int, how: str) -> dict[str, dict]:
    """Per task type at temperature `key` and N = n: questions, greedy, best-of-n by `how`, pass@n, and the
    questions whose n samples mix right and wrong answers with how many of them best-of-n got right and how many
    a random pick among the n would (expected)."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    for q in questions:
        cands, cell = q[key][:n], out[q["row"]["task_type"]]
        right = [c["right"] for c in cands]
        pick = max(cands, key=lambda c: agg(c, how))["right"]
        cell["questions"] += 1
        cell["greedy"] += q["greedy"][0]["right"]
        cell[f"bo/{how}"] += pick
        cell["pass"] += any(right)
        if any(right) and not all(right):
            cell["mixed"] += 1
            cell["mixed_picked_right"] += pick
            cell["mixed_random_pick"] += sum(right) / len(right)  # a random pick's expected count
    return {kind: {k: round(v, 2) for k, v in cell.items()} for kind, cell in sorted(out.items())}


def dump(q: dict, temperatures: list[float]) -> dict:
    """One question's candidates without their texts: enough to try another selection rule offline."""
    keep = ("answer", "right", "scores", "lik")
    return {"task_type": q["row"]["task_type"], "answer_type": q["row"]["answer_type"],
            **{str(key): [{k: c[k] for k in keep} for c in q[key]] for key in ["greedy", *temperatures]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sft"])
    parser.add_argument("--split", default="val")
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--fresh-seed", type=int, default=None,
                        help="instead of the split's file, --questions new ones of the split (val or test) "
                             "drawn by the generator with this seed (not synthesize.seed)")
    parser.add_argument("--n", type=int, default=8, help="samples per question and temperature (at least 4)")
    parser.add_argument("--temperatures", default="0.5,0.8")
    parser.add_argument("--prm", type=Path, default=None, help="default: models/prm")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here as JSON")
    parser.add_argument("--by-type", action="store_true",
                        help="also count, per task type at T 0.8 and N = --n by the mean, where best-of-N gains "
                             "and misses")
    parser.add_argument("--samples", type=Path, default=None,
                        help="a folder: each policy's completions are read from <model>.json there when an earlier "
                             "run of the same questions wrote them, else drawn and written")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write every candidate's answer, grade, line scores and likelihood here (JSON)")
    args = parser.parse_args()
    if args.n < 4:
        parser.error("--n must be at least 4: the table compares N = 4 with N = --n")
    temperatures = [float(t) for t in args.temperatures.split(",")]
    synth = load_section("synthesize", SynthesizeConfig)
    if args.fresh_seed is None:
        rows = read_rows(paths.split_file(args.split))[: args.questions]
    elif args.fresh_seed == synth.seed or args.split not in ("val", "test"):
        parser.error("--fresh-seed needs --split val or test and a seed other than synthesize.seed")
    else:
        rows = more_questions(synth, args.questions, args.fresh_seed, args.split, prefix=f"fresh-{args.split}")
    scorer = PRMScorer.load(args.prm or paths.model_dir("prm"))
    table, dumped = {}, {}
    for model in args.models:
        start = time.perf_counter()
        file = args.samples / f"{model}.json" if args.samples else None
        texts = cached_draw(paths.model_dir(model), rows, args.n, temperatures, file)
        questions = candidates(texts, scorer, rows)
        greedy = round(sum(q["greedy"][0]["right"] for q in questions) / len(questions), 3)
        table[model] = {"greedy": greedy, **{f"T{t} N{n}": rules(questions, t, n)
                                             for t in temperatures for n in sorted({4, args.n})}}
        print(f"\n{model} on the first {len(rows)} {args.split} questions: greedy {greedy} "
              f"({time.perf_counter() - start:.0f} s)")
        for setting, acc in table[model].items():
            if setting != "greedy":
                print(f"  {setting:9s} " + "  ".join(f"{name} {value:.3f}" for name, value in acc.items()))
        gains = {f"T{t} N{args.n}": versus_greedy(questions, t, args.n) for t in temperatures}
        table[model]["bo/mean minus greedy"] = gains
        print("  bo/mean minus greedy (paired SE): " + "  ".join(
            f"{setting} {v['difference']:+.3f} ± {v['standard_error']:.3f}" for setting, v in gains.items()))
        if args.by_type and 0.8 in temperatures:
            table[model]["by_type"] = by_type(questions, 0.8, args.n, "mean")
            print(f"  T0.8 N{args.n} by task type (counts): " + "; ".join(
                f"{kind} " + " ".join(f"{k} {v}" for k, v in cell.items())
                for kind, cell in table[model]["by_type"].items()))
        if args.dump:
            dumped[model] = [dump(q, temperatures) for q in questions]
    if args.out:
        args.out.write_text(json.dumps({"split": args.split, "questions": len(rows), "models": table}, indent=1))
    if args.dump:
        args.dump.write_text(json.dumps({"split": args.split, "models": dumped}))


if __name__ == "__main__":
    main()
