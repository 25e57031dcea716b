"""python bench/synthesis.py [--n 5000]

Chain-of-Functions synthesis throughput on one core: questions per second for
the default `synthesize` params (tables, chains, rejections, verbalization;
chart rendering excluded, it is a per-split subset), against the baseline of
building the same number of random tables alone.
"""

from __future__ import annotations

import argparse
import random
import time

from pipeline.cof.generate import generate_dataset
from pipeline.cof.tables import random_table
from pipeline.config import load_section


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000, help="questions to generate")
    args = parser.parse_args()
    cfg = load_section("synthesize")
    cfg = cfg.model_copy(update={"n_train": args.n, "n_val": 1, "n_test": 1, "n_ood": max(1, args.n // 20)})
    start = time.perf_counter()
    rows, stats = generate_dataset(cfg)
    seconds = time.perf_counter() - start
    total = sum(len(r) for r in rows.values())
    rng = random.Random(0)
    start = time.perf_counter()
    for _ in range(total):
        random_table(rng, cfg)
    table_seconds = time.perf_counter() - start
    print(f"questions: {total} in {seconds:.2f} s = {total / seconds:.0f} questions/s/core")
    print(f"attempts per kept question: {stats['attempts'] / total:.2f}")
    print(f"baseline, random tables alone: {total / table_seconds:.0f} tables/s; "
          f"synthesis costs {seconds / table_seconds:.1f}x the table draws")


if __name__ == "__main__":
    main()
