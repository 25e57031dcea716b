"""python -m stages.distill

Rejection sampling from the teacher (pipeline/data/distill.py has the rules): K
samples per training question at temperature T, graded with
pipeline/data/grading.py; up to M verified, distinct traces kept per question; the
pass rate grades difficulty. Questions whose word n-grams overlap val/test/ood
questions are removed before any sampling, so the teacher is never paid for them.

Writes data/distill/ (train.parquet: verified traces; hard.parquet: the
curriculum's stage 2; pairs.parquet: teacher preference pairs; pass_rates.parquet),
metrics/distill.json and plots/distill/ (the pass-rate histogram).
"""

from __future__ import annotations

import time
from collections import Counter

from tqdm.auto import tqdm

from pipeline.core import paths
from pipeline.core.io import (
    EXAMPLE_COLUMNS,
    atomic_dir,
    read_rows,
    write_json,
    write_manifest,
    write_metrics,
    write_rows,
)
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.core.plots import bar_chart
from pipeline.data.distill import (
    DISTILLED_SCHEMA,
    PAIR_SCHEMA,
    PASS_RATE_SCHEMA,
    contaminated,
    eval_ngrams,
    histogram,
    in_window,
    outputs,
    select,
)
from pipeline.data.params import DistillConfig
from pipeline.inference.teacher import load_sampler
from pipeline.modeling import chat
from pipeline.orchestration.flows import expected_errors, run_stage

EVAL_SPLITS = ("val", "test", "ood")


@phase("sample the teacher")
def run(cfg: DistillConfig, sampler, train_rows: list[dict], eval_rows: list[dict]) -> tuple[dict, dict]:
    """(tables by file name, metrics)."""
    index = eval_ngrams(eval_rows, cfg.ngram)
    clean = [r for r in train_rows if not contaminated(r["question"], index, cfg.ngram)]
    if len(clean) < len(train_rows) / 2:  # templated questions share long phrases with the held-out ones
        stage_logger().warning(
            "distill: %d of %d training questions share a %d-word n-gram with val, test or ood and are left out "
            "(decontamination); on templated questions raise distill.ngram", len(train_rows) - len(clean),
            len(train_rows), cfg.ngram)
    contaminated_count = len(train_rows) - len(clean)
    examples, clean = clean[: cfg.shots], clean[cfg.shots :]
    questions = clean[: cfg.max_questions]
    start = time.perf_counter()
    with chat.with_shots([(r["prompt"], r["rationale"]) for r in examples]):
        samples = sampler.sample(
            [r["prompt"] for r in questions], n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
        )
    seconds = time.perf_counter() - start
    results = [
        select(row, gens, max_traces=cfg.max_traces, min_step_accuracy=cfg.min_step_accuracy,
               near_duplicate_threshold=cfg.near_duplicate_threshold, contamination=index, n=cfg.ngram)
        for row, gens in tqdm(list(zip(questions, samples)), desc="verify", unit="question")
    ]
    window = (cfg.hard_min_pass_rate, cfg.hard_max_pass_rate)
    verified, hard, pairs, rates = outputs(results, cfg.k, window)
    removed = sum((r.removed for r in results), Counter())
    n_samples = cfg.k * len(questions)
    tokens = sum(g.tokens for gens in samples for g in gens)
    metrics = {
        "questions_available": len(train_rows),
        "questions_sampled": len(questions),
        "shots": len(examples),
        "questions_removed": {"contaminated_question": contaminated_count},
        "samples": n_samples,
        "acceptance_rate": round(sum(r.correct for r in results) / max(n_samples, 1), 4),
        "mean_pass_rate": round(sum(r.pass_rate for r in results) / max(len(results), 1), 4),
        "pass_rate_histogram": histogram(results, cfg.k),
        "traces_kept": len(verified),
        "traces_removed": dict(sorted(removed.items())),
        "questions_with_traces": sum(bool(r.kept) for r in results),
        "hard_traces": len(hard),
        "hard_questions": sum(bool(r.kept) and in_window(r.pass_rate, *window) for r in results),
        "preference_pairs": len(pairs),
        "teacher": sampler.name,
        "teacher_tokens": tokens,
        "teacher_seconds": round(seconds, 1),
        "teacher_tokens_per_second": round(tokens / seconds, 1) if seconds else 0.0,
    }
    stats = getattr(sampler, "stats", None)
    if stats:
        metrics["teacher_requests"] = dict(stats)
    tables = {"train.parquet": (verified, DISTILLED_SCHEMA), "hard.parquet": (hard, DISTILLED_SCHEMA),
              "pairs.parquet": (pairs, PAIR_SCHEMA), "pass_rates.parquet": (rates, PASS_RATE_SCHEMA)}
    return tables, metrics


def _flow(cfg: DistillConfig) -> None:
    train_file = paths.split_file("train")
    train_rows = read_rows(train_file, required=EXAMPLE_COLUMNS)
    eval_files = [paths.split_file(s) for s in EVAL_SPLITS if paths.split_file(s).exists()]
    eval_rows = [row for f in eval_files for row in read_rows(f, required=("question",))]
    teacher_dir = paths.model_dir("teacher")
    sampler = load_sampler(teacher_dir, batch_size=cfg.batch_size)
    tables, metrics = run(cfg, sampler, train_rows, eval_rows)
    stage_logger().info(
        "distill: %d traces kept from %d questions (acceptance %.3f), %d hard, %d pairs",
        metrics["traces_kept"], metrics["questions_sampled"], metrics["acceptance_rate"], metrics["hard_traces"],
        metrics["preference_pairs"],
    )
    with atomic_dir(paths.stage_data("distill")) as out:
        for name, (rows, schema) in tables.items():
            write_rows(out / name, rows, schema=schema)
        # counts only: timings would make the folder differ on every run and re-run sft for nothing
        counts = {k: v for k, v in metrics.items() if "second" not in k and k != "teacher_requests"}
        write_manifest(out, "distill", cfg, inputs=[teacher_dir, train_file, *eval_files], counts=counts)
    with atomic_dir(paths.live_dir("distill")) as out:
        hist = metrics["pass_rate_histogram"]
        write_json(out / "pass_rate.json", [{"pass_rate": k, "questions": v} for k, v in hist.items()])
        bar_chart(hist, out / "pass_rate.png", title=f"Teacher pass rate over k={cfg.k} samples",
                  xlabel="questions", xmax=None, fmt="{:.0f}")
    write_metrics(paths.metrics_file("distill"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("distill", DistillConfig)
    run_stage("distill", _flow, cfg)


if __name__ == "__main__":
    main()
