"""python -m experiments.prm_search [--models sft grpo] [--split val] [--questions 600] [--fresh-seed 3] \
[--iterations 12,24] [--beam]

Does PRM-guided search hold beyond the evaluated test split? Runs greedy
decoding, PRM-MCTS (pipeline.evaluation.search.prm_mcts, at each `--iterations`, with
`evaluate.decoding`'s children, UCB constant and step limits) and, with
`--beam`, step-level beam search, on `--questions` new val or test questions
(`--fresh-seed`: new tables and chains from the CoF generator, as
experiments/prm_selection.py draws them), with `models/prm`. Prints each strategy's
accuracy and its paired difference from greedy with the standard error, per
model. Nothing under models/, data/ or metrics/ changes.
"""

from __future__ import annotations

import argparse
import json
import time

from pipeline.core import paths
from pipeline.core.params import load_section
from pipeline.data.cof.generate import more_questions
from pipeline.data.params import SynthesizeConfig
from pipeline.evaluation.decoding import paired_difference
from pipeline.evaluation.metrics import score
from pipeline.evaluation.params import EvaluateConfig
from pipeline.evaluation.search import StepPolicy, beam_search, prm_mcts
from pipeline.inference.generation import LocalSampler
from pipeline.modeling.models import load_model
from pipeline.prm.model import PRMScorer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sft", "grpo"])
    parser.add_argument("--split", default="val", choices=["val", "test"])
    parser.add_argument("--questions", type=int, default=600)
    parser.add_argument("--fresh-seed", type=int, default=3)
    parser.add_argument("--iterations", default="12", help="comma-separated PRM-MCTS iteration counts")
    parser.add_argument("--beam", action="store_true", help="also step-level beam search")
    args = parser.parse_args()
    synth = load_section("synthesize", SynthesizeConfig)
    if args.fresh_seed == synth.seed:
        parser.error("--fresh-seed must differ from synthesize.seed (those questions are the dataset's own)")
    cfg = load_section("evaluate", EvaluateConfig)
    d = cfg.decoding
    rows = more_questions(synth, args.questions, args.fresh_seed, args.split, prefix=f"fresh-{args.split}")
    prompts = [r["prompt"] for r in rows]
    scorer = PRMScorer.load(paths.model_dir(d.prm), d.prm_batch_size)
    for name in args.models:
        model, tokenizer = load_model(paths.model_dir(name))
        greedy = LocalSampler(model, tokenizer, cfg.batch_size).sample(
            prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=cfg.max_new_tokens, seed=0)
        base = [score(r, g[0].text, 0)["correct"] for r, g in zip(rows, greedy)]
        out = {"model": name, "questions": len(rows), "greedy": round(sum(base) / len(base), 4)}
        policy = StepPolicy(model, tokenizer, batch_size=d.step_batch_size, step_tokens=d.step_tokens,
                            completion_tokens=cfg.max_new_tokens, temperature=cfg.k_temperature)
        runs = {f"mcts_{k}": lambda k=int(k): prm_mcts(prompts, policy, scorer.score, iterations=k,
                                                          children=d.mcts_children, c=d.ucb_c, max_steps=d.max_steps)
                for k in args.iterations.split(",")}
        if args.beam:
            runs["beam"] = lambda: beam_search(prompts, policy, scorer.score, n=d.n, width=d.beam_width,
                                               max_steps=d.max_steps, how=d.aggregation)
        for strategy, run in runs.items():
            start = time.perf_counter()
            right = [score(r, t, 0)["correct"] for r, t in zip(rows, run())]
            out[strategy] = {"accuracy": round(sum(right) / len(right), 4), "vs_greedy": paired_difference(right, base),
                             "seconds": round(time.perf_counter() - start, 1)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
