"""python -m stages.evaluate --model sft

Batched greedy generation (in process, or through the endpoint of an API teacher) on the test and ood questions, graded
with pipeline/data/grading.py, then, on the splits of `evaluate.sampled_splits`, max(k, N) sampled completions per
question on the first `evaluate.k_samples` questions for pass@k and maj@k, and the decoding strategies
at budget N on the first `evaluate.decoding.questions` of them (pipeline/evaluation/decoding.py: greedy, maj@N, PRM
best-of-N, PRM beam search, PRM-MCTS, each with tokens and seconds per question), then the
faithfulness probes (binary comparisons asked in both operand orders; strict trends asked in both
directions). Writes
metrics/evaluate/<model>.json (accuracy, accuracy_ood, step accuracy, breakdowns,
pass@k, maj@k, decoding.<strategy>, faithfulness, cost, the majority baseline),
the graded greedy generations in data/evaluate/<model>/ and plots (accuracy by
task type, by decoding strategy) in plots/evaluate/<model>/. Every answer is also read leniently (the last
number, yes or no, or the gold word of the last line: `lenient_accuracy`), so that a gain is not only the
answer format learned. `--model base` scores a loaded base model as it is, zero-shot; for a student built here
(and a teacher that is models/base itself) it writes outputs that say why nothing was measured.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeline.core import paths
from pipeline.core.io import (
    EXAMPLE_COLUMNS,
    atomic_dir,
    read_json,
    read_rows,
    write_json,
    write_manifest,
    write_metrics,
    write_rows,
)
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.core.plots import bar_chart, fill_skipped
from pipeline.data import task as tasks
from pipeline.evaluation.decoding import PROBE_KINDS, Decoder, faithfulness_probes, inconsistency
from pipeline.evaluation.metrics import majority_baseline, sampled_metrics, score, summarize
from pipeline.evaluation.params import EvaluateConfig
from pipeline.inference.generation import Sampler
from pipeline.orchestration.flows import expected_errors, run_stage


@phase("evaluate")
def run(cfg: EvaluateConfig, sampler: Sampler, rows_by_split: dict[str, list[dict]],
        decoder: Decoder | None = None) -> tuple[dict, list[dict]]:
    """Generate and grade every split; returns (metrics by split, graded greedy records)."""
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
        records += graded
        if split not in cfg.sampled_splits:  # greedy only
            continue
        k_rows = rows[: cfg.k_samples]
        by_split[split]["sampled"], samples, sample_seconds = sampled(cfg, sampler, k_rows)
        if decoder is not None:
            d_rows = k_rows[: cfg.decoding.questions]
            greedy = [(g.text, g.tokens) for gens in generations[: len(d_rows)] for g in gens]
            whole = [[(g.text, g.tokens) for g in gens] for gens in samples[: len(d_rows)]]
            by_split[split]["decoding"] = decoder.run(
                d_rows, greedy, seconds * len(d_rows) / max(len(rows), 1), whole,
                sample_seconds * len(d_rows) / max(len(k_rows), 1),
            )
    return by_split, records


def sampled(cfg: EvaluateConfig, sampler: Sampler, rows: list[dict]) -> tuple[dict, list, float]:
    """pass@k and maj@k from max(k, N) samples per question at `k_temperature`; (metrics, samples, seconds).

    The samples are also the N whole solutions of maj@N and PRM best-of-N.
    """
    n = max(cfg.k, cfg.decoding.n)
    start = time.perf_counter()
    samples = sampler.sample(
        [r["prompt"] for r in rows], n=n, temperature=cfg.k_temperature, top_p=1.0,
        max_new_tokens=cfg.max_new_tokens, seed=0,
    )
    seconds = time.perf_counter() - start
    metrics = sampled_metrics(rows, [[g.text for g in gens] for gens in samples], cfg.k)
    tokens = sum(g.tokens for gens in samples for g in gens)
    metrics = {**metrics, "samples": n, "temperature": cfg.k_temperature,
               "tokens_per_question": round(tokens / max(len(rows), 1), 1),
               "seconds_per_question": round(seconds / max(len(rows), 1), 4)}
    return metrics, samples, seconds


def faithfulness(cfg: EvaluateConfig, sampler: Sampler, rows_by_split: dict[str, list[dict]],
                 records: list[dict]) -> dict:
    """Greedy answers to each probe question and to its twin: the inconsistency rate of swapped comparisons
    (flat, as before) and, under `trend`, of reversed trend questions."""
    predicted = {(r["split"], r["id"]): r["prediction"] for r in records}
    out = {}
    for kind in PROBE_KINDS:
        probes = [p for rows in rows_by_split.values() for p in faithfulness_probes(rows[: cfg.max_samples], kind)]
        twins = sampler.sample([prompt for _, prompt in probes], n=1, temperature=0.0, top_p=1.0,
                               max_new_tokens=cfg.max_new_tokens, seed=0) if probes else []
        out[kind] = inconsistency([(predicted[(row["split"], row["id"])], tasks.active().extract(gens[0].text))
                                   for (row, _), gens in zip(probes, twins)], kind)
    return {**out["order"], "trend": out["trend"]}


def headline(by_split: dict[str, dict], baseline: float) -> dict:
    """Top-level metrics: test numbers flat (what `dvc metrics diff` compares), ood beside them."""
    test = by_split.get("test", next(iter(by_split.values())))
    out = {k: test[k] for k in ("accuracy", "lenient_accuracy", "step_accuracy", "by_answer_type", "by_task_type",
                                "by_chain_length")}
    out["questions"] = test["n"]
    if "sampled" in test:
        k = test["sampled"]["k"]
        out[f"pass_at_{k}"], out[f"maj_at_{k}"] = test["sampled"][f"pass_at_{k}"], test["sampled"][f"maj_at_{k}"]
        out["sampled"] = test["sampled"]
    out["tokens_per_question"] = test["tokens_per_question"]
    out["seconds_per_question"] = test["seconds_per_question"]
    out["baseline_majority"] = baseline
    if "ood" in by_split:
        ood = by_split["ood"]
        out["accuracy_ood"] = ood["accuracy"]
        out["lenient_accuracy_ood"] = ood["lenient_accuracy"]
        out["step_accuracy_ood"] = ood["step_accuracy"]
        if "sampled" in ood:  # evaluate.sampled_splits names ood
            k = ood["sampled"]["k"]
            out[f"pass_at_{k}_ood"], out[f"maj_at_{k}_ood"] = (ood["sampled"][f"pass_at_{k}"],
                                                               ood["sampled"][f"maj_at_{k}"])
    # The other splits' full breakdowns, one section each ("ood", "val"); test is the flat part above.
    out.update({split: m for split, m in by_split.items() if split != "test"})
    out["answer_line_rate"] = test["answer_line_rate"]
    if "decoding" in test:
        # decoding.<strategy>: test numbers flat, the ood accuracy and breakdown beside them
        out["decoding"] = {
            name: {**m, **({"accuracy_ood": by_split["ood"]["decoding"][name]["accuracy"],
                            "by_task_type_ood": by_split["ood"]["decoding"][name]["by_task_type"]}
                           if "decoding" in by_split.get("ood", {}) else {})}
            for name, m in test["decoding"].items()
        }
        for name, m in by_split.get("ood", {}).get("decoding", {}).items():
            for key in ("ceilings", "vs_greedy", "vs_random"):
                if key in m:
                    out["decoding"][name][f"{key}_ood"] = m[key]
    return out


def build_decoder(cfg: EvaluateConfig, sampler: Sampler, model_dir) -> Decoder:
    """The strategies' runner: with the PRM (tokenizer checked against the policy's) and a step policy when local."""
    from pipeline.evaluation.search import StepPolicy
    from pipeline.prm.model import PRMScorer, check_tokenizer

    dcfg, scorer, policy = cfg.decoding, None, None
    local = sampler.local
    if dcfg.prm is not None and any(s.startswith("prm_") for s in dcfg.strategies):
        prm_dir = paths.model_dir(dcfg.prm)
        scorer = PRMScorer.load(prm_dir, dcfg.prm_batch_size)
        if local:
            check_tokenizer(scorer.tokenizer, sampler.tokenizer, prm_dir, model_dir)
        else:
            stage_logger().warning("evaluate: %s is not a local model; the PRM's tokenizer cannot be checked and "
                                   "beam search and PRM-MCTS (step sampling) are skipped", model_dir)
    if local and scorer is not None:
        policy = StepPolicy(sampler.model, sampler.tokenizer, batch_size=dcfg.step_batch_size,
                            step_tokens=dcfg.step_tokens, completion_tokens=cfg.max_new_tokens,
                            temperature=cfg.k_temperature)
    return Decoder(dcfg, scorer, policy)


def skip_reason(model_name: str) -> str | None:
    """Why `evaluate@<model>` measures nothing here (None: it evaluates). `base` is evaluated as loaded, zero-shot,
    when it is a model brought in (`base.model`): a student built here before SFT has not learned the task's
    answers yet. The teacher is skipped when it is a reference to models/base itself (self-distillation), which
    evaluate@base scores."""
    from pipeline.inference.teacher import backend_of

    if model_name == "base":
        manifest = read_json(paths.model_dir("base") / paths.MODEL_MANIFEST)
        if not (manifest.get("params") or {}).get("model"):
            return "models/base is the student built here, before SFT (evaluate@base scores a loaded model zero-shot)"
    if model_name == "teacher" and Path(backend_of(paths.model_dir("teacher")).get("model") or "") == \
            paths.model_dir("base"):
        return "the teacher is models/base itself (self-distillation): evaluate@base scores it"
    return None


def write_skipped(model_name: str, reason: str) -> None:
    """Outputs that say why nothing was measured: no predictions, empty plots, the reason as the metrics."""
    stage_logger().info("%s: not evaluated: %s", model_name, reason)
    with atomic_dir(paths.eval_predictions_dir(model_name)) as out:
        write_rows(out / "predictions.parquet", [])
        write_manifest(out, "evaluate", {"skipped": reason}, model=model_name)
    with atomic_dir(paths.eval_plots_dir(model_name)) as out:
        write_json(out / "by_task_type.json", [])
        write_json(out / "decoding.json", [])
        fill_skipped(out, f"evaluate/{model_name}", reason)
    write_metrics(paths.eval_metrics_file(model_name), {"skipped": reason})


def _flow(cfg: EvaluateConfig, model_name: str) -> None:
    from pipeline.inference.teacher import load_sampler

    if (reason := skip_reason(model_name)) is not None:
        write_skipped(model_name, reason)
        return
    split_files = {split: paths.split_file(split) for split in cfg.splits}
    rows_by_split = {s: read_rows(f, required=EXAMPLE_COLUMNS) for s, f in split_files.items()}
    log = stage_logger()
    for split in [s for s, rows in rows_by_split.items() if not rows]:
        log.info("%s: split %s has no questions (the dataset has none): not evaluated", model_name, split)
        del rows_by_split[split]
    train_rows = read_rows(paths.split_file("train"), required=("answer", "answer_type"))
    model_dir = paths.model_dir(model_name)
    sampler = load_sampler(model_dir, cfg.batch_size)
    by_split, records = run(cfg, sampler, rows_by_split, build_decoder(cfg, sampler, model_dir))
    metrics = headline(by_split, majority_baseline(train_rows, rows_by_split.get("test", records)))
    if tasks.active().is_cof:
        metrics["faithfulness"] = faithfulness(cfg, sampler, rows_by_split, records)
    else:  # the probes rewrite chart questions ("Is A larger than B?" -> B than A)
        metrics["faithfulness"] = {"skipped": "the probes rewrite chart questions; task.kind is dataset"}
    log.info("%s: accuracy %.3f (majority baseline %.3f), ood %s", model_name, metrics["accuracy"],
             metrics["baseline_majority"], metrics.get("accuracy_ood"))
    for name, m in metrics.get("decoding", {}).items():
        log.info("%s: %-14s accuracy %.3f, ood %s, %.0f tokens and %.3f s per question", model_name, name,
                 m["accuracy"], m.get("accuracy_ood"), m["tokens_per_question"], m["seconds_per_question"])
    log.info("%s: faithfulness %s", model_name, metrics["faithfulness"])
    with atomic_dir(paths.eval_predictions_dir(model_name)) as out:
        write_rows(out / "predictions.parquet", records)
        write_manifest(out, "evaluate", cfg, inputs=[model_dir, *split_files.values()], model=model_name)
    with atomic_dir(paths.eval_plots_dir(model_name)) as out:
        rows = [{"task_type": k, "accuracy": v} for k, v in metrics["by_task_type"].items()]
        write_json(out / "by_task_type.json", rows)
        bar_chart(metrics["by_task_type"], out / "by_task_type.png", title=f"{model_name}: test accuracy by task type")
        decoding = {name: m["accuracy"] for name, m in metrics.get("decoding", {}).items()}
        write_json(out / "decoding.json", [{"strategy": k, "accuracy": v} for k, v in decoding.items()])
        if decoding:
            bar_chart(decoding, out / "decoding.png", title=f"{model_name}: test accuracy by decoding strategy")
    write_metrics(paths.eval_metrics_file(model_name), metrics)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="folder name under models/ (e.g. sft)")
    args = parser.parse_args(argv)
    with expected_errors():
        cfg = load_section("evaluate", EvaluateConfig)
    run_stage("evaluate", _flow, cfg, args.model)


if __name__ == "__main__":
    main()
