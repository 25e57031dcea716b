"""python -m stages.base

The untrained student: a BPE tokenizer trained on the synthetic training
corpus and a small Qwen2 built from `base` params, or any Hugging Face model
when `base.model` names one. Writes models/base/ and metrics/base.json.
"""

from __future__ import annotations

from pipeline import paths
from pipeline.config import BaseModelConfig, load_section
from pipeline.flows import expected_errors, run_stage, stage_logger
from pipeline.io import atomic_dir, read_rows, write_json, write_manifest
from pipeline.models import build_student, count_parameters, load_model, save_model, train_tokenizer


def run(cfg: BaseModelConfig, train_rows: list[dict]):
    """(model, tokenizer): loaded from `cfg.model`, or built from scratch on the corpus."""
    if cfg.model:
        return load_model(cfg.model)
    corpus = (row["prompt"] + row["rationale"] for row in train_rows)
    tokenizer = train_tokenizer(corpus, cfg.vocab_size)
    return build_student(cfg, tokenizer), tokenizer


def _flow(cfg: BaseModelConfig) -> None:
    train_file = paths.split_file("train")
    rows = read_rows(train_file, required=("prompt", "rationale"))
    model, tokenizer = run(cfg, rows)
    sample = [r["prompt"] + r["rationale"] for r in rows[:500]]
    tokens = [len(ids) for ids in tokenizer(sample, add_special_tokens=False)["input_ids"]]
    metrics = {
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "tokens_per_example": round(sum(tokens) / len(tokens), 1),
        "max_tokens_per_example": max(tokens),
        "chars_per_token": round(sum(map(len, sample)) / sum(tokens), 2),
    }
    stage_logger().info("base model: %s", metrics)
    with atomic_dir(paths.model_dir("base")) as tmp:
        save_model(model, tokenizer, tmp)
        write_manifest(tmp, "base", cfg, inputs=[train_file], name=paths.MODEL_MANIFEST, metrics=metrics)
    write_json(paths.metrics_file("base"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("base", BaseModelConfig)
    run_stage("base", _flow, cfg)


if __name__ == "__main__":
    main()
