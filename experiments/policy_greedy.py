"""python -m experiments.policy_greedy DIR [DIR ...] [--split val] [--questions 600] [--fresh-seed 3]

Greedy accuracy of saved policies, in all and per task type, side by side on
the same new questions: `--questions` val- or test-like questions drawn by the
CoF generator with `--fresh-seed` (new tables; question texts the split hash
puts in that split), so that a policy changed outside the DAG (e.g. drilled by
`python -m experiments.rank_probe --save`) is compared with `models/sft` on questions
neither was chosen on. Prints one line per policy.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from pipeline.core.params import load_section
from pipeline.data.cof.generate import more_questions
from pipeline.data.params import SynthesizeConfig
from pipeline.evaluation.metrics import score
from pipeline.inference.generation import LocalSampler
from pipeline.modeling.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policies", nargs="+", type=Path)
    parser.add_argument("--split", default="val", choices=["val", "test"])
    parser.add_argument("--questions", type=int, default=600)
    parser.add_argument("--fresh-seed", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    synth = load_section("synthesize", SynthesizeConfig)
    if args.fresh_seed == synth.seed:
        parser.error("--fresh-seed must differ from synthesize.seed (those questions are the DAG's own)")
    torch.set_num_threads(args.threads)
    rows = more_questions(synth, args.questions, args.fresh_seed, args.split, prefix=f"fresh-{args.split}")
    for path in args.policies:
        policy, tokenizer = load_model(path)
        # The greedy decoding experiments/prm_selection.py compares its selection rules with.
        greedy = LocalSampler(policy, tokenizer, 64).sample([r["prompt"] for r in rows], n=1, temperature=0.0,
                                                            top_p=1.0, max_new_tokens=192, seed=0)
        right: dict[str, list[bool]] = defaultdict(list)
        for row, (gen,) in zip(rows, greedy):
            right[row["task_type"]].append(score(row, gen.text, 0)["correct"])
        total = [c for v in right.values() for c in v]
        print(json.dumps({"policy": str(path), "greedy": round(sum(total) / len(total), 3),
                          "by_task_type": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(right.items())}}), flush=True)


if __name__ == "__main__":
    main()
