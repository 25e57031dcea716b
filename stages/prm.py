"""python -m stages.prm

The process reward model: the policy's causal LM (`prm_data.policy`, default
models/sft, which `sft` drilled on the ranking step so that a PRM started from
it can check that step: `sft.rank_drill`) whose LM head is read as a verdict
on each token of a line (pipeline/prm/model.py). It is trained on
data/prm_data/train.parquet (BCE on gold 0/1 labels, MSE on MCTS log_boost
labels; `prm.sources` picks which) and, as a generator, on the gold chains of data/prm_data/chains.parquet (next-token
cross-entropy weighted `prm.chain_weight`: a verifier that also learns to write
the right step checks steps better; docs/experiments/prm-writes-gold-chains.md)
and on contrast paths cut from those chains (`prm.contrast`: each choice step
once right and up to that many times wrong, pipeline/prm/contrast.py). Scored on the held-out gold labels of
validation questions (data/prm_data/val.parquet): AUROC, accuracy at 0.5 and
calibration (table, expected calibration error, reliability plot).

Writes models/prm/, metrics/prm.json and plots/prm/ (loss curve via dvclive,
calibration.json and calibration.png).
"""

from __future__ import annotations

import shutil

import torch

from pipeline.core import paths
from pipeline.core.io import atomic_dir, live_atomic_dir, read_rows, write_json, write_metrics
from pipeline.core.params import load_section
from pipeline.core.phases import stage_logger
from pipeline.core.plots import reliability_chart
from pipeline.data.params import TaskConfig
from pipeline.modeling import cards
from pipeline.modeling.models import load_tokenizer, save_model
from pipeline.orchestration.checks import check_task_fit
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.prm.model import STEP_LABEL_COLUMNS, PRMScorer, held_out, prm_from_policy, training_rows
from pipeline.prm.params import PRMConfig, PRMDataConfig
from pipeline.training.trainer import prm_train


def _flow(cfg: PRMConfig, policy: str, kind: str = "cof") -> None:
    if cfg.contrast and kind != "cof":
        # Contrast paths rewrite the chart task's choice steps; a dataset's steps are prose.
        stage_logger().info("prm: contrast paths skipped (task.kind is %s)", kind)
        cfg = cfg.model_copy(update={"contrast": 0})
    train_file, val_file = paths.split_file("train", "prm_data"), paths.split_file("val", "prm_data")
    rows, contrast, chains = training_rows(cfg)
    val = read_rows(val_file, required=STEP_LABEL_COLUMNS)
    chains_file = paths.prm_chains_file()
    policy_dir = paths.model_dir(policy)
    torch.manual_seed(cfg.seed)  # the data order
    tokenizer = load_tokenizer(policy_dir)
    model = prm_from_policy(policy_dir, cfg.extra_layers)
    out_dir = paths.model_dir("prm")
    with atomic_dir(out_dir) as out, live_atomic_dir(paths.live_dir("prm")) as live:
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
        cards.write_model_manifest(out, "prm", cfg, inputs=inputs, metrics=metrics, policy=policy)
        write_json(live / "calibration.json", table)
        reliability_chart(table, live / "calibration.png",
                          title=f"PRM calibration, held-out step labels\n(AUROC {metrics['auroc']})")
    write_metrics(paths.metrics_file("prm"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("prm", PRMConfig)
        policy = load_section("prm_data", PRMDataConfig).policy
        task_cfg = load_section("task", TaskConfig)
        check_task_fit(task_cfg, prm=cfg)
    run_stage("prm", _flow, cfg, policy, task_cfg.kind)


if __name__ == "__main__":
    main()
