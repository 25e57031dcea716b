"""python -m stages.sft

Supervised fine-tuning of models/base with TRL's SFTTrainer (loss on the
completion only), on `sft.source`: the gold Chain-of-Functions rationales, the
teacher's verified traces (data/distill/train.parquet), or both. With
`sft.curriculum`, a second phase trains on the hard set (data/distill/hard.parquet).
With `sft.mix` > 0, phase 1 also trains on that share of temporal questions
over video clips (data/animate/questions.parquet, a seeded sample).
With `distill.method: logits`, a phase distils the teacher's token
distributions on the student's own rollouts (TRL's DistillationTrainer).
Last, the ranking drill (`sft.rank_drill`; pipeline/training/drills.py: "The largest of
them is" after a listed set, on new random tables), a step the student
otherwise guesses: in phases (the largest alone, then largest and smallest,
then every rank), since with digit pairs the flat drill never clicks, and with
gold rationales replayed beside the drills, since without them the student
stops writing rationales (docs/experiments/ranking-drill-curriculum-and-replay.md).
Every policy after `sft` and the PRM start from the drilled student
(docs/experiments/ranking-drill-in-sft.md).

Curves go through dvclive into plots/sft/ (phase 2 and 3 in sub-folders, the
drill's in rank_drill/), the summary into metrics/sft.json, the model into
models/sft/.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

from pipeline.core import paths
from pipeline.core.io import InputError, atomic_dir, live_atomic_dir, read_rows, sample_rows, write_metrics
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.data.params import DistillConfig, SynthesizeConfig, TaskConfig
from pipeline.data.task_data import gold_rows
from pipeline.modeling import cards, lora
from pipeline.modeling.models import MASTER_DTYPE, default_device, load_model
from pipeline.modeling.params import LoraConfig, ModelLoadConfig
from pipeline.orchestration.checks import check_packing
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.training.drills import curve_log, train_rank_drill
from pipeline.training.params import RankDrillConfig, SFTConfig
from pipeline.training.trainer import logit_distill, sft_train

DISTILLED = paths.split_file("train", stage="distill")
HARD = paths.split_file("hard", stage="distill")


def training_rows(source: str, share: float = 1.0, limit: int | None = None) -> tuple[list[dict], list[Path]]:
    """(rows, files read) for `sft.source`; `share` thins the gold rows (`sft.rationale_share`), `limit` keeps the
    first rows of the source (`sft.max_train_samples`): with `mixed`, the first gold rows and every verified trace
    on top, so that the traces are trained on however few gold rows there are."""
    files = {"gold": [paths.split_file("train")], "distilled": [DISTILLED],
             "mixed": [paths.split_file("train"), DISTILLED]}[source]
    rows = [row for f in files
            for row in (gold_rows(share)[:limit] if f == paths.split_file("train") else
                        read_rows(f, required=("prompt", "rationale"))[: limit if source == "distilled" else None])]
    if not rows:
        thinned = f" and sft.rationale_share={share} (a share of the gold rows: raise it)" if share < 1 else ""
        raise InputError(f"{', '.join(map(str, files))}: no training rows for sft.source={source}{thinned}")
    return rows, files


def temporal_rows(mix: float, n: int, seed: int) -> list[dict]:
    """round(mix * n) temporal questions of data/animate (a seeded sample, in file order; all of them at most)."""
    if mix <= 0:
        return []
    rows = read_rows(paths.animate_questions(), required=("prompt", "rationale"))
    return sample_rows(rows, round(mix * n), random.Random(seed))


def mix_rows(cfg: SFTConfig, rows: list[dict]) -> tuple[SFTConfig, list[dict], int]:
    """`sft.mix`: (SFTConfig, phase-1 rows, temporal rows added); the temporal share comes on top of the
    `max_train_samples` rows, so the truncation moves to here and the trainer keeps every mixed row."""
    base = rows[: cfg.max_train_samples]
    extra = temporal_rows(cfg.mix, len(base), cfg.seed)
    if not extra:
        return cfg, rows, 0
    if cfg.max_train_samples is not None:
        cfg = cfg.model_copy(update={"max_train_samples": len(base) + len(extra)})
    return cfg, base + extra, len(extra)  # appended: the trainer's sampler shuffles


def rank_drilled(model, tokenizer, cfg: RankDrillConfig, synth: SynthesizeConfig, live_dir: Path,
                 task_kind: str = "cof") -> dict | None:
    """The ranking drill in place on `model` (curves in `live_dir`); its metrics, None when it has no steps.

    Its replay rows are the gold rationales of data/synthesize/train.parquet, whatever `sft.source`. The chart
    task only: its tables are charts.
    """
    if not cfg.steps and not any(cfg.curriculum):
        return None
    if task_kind != "cof":
        stage_logger().info("sft: ranking drill skipped (task.kind is %s: the drill reads chart tables)", task_kind)
        return None
    model.to(default_device())  # the drill's own loop (a Trainer places the model itself)
    gold = read_rows(paths.split_file("train"), required=("prompt", "rationale")) if cfg.replay else []
    with curve_log(live_dir) as log:
        metrics = train_rank_drill(model, tokenizer, cfg, synth, log, replay=gold)
    level = logging.INFO if metrics["exact"] >= cfg.expect else logging.WARNING
    # Below `expect` the student still guesses which key a ranked step names (study `best-of-n-on-500-questions`).
    stage_logger().log(level, "ranking drill: held-out exact match %.3f -> %.3f after %d steps (expected >= %.2f)",
                       metrics["exact_before"], metrics["exact"], metrics["steps"], cfg.expect)
    return metrics


@phase("train")
def run(cfg: SFTConfig, distill: DistillConfig, synth: SynthesizeConfig, model, tokenizer, rows: list[dict],
        val_rows: list[dict], work_dir: Path, live_dir: Path, phase1: tuple[SFTConfig, list[dict]] | None = None,
        task_kind: str = "cof") -> dict:
    """All phases in place on `model`; returns the summary metrics (phase 1 flat, later nested).

    Phase 1 trains on `phase1` (`sft.mix`'s config and rows, from mix_rows) when given, else on (cfg, rows);
    the curriculum's stage 2 and logit distillation always get `cfg` and `rows`, without temporal questions.
    The ranking drill, last, draws its tables as `synth` draws the questions' charts.
    """
    phase1_cfg, phase1_rows = phase1 or (cfg, rows)
    metrics = {"source": cfg.source,
               **sft_train(phase1_cfg, model, tokenizer, phase1_rows, val_rows, work_dir, live_dir)}
    if cfg.curriculum:
        hard = read_rows(HARD, required=("prompt", "rationale"))
        if hard:
            metrics["stage2"] = sft_train(
                cfg, model, tokenizer, hard, val_rows, work_dir, live_dir / "stage2",
                num_train_epochs=cfg.stage2_epochs, learning_rate=cfg.stage2_learning_rate, max_steps=-1,
            )
        else:  # nothing in the pass-rate window: say so rather than fail the whole run
            stage_logger().warning("sft: curriculum stage 2 skipped, %s is empty", HARD)
            metrics["stage2"] = {"examples": 0}
    if distill.method == "logits":
        from pipeline.inference.teacher import load_local

        teacher, teacher_tok = load_local(paths.model_dir("teacher"))
        if teacher_tok.get_vocab() != tokenizer.get_vocab():
            raise InputError(f"{paths.model_dir('teacher')}: distill.method=logits needs the student's tokenizer")
        metrics["logits"] = logit_distill(
            distill, model, teacher, tokenizer, rows, work_dir, live_dir / "logits", seed=cfg.seed,
            batch_size=cfg.per_device_train_batch_size,
        )
    drill = rank_drilled(model, tokenizer, cfg.rank_drill, synth, live_dir / "rank_drill", task_kind)
    if drill:
        metrics["rank_drill"] = drill
    return metrics


def _flow(cfg: SFTConfig, distill: DistillConfig, synth: SynthesizeConfig, task_cfg: TaskConfig,
          lora_cfg: LoraConfig) -> None:
    val_file = paths.split_file("val")
    val_rows = read_rows(val_file, required=("prompt", "rationale"))
    # fail on a missing input before loading anything; max_train_samples is applied here, to the source's rows
    rows, files = training_rows(cfg.source, cfg.rationale_share, cfg.max_train_samples)
    cut = cfg.model_copy(update={"max_train_samples": None})
    train_cfg, mixed, temporal = mix_rows(cut, rows)  # mix 0: (cut, rows, 0), phase 1 as before
    if cfg.mix > 0:
        files.append(paths.animate_questions())
    model, tokenizer = load_model(paths.model_dir("base"), dtype=MASTER_DTYPE)
    model = lora.wrap(model, lora_cfg, "sft", cfg.seed)
    with atomic_dir(paths.model_dir("sft")) as out, live_atomic_dir(paths.live_dir("sft")) as live:
        metrics = run(cut, distill, synth, model, tokenizer, rows, val_rows, out / ".trainer", live,
                      (train_cfg, mixed), task_cfg.kind)
        metrics["train_rows"] = len(rows)
        if cfg.mix > 0:
            metrics["temporal_rows"] = temporal
        metrics.update(lora.summary(model, lora_cfg))
        stage_logger().info("sft: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        lora.save(model, tokenizer, out, lora_cfg, base=paths.model_dir("base"))
        inputs = [paths.model_dir("base"), *files, val_file] + ([HARD] if cfg.curriculum else [])
        if cfg.rank_drill.replay and paths.split_file("train") not in inputs:
            inputs.append(paths.split_file("train"))
        cards.write_model_manifest(out, "sft", cfg, inputs=inputs, metrics=metrics,
                                   distill_method=distill.method, **lora.manifest(lora_cfg, "sft"))
    write_metrics(paths.metrics_file("sft"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("sft", SFTConfig)
        distill = load_section("distill", DistillConfig)
        synth = load_section("synthesize", SynthesizeConfig)
        task_cfg = load_section("task", TaskConfig)
        lora_cfg = load_section("lora", LoraConfig)
        # here too, not only in `pipeline repro`'s validation: a plain `dvc repro` runs this directly
        check_packing(cfg, load_section("model", ModelLoadConfig), "sft")
    run_stage("sft", _flow, cfg, distill, synth, task_cfg, lora_cfg)


if __name__ == "__main__":
    main()
