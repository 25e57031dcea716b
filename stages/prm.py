"""python -m stages.prm

The process reward model: the policy's causal LM (`prm_data.policy`, default
models/sft, which `sft` drilled on the ranking step so that a PRM started from
it can check that step: `sft.rank_drill`) whose LM head is read as a verdict
on each token of a line (pipeline/prm.py). It is trained on
data/prm_data/train.parquet (BCE on gold 0/1 labels, MSE on MCTS log_boost
labels; `prm.sources` picks which) and, as a generator, on the gold chains of data/prm_data/chains.parquet (next-token
cross-entropy weighted `prm.chain_weight`: a verifier that also learns to write
the right step checks steps better; README, "What the PRM can check") and on contrast paths cut from those chains
(`prm.contrast`: each choice step once right and up to that many times wrong, pipeline/contrast.py). Scored on the held-out gold labels of
validation questions (data/prm_data/val.parquet): AUROC, accuracy at 0.5 and
calibration (table, expected calibration error, reliability plot).

Writes models/prm/, metrics/prm.json and plots/prm/ (loss curve via dvclive,
calibration.json and calibration.png).
"""

from __future__ import annotations

import random
import shutil

import torch

from pipeline import paths
from pipeline.config import PRMConfig, PRMDataConfig, load_section
from pipeline.contrast import contrast_rows
from pipeline.flows import expected_errors, run_stage, stage_logger
from pipeline.io import InputError, atomic_dir, read_rows, write_json, write_manifest
from pipeline.models import load_tokenizer, save_model
from pipeline.plots import reliability_chart
from pipeline.prm import (
    AGGREGATIONS, PRMScorer, aggregate, auroc, calibration, expected_calibration_error, is_terminal, prm_from_policy,
)
from pipeline.training import prm_train

STEP_LABEL_COLUMNS = ("id", "prompt", "steps", "labels", "source")


def held_out(scorer: PRMScorer, rows: list[dict]) -> tuple[dict, list[dict]]:
    """AUROC, accuracy at 0.5 and calibration of the PRM on labelled rows; (metrics, calibration table)."""
    scores = scorer.score([r["prompt"] for r in rows], [r["steps"] for r in rows])
    flat = [(y, s, is_terminal(line)) for r, ss in zip(rows, scores) for y, s, line in zip(r["labels"], ss, r["steps"])]
    labels, probs = [y for y, _, _ in flat], [s for _, s, _ in flat]
    table = calibration(labels, probs)

    def area(keep) -> float | None:
        subset = [(y, s) for y, s, terminal in flat if keep(terminal)]
        value = auroc([y for y, _ in subset], [s for _, s in subset])
        return None if value is None else round(value, 4)

    return {
        "lines": len(flat),
        "within_question": within_question(rows, scores),
        "positive_share": round(sum(y >= 0.5 for y in labels) / max(len(labels), 1), 4),
        "auroc": area(lambda terminal: True),
        "auroc_steps": area(lambda terminal: not terminal),
        "auroc_answers": area(lambda terminal: terminal),
        "accuracy": round(sum((s >= 0.5) == (y >= 0.5) for y, s in zip(labels, probs)) / max(len(labels), 1), 4),
        "ece": expected_calibration_error(table),
    }, table


def within_question(rows: list[dict], scores: list[list[float]]) -> dict:
    """What best-of-N needs: among completions of one question, does the PRM rank a right answer above a wrong one?

    The share of (right, wrong) pairs of the same question ordered right (ties half), per aggregation of the
    line scores; the AUROC above also rewards telling easy questions from hard ones, this does not.
    """
    by_question: dict[str, list[tuple[float, list[float]]]] = {}
    for r, s in zip(rows, scores):
        right = float(is_terminal(r["steps"][-1]) and r["labels"][-1] >= 0.5)
        by_question.setdefault(r["id"], []).append((right, s))
    out: dict = {}
    for how in AGGREGATIONS:
        won = pairs = 0.0
        for items in by_question.values():
            scored = [(y, aggregate(s, how)) for y, s in items]
            for y_a, a in scored:
                for y_b, b in scored:
                    if y_a > y_b:
                        pairs += 1
                        won += 1.0 if a > b else 0.5 if a == b else 0.0
        out[f"pair_accuracy_{how}"] = round(won / pairs, 4) if pairs else None
    out["pairs"] = int(pairs)
    return out


