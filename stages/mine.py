"""python -m stages.mine

Hard-case mining on the SFT policy (pipeline/data/mining.py has the rules): G
rollouts per prompt of the RL pool (a seeded sample of the training questions)
at the GRPO rollout temperature, graded on the final answer; pass rates put
each prompt in a bucket (unsolved, hard, easy, solved) whose repeat count
builds the oversampled RL set; prompts with a right and a wrong rollout give
on-policy preference pairs.

The mean pass rate is p0, the SFT policy's sampled success rate on the RL pool,
the starting point of the success-amplification recurrence (docs/methods.md,
"Success amplification").

Writes data/mine/ (rl.parquet: the GRPO dataset; pool.parquet: every pool
prompt with its pass rate and bucket; pairs.parquet: DPO pairs),
metrics/mine.json and plots/mine/ (the pass-rate histogram).
"""

from __future__ import annotations

import random
import time

from tqdm.auto import tqdm

from pipeline.core import paths
from pipeline.core.io import (
    EXAMPLE_COLUMNS,
    atomic_dir,
    read_rows,
    sample_rows,
    write_json,
    write_manifest,
    write_metrics,
    write_rows,
)
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.core.plots import bar_chart
from pipeline.data.distill import PAIR_SCHEMA, histogram, select
from pipeline.data.mining import RL_SCHEMA, policy_pairs, rl_set
from pipeline.data.params import MineConfig
from pipeline.inference.engines import local_sampler
from pipeline.orchestration.flows import expected_errors, run_stage


def pool(rows: list[dict], cfg: MineConfig) -> list[dict]:
    """A seeded sample of `pool_size` training questions, in their file order."""
    return sample_rows(rows, cfg.pool_size, random.Random(cfg.seed))


@phase("sample the policy")
def run(cfg: MineConfig, sampler, rows: list[dict]) -> tuple[dict, dict]:
    """(tables by file name, metrics)."""
    start = time.perf_counter()
    samples = sampler.sample(
        [r["prompt"] for r in rows], n=cfg.rollouts, temperature=cfg.temperature, top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
    )
    seconds = time.perf_counter() - start
    # A rollout counts as a success on its final answer alone (the accuracy reward); no dedup.
    results = [
        select(row, gens, max_traces=cfg.rollouts, min_step_accuracy=0.0, near_duplicate_threshold=1.0)
        for row, gens in tqdm(list(zip(rows, samples)), desc="grade", unit="prompt")
    ]
    rl_rows, buckets, pool_rows = rl_set(results, cfg)
    pairs = policy_pairs(results, cfg.max_pairs_per_prompt)
    tokens = sum(g.tokens for gens in samples for g in gens)
    metrics = {
        "pool_prompts": len(rows),
        "rollouts": cfg.rollouts,
        # p0: the SFT policy's sampled success rate on the RL pool
        "p0": round(sum(r.pass_rate for r in results) / max(len(results), 1), 4),
        "pass_at_g": round(sum(r.correct > 0 for r in results) / max(len(results), 1), 4),
        "pass_rate_histogram": histogram(results, cfg.rollouts),
        "buckets": dict(buckets),
        "rl_rows": len(rl_rows),
        "preference_pairs": len(pairs),
        "policy_tokens": tokens,
        "sampling_seconds": round(seconds, 1),
    }
    tables = {"rl.parquet": (rl_rows, RL_SCHEMA), "pool.parquet": (pool_rows, RL_SCHEMA),
              "pairs.parquet": (pairs, PAIR_SCHEMA)}
    return tables, metrics


def _flow(cfg: MineConfig) -> None:
    train_file, model_dir = paths.split_file("train"), paths.model_dir("sft")
    rows = pool(read_rows(train_file, required=EXAMPLE_COLUMNS), cfg)
    tables, metrics = run(cfg, local_sampler(model_dir, cfg.batch_size, "sft"), rows)
    stage_logger().info(
        "mine: p0 %.3f on %d prompts, buckets %s, %d RL rows, %d pairs",
        metrics["p0"], metrics["pool_prompts"], metrics["buckets"], metrics["rl_rows"], metrics["preference_pairs"],
    )
    completions = metrics["pool_prompts"] * metrics["rollouts"]
    if completions and metrics["policy_tokens"] <= 2 * completions:  # a token or two each: EOS comes first
        stage_logger().warning("mine: the policy's %d completions have %d tokens in all: it stops at once. A chat "
                               "model on raw prompts does that (prompt.format: chat), or a model that never learnt "
                               "the task's answers", completions, metrics["policy_tokens"])
    if not tables["rl.parquet"][0]:
        stage_logger().warning("mine: the RL set is empty (every bucket excluded or empty); grpo will refuse it")
    with atomic_dir(paths.stage_data("mine")) as out:
        for name, (table, schema) in tables.items():
            write_rows(out / name, table, schema=schema)
        # counts only, so that a rerun writes identical bytes and does not re-run grpo and dpo
        counts = {k: v for k, v in metrics.items() if "second" not in k}
        write_manifest(out, "mine", cfg, inputs=[model_dir, train_file], counts=counts)
    with atomic_dir(paths.live_dir("mine")) as out:
        hist = metrics["pass_rate_histogram"]
        write_json(out / "pass_rate.json", [{"pass_rate": k, "prompts": v} for k, v in hist.items()])
        bar_chart(hist, out / "pass_rate.png", title=f"SFT policy pass rate over G={cfg.rollouts} rollouts",
                  xlabel="prompts", xmax=None, fmt="{:.0f}")
    write_metrics(paths.metrics_file("mine"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("mine", MineConfig)
    run_stage("mine", _flow, cfg)


if __name__ == "__main__":
    main()
