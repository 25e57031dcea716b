"""python -m stages.teacher

The teacher that writes reasoning traces for distillation (`teacher.backend`):

- embedded (default, offline): trained here on the gold rationales with the same
  SFT code path as the student, from models/base (`teacher.init: base`: the
  drilled student, so it reads the table from its first step; it teaches by
  training longer than the student) or from a new model of the teacher's own
  size (`init: scratch`); either shares the student's tokenizer, so logit
  distillation is possible;
- transformers: a reference to a causal LM path or Hub id;
- openai: a reference to an OpenAI-compatible endpoint (the API key stays in
  the environment variable named by `api_key_env`).

Writes models/teacher/ and metrics/teacher.json (training curves: plots/teacher/).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.core import paths
from pipeline.core.io import atomic_dir, live_atomic_dir, read_rows, write_metrics
from pipeline.core.params import is_local, load_section
from pipeline.core.phases import stage_logger
from pipeline.core.plots import fill_skipped
from pipeline.modeling import cards
from pipeline.modeling.models import (
    MASTER_DTYPE,
    build_teacher,
    count_parameters,
    load_model,
    load_tokenizer,
    save_model,
)
from pipeline.modeling.params import ModelLoadConfig
from pipeline.orchestration.checks import check_packing
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.training.params import TeacherConfig
from pipeline.training.trainer import sft_train

REFERENCE_FIELDS = {
    "transformers": ("model",),
    "openai": ("model", "base_url", "api", "api_key_env", "concurrency", "timeout_s", "max_retries", "cache_dir"),
}


def _train_embedded(cfg: TeacherConfig) -> None:
    train_file, val_file = paths.split_file("train"), paths.split_file("val")
    train_rows = read_rows(train_file, required=("prompt", "rationale"))
    val_rows = read_rows(val_file, required=("prompt", "rationale"))
    if cfg.init == "base":  # the drilled student's weights: it reads the table from its first step
        model, tokenizer = load_model(paths.model_dir("base"), dtype=MASTER_DTYPE)
    else:
        tokenizer = load_tokenizer(paths.model_dir("base"))
        model = build_teacher(cfg, tokenizer)
    with atomic_dir(paths.model_dir("teacher")) as out, live_atomic_dir(paths.live_dir("teacher")) as live:
        metrics = sft_train(cfg.train, model, tokenizer, train_rows, val_rows, out / ".trainer", live)
        metrics = {"backend": "embedded", "parameters": count_parameters(model), **metrics}
        stage_logger().info("teacher: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        save_model(model, tokenizer, out)
        cards.write_model_manifest(out, "teacher", cfg, inputs=[paths.model_dir("base"), train_file, val_file],
                                   metrics=metrics)
    write_metrics(paths.metrics_file("teacher"), metrics)


def _reference(cfg: TeacherConfig) -> None:
    record = {"backend": cfg.backend, **{k: getattr(cfg, k) for k in REFERENCE_FIELDS[cfg.backend]}}
    # A local folder's hash goes into the record: retrained in place (models/base, for self-distillation), the
    # reference changes too, and so does every stage after it
    local = [cfg.model] if cfg.backend == "transformers" and is_local(cfg.model) and Path(cfg.model).is_dir() else []
    with atomic_dir(paths.model_dir("teacher")) as out:
        cards.write_model_manifest(out, "teacher", cfg, inputs=local, teacher_backend=record)
    # The live folder is a declared output; an external teacher has no curves: their header-only stand-ins, so that
    # DVC finds neither an empty output nor a plot it cannot load
    with live_atomic_dir(paths.live_dir("teacher")) as live:
        fill_skipped(live, "teacher", f"no training: the teacher is {cfg.backend} {cfg.model}")
    metrics = {"backend": cfg.backend}
    stage_logger().info("teacher: %s %s", cfg.backend, cfg.model)
    write_metrics(paths.metrics_file("teacher"), metrics)


def _flow(cfg: TeacherConfig) -> None:
    if cfg.backend == "embedded":
        _train_embedded(cfg)
    else:
        _reference(cfg)


def main() -> None:
    with expected_errors():
        cfg = load_section("teacher", TeacherConfig)
        check_packing(cfg.train, load_section("model", ModelLoadConfig), "teacher.train")  # as sft's main does
    run_stage("teacher", _flow, cfg)


if __name__ == "__main__":
    main()
