"""Resolve a model folder to a sampling backend.

`models/teacher/` holds either a model trained here (embedded backend) or, for
the `transformers` and `openai` backends, only `pipeline_config.json`: a
reference to the model path or endpoint, so a 70B teacher or a hosted API is
never copied into the DVC cache. Every consumer (distill, evaluate, logit
distillation) goes through `load_sampler` / `load_local`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core import paths
from pipeline.core.io import InputError, read_json
from pipeline.inference.generation import Sampler


def backend_of(model_dir: Path) -> dict:
    """The backend record in a model folder's manifest ({"backend": "embedded"} for a saved model)."""
    manifest_file = Path(model_dir) / paths.MODEL_MANIFEST
    manifest = read_json(manifest_file) if manifest_file.exists() else {}
    return manifest.get("teacher_backend") or {"backend": "embedded"}


def load_local(model_dir: Path):
    """(model, tokenizer) of a local backend; an API teacher has no weights here."""
    from pipeline.modeling.models import load_model

    record = backend_of(model_dir)
    if record["backend"] == "openai":
        raise InputError(f"{model_dir}: an OpenAI-compatible endpoint has no local weights (needs a local teacher)")
    return load_model(record.get("model") or model_dir)


def load_sampler(model_dir: Path, batch_size: int = 64) -> Sampler:
    """The sampler for a model folder: in-process for saved or referenced weights, HTTP for an endpoint."""
    record = backend_of(model_dir)
    if record["backend"] == "openai":
        from pipeline.inference.openai_backend import OpenAISampler

        return OpenAISampler(
            base_url=record["base_url"], model=record["model"], api=record["api"],
            api_key_env=record["api_key_env"], concurrency=record["concurrency"], timeout_s=record["timeout_s"],
            max_retries=record["max_retries"], cache_path=Path(record["cache_dir"]) / "responses.sqlite",
        )
    from pipeline.inference.engines import local_sampler  # `generation.engine`: the decode loop or vLLM

    return local_sampler(record.get("model") or model_dir, batch_size, str(record.get("model") or model_dir))
