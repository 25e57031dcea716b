"""python bench/prm_scoring.py [--paths 512] [--repeats 3]

PRM scoring throughput, side by side in one process on the same PRM and the same
candidate solutions (the held-out step-label paths of data/prm_data/val.parquet):
1. the pipeline's batched scorer (pipeline.prm.PRMScorer: batches of
   `evaluate.decoding.prm_batch_size` paths, every line of every path scored in one
   forward pass, the prefix that paths of one prompt share read once);
2. baseline: the same scorer with batch size 1, one candidate at a time (one plain
   forward pass per candidate: a lone path shares nothing).
Checks that both give the same scores, then prints candidates/s of each, the tokens
each read, and the ratio (best of `--repeats`). Needs models/prm and data/prm_data (run `make run` first).
"""

from __future__ import annotations

import argparse
import time

import torch

from pipeline import paths
from pipeline.config import EvaluateConfig, load_section
from pipeline.io import read_rows
from pipeline.prm import PRMScorer


def throughput(scorer: PRMScorer, rows: list[dict], repeats: int) -> tuple[float, list[list[float]]]:
    best, scores = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        scores = scorer.score([r["prompt"] for r in rows], [r["steps"] for r in rows])
        best = min(best, time.perf_counter() - start)
    return len(rows) / best, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=512, help="candidate solutions scored")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each; the best counts")
    parser.add_argument("--batch", type=int, default=None, help="paths per batch (default: evaluate's prm_batch_size)")
    args = parser.parse_args()
    torch.manual_seed(0)
    batch = args.batch or load_section("evaluate", EvaluateConfig).decoding.prm_batch_size
    rows = read_rows(paths.split_file("val", "prm_data"))[: args.paths]
    batched = PRMScorer.load(paths.model_dir("prm"), batch_size=batch)
    single = PRMScorer(batched.model, batched.tokenizer, batch_size=1)
    fast, fast_scores = throughput(batched, rows, args.repeats)
    slow, slow_scores = throughput(single, rows, args.repeats)
    read = {name: scorer.tokens // args.repeats for name, scorer in (("batched", batched), ("single", single))}
    worst = max(abs(a - b) for x, y in zip(fast_scores, slow_scores) for a, b in zip(x, y))
    lines = sum(len(r["steps"]) for r in rows)
    print(f"{len(rows)} candidate solutions ({lines} scored lines) on {batched.model.device}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"batched (batch {batch}):   {fast:8.1f} candidates/s, {read['batched']} tokens read")
    print(f"one at a time:        {slow:8.1f} candidates/s, {read['single']} tokens read")
    print(f"ratio: {fast / slow:.2f}x  (largest score difference {worst:.2e})")


if __name__ == "__main__":
    main()
