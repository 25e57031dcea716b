"""python bench/synthesis.py [--n 5000] [--workers 2]

Chain-of-Functions synthesis throughput for the default `synthesize` params
asking `--n` questions in params.yaml's split proportions (tables, chains,
rejections, verbalization; chart rendering excluded, it is a per-split subset):
on one core, against the baseline of building the same number of random tables
alone; then on `--workers` processes against one, side by side, checking that
both give the same rows.

The split proportions are params.yaml's (6000:300:500:300 by default): the
split of a question is a hash of its text, so a split asked far below its share
(1 val question in 50,000) leaves the generator hunting for a text that hashes
into it once the others are full.
"""

from __future__ import annotations

import argparse
import random
import time

from pipeline.data.cof.generate import SPLITS, block_count, generate_dataset
from pipeline.data.cof.tables import random_table
from pipeline.data.params import SynthesizeConfig
from pipeline.orchestration.sections import load_named


def scaled(cfg: SynthesizeConfig, n: int) -> SynthesizeConfig:
    """`cfg` asking `n` questions in its own split proportions (train takes the rounding)."""
    sizes = {"n_val": cfg.n_val, "n_test": cfg.n_test, "n_ood": cfg.n_ood}
    total = cfg.n_train + sum(sizes.values())
    update = {key: max(1, round(size * n / total)) for key, size in sizes.items()}
    return cfg.model_copy(update={**update, "n_train": n - sum(update.values())})


def timed(cfg: SynthesizeConfig, workers: int) -> tuple[tuple[dict, dict], float]:
    start = time.perf_counter()
    out = generate_dataset(cfg.model_copy(update={"workers": workers}))
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000, help="questions to generate")
    parser.add_argument("--workers", type=int, default=2, help="processes, compared with one")
    args = parser.parse_args()
    cfg = scaled(load_named("synthesize"), args.n)
    (rows, stats), seconds = timed(cfg, 1)
    total = sum(len(r) for r in rows.values())
    rng = random.Random(0)
    start = time.perf_counter()
    for _ in range(total):
        random_table(rng, cfg)
    table_seconds = time.perf_counter() - start
    print(f"questions: {total} in {seconds:.2f} s = {total / seconds:.0f} questions/s/core "
          f"({', '.join(f'{len(rows[s])} {s}' for s in SPLITS)}; {block_count(cfg)} blocks)")
    print(f"attempts per kept question: {stats['attempts'] / total:.2f}")
    print(f"baseline, random tables alone: {total / table_seconds:.0f} tables/s; "
          f"synthesis costs {seconds / table_seconds:.1f}x the table draws")
    (rows_n, stats_n), seconds_n = timed(cfg, args.workers)
    same = rows_n == rows and stats_n == stats
    print(f"{args.workers} workers: {seconds_n:.2f} s = {total / seconds_n:.0f} questions/s, "
          f"{seconds / seconds_n:.2f}x one worker ({seconds:.2f} s); same rows and stats: {same}")
    if not same:
        raise SystemExit(f"{args.workers} workers gave other rows than one")


if __name__ == "__main__":
    main()
