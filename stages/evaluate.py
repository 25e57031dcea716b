"""python -m stages.evaluate --model sft

Batched greedy generation (in process, or through the endpoint of an API teacher) on the test and ood questions, graded with
pipeline/grading.py, then k sampled completions per question on the first
`evaluate.k_samples` questions for pass@k and maj@k. Writes
metrics/evaluate/<model>.json (accuracy, accuracy_ood, step accuracy, breakdowns,
pass@k, maj@k, cost, the majority baseline), the graded greedy generations
in data/evaluate/<model>/ and accuracy-by-task-type plots in plots/evaluate/<model>/.
"""

from __future__ import annotations

import argparse
import time

from pipeline import paths
from pipeline.config import EvaluateConfig, load_section
from pipeline.evaluation import majority_baseline, sampled_metrics, score, summarize
from pipeline.flows import expected_errors, run_stage, stage_logger
from pipeline.generation import Sampler
from pipeline.io import EXAMPLE_COLUMNS, atomic_dir, read_rows, write_json, write_manifest, write_rows
from pipeline.plots import bar_chart


def run(cfg: EvaluateConfig, sampler: Sampler, rows_by_split: dict[str, list[dict]]) -> tuple[dict, list[dict]]:
    """Generate and grade every split; returns (metrics by split, graded records)."""
    records, by_split = [], {}
    for split, rows in rows_by_split.items():
        rows = rows[: cfg.max_samples]
        start = time.perf_counter()
        generations = sampler.sample(
            [r["prompt"] for r in rows], n=1, temperature=0.0, top_p=1.0, max_new_tokens=cfg.max_new_tokens, seed=0
        )
        seconds = time.perf_counter() - start
        graded = [score(row, gens[0].text, gens[0].tokens) for row, gens in zip(rows, generations)]
        by_split[split] = {**summarize(graded), "seconds_per_question": round(seconds / max(len(rows), 1), 4)}
        by_split[split]["sampled"] = sampled(cfg, sampler, rows[: cfg.k_samples])
        records += graded
    return by_split, records


def sampled(cfg: EvaluateConfig, sampler: Sampler, rows: list[dict]) -> dict:
    """pass@k and maj@k: k samples per question at `k_temperature`, with their cost."""
    start = time.perf_counter()
    samples = sampler.sample(
        [r["prompt"] for r in rows], n=cfg.k, temperature=cfg.k_temperature, top_p=1.0,
        max_new_tokens=cfg.max_new_tokens, seed=0,
    )
    seconds = time.perf_counter() - start
    metrics = sampled_metrics(rows, [[g.text for g in gens] for gens in samples], cfg.k)
    tokens = sum(g.tokens for gens in samples for g in gens)
    return {**metrics, "temperature": cfg.k_temperature, "tokens_per_question": round(tokens / max(len(rows), 1), 1),
            "seconds_per_question": round(seconds / max(len(rows), 1), 4)}


def headline(by_split: dict[str, dict], baseline: float) -> dict:
    """Top-level metrics: test numbers flat (what `dvc metrics diff` compares), ood beside them."""
    test = by_split.get("test", next(iter(by_split.values())))
    out = {k: test[k] for k in ("accuracy", "step_accuracy", "by_answer_type", "by_task_type", "by_chain_length")}
    k = test["sampled"]["k"]
    out[f"pass_at_{k}"], out[f"maj_at_{k}"] = test["sampled"][f"pass_at_{k}"], test["sampled"][f"maj_at_{k}"]
    out["sampled"] = test["sampled"]
    out["tokens_per_question"] = test["tokens_per_question"]
    out["seconds_per_question"] = test["seconds_per_question"]
    out["baseline_majority"] = baseline
    if "ood" in by_split:
        out["accuracy_ood"] = by_split["ood"]["accuracy"]
        out["step_accuracy_ood"] = by_split["ood"]["step_accuracy"]
        out[f"pass_at_{k}_ood"] = by_split["ood"]["sampled"][f"pass_at_{k}"]
        out[f"maj_at_{k}_ood"] = by_split["ood"]["sampled"][f"maj_at_{k}"]
    # The other splits' full breakdowns, one section each ("ood", "val"); test is the flat part above.
    out.update({split: m for split, m in by_split.items() if split != "test"})
    out["answer_line_rate"] = test["answer_line_rate"]
    return out


def _flow(cfg: EvaluateConfig, model_name: str) -> None:
    from pipeline.teacher import load_sampler

    split_files = {split: paths.split_file(split) for split in cfg.splits}
    rows_by_split = {s: read_rows(f, required=EXAMPLE_COLUMNS) for s, f in split_files.items()}
    train_rows = read_rows(paths.split_file("train"), required=("answer", "answer_type"))
    model_dir = paths.model_dir(model_name)
    by_split, records = run(cfg, load_sampler(model_dir, cfg.batch_size), rows_by_split)
    metrics = headline(by_split, majority_baseline(train_rows, rows_by_split.get("test", records)))
    stage_logger().info(
        "%s: accuracy %.3f (majority baseline %.3f), ood %s",
        model_name, metrics["accuracy"], metrics["baseline_majority"], metrics.get("accuracy_ood"),
    )
    with atomic_dir(paths.eval_predictions_dir(model_name)) as out:
        write_rows(out / "predictions.parquet", records)
        write_manifest(out, "evaluate", cfg, inputs=[model_dir, *split_files.values()], model=model_name)
    with atomic_dir(paths.eval_plots_dir(model_name)) as out:
        rows = [{"task_type": k, "accuracy": v} for k, v in metrics["by_task_type"].items()]
        write_json(out / "by_task_type.json", rows)
        bar_chart(metrics["by_task_type"], out / "by_task_type.png", title=f"{model_name}: test accuracy by task type")
    write_json(paths.eval_metrics_file(model_name), metrics)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="folder name under models/ (e.g. sft)")
    args = parser.parse_args(argv)
    with expected_errors():
        cfg = load_section("evaluate", EvaluateConfig)
    run_stage("evaluate", _flow, cfg, args.model)


if __name__ == "__main__":
    main()