def training_rows(cfg: PRMConfig, more_chains: list[dict] = ()) -> tuple[list[dict], list[dict], list[dict]]:
    """What the PRM trains on: (labelled paths of `cfg.sources`, contrast paths, gold chains to write).

    `more_chains` are appended to chains.parquet's, as `prm_data.chain_questions` would add them (bench/prm_variants.py).
    """
    train_file = paths.split_file("train", "prm_data")
    rows = [r for r in read_rows(train_file, required=STEP_LABEL_COLUMNS) if r["source"] in cfg.sources]
    if not rows:
        raise InputError(f"{train_file}: no step-label rows from the sources {cfg.sources}")
    chains_file = paths.prm_chains_file()
    chains = []
    if cfg.chain_weight or cfg.contrast:
        chains = read_rows(chains_file, required=STEP_LABEL_COLUMNS) + list(more_chains)
    contrast = contrast_rows(chains, cfg.contrast, random.Random(cfg.seed)) if cfg.contrast else []
    return rows, contrast, chains if cfg.chain_weight else []


def _flow(cfg: PRMConfig, policy: str) -> None:
    train_file, val_file = paths.split_file("train", "prm_data"), paths.split_file("val", "prm_data")
    rows, contrast, chains = training_rows(cfg)
    val = read_rows(val_file, required=STEP_LABEL_COLUMNS)
    chains_file = paths.prm_chains_file()
    policy_dir = paths.model_dir(policy)
    torch.manual_seed(cfg.seed)  # the data order
    tokenizer = load_tokenizer(policy_dir)
    model = prm_from_policy(policy_dir, cfg.extra_layers)
    out_dir = paths.model_dir("prm")
    with atomic_dir(out_dir) as out, atomic_dir(paths.live_dir("prm")) as live:
        metrics = prm_train(cfg, model, tokenizer, rows + contrast + chains, out / ".trainer", live)
        metrics["sources"] = {s: sum(r["source"] == s for r in rows) for s in cfg.sources}
        if chains:
            metrics["sources"]["chain"] = len(chains)
        if contrast:
            metrics["sources"]["contrast"] = len(contrast)
            metrics["contrast_wrong"] = sum(r["labels"][-1] < 0.5 for r in contrast)
        metrics["held_out"], table = held_out(PRMScorer(model, tokenizer, cfg.batch_size), val)
        # The headline numbers flat, for `dvc metrics diff`.
        metrics.update({k: metrics["held_out"][k] for k in ("auroc", "accuracy", "ece")})
        stage_logger().info("prm: held-out AUROC %s, accuracy %s, ECE %s on %d lines", metrics["auroc"],
                            metrics["accuracy"], metrics["ece"], metrics["held_out"]["lines"])
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        save_model(model, tokenizer, out)
        inputs = [policy_dir, train_file, val_file] + ([chains_file] if chains or contrast else [])
        write_manifest(out, "prm", cfg, inputs=inputs, name=paths.MODEL_MANIFEST, metrics=metrics, policy=policy)
        write_json(live / "calibration.json", table)
        reliability_chart(table, live / "calibration.png",
                          title=f"PRM calibration, held-out gold step labels\n(AUROC {metrics['auroc']})")
    write_json(paths.metrics_file("prm"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("prm", PRMConfig)
        policy = load_section("prm_data", PRMDataConfig).policy
    run_stage("prm", _flow, cfg, policy)


if __name__ == "__main__":
    main()
