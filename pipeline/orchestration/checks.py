"""Checks across params sections, before any work: `validate_all` runs them all before DVC starts, and a stage's
main repeats those of its own sections (a plain `dvc repro` skips the former). Each section's own rules are in its
schema.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.io import ConfigError
from pipeline.core.params import LOCAL_RULE, PARAMS_FILE
from pipeline.data.params import TaskConfig, is_local_dataset
from pipeline.inference.params import GenerationConfig
from pipeline.modeling.params import LoraConfig, ModelLoadConfig
from pipeline.prm.params import PRMConfig
from pipeline.rl.params import GRPOStageConfig, RewardsConfig
from pipeline.training.params import TrainConfig


def check_vllm_loads_whole_models(generation: GenerationConfig, grpo: GRPOStageConfig, lora: LoraConfig,
                                  path: Path | str = PARAMS_FILE) -> None:
    """vLLM loads a model folder whole, never a LoRA adapter beside its base: `lora.save: adapter` with vLLM asked
    for fails here, before any work, not in the first stage that loads an adapter folder with it."""
    adapters = [stage for stage in ("sft", "grpo", "dpo") if getattr(lora, stage)] if lora.save == "adapter" else []
    problems = []
    if generation.engine == "vllm" and adapters:
        problems.append(f"generation.engine: vllm loads whole models, and lora.save: adapter leaves models/"
                        f"{adapters[0]} an adapter folder: set lora.save: merged or generation.engine: hf")
    if grpo.use_vllm and "sft" in adapters and (grpo.vllm_mode == "colocate" or not grpo.vllm_server_base_url):
        problems.append("grpo.use_vllm: vLLM loads models/sft whole, and lora.save: adapter leaves it an adapter "
                        "folder: set lora.save: merged, or give grpo.vllm_server_base_url of a server that serves "
                        "a merged copy (vllm_mode: server)")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))


def check_attention(model: ModelLoadConfig, path: Path | str = PARAMS_FILE) -> None:
    """flash_attention_2 needs the flash-attn package and a CUDA device: said at validation, not by the first
    stage that loads a model."""
    if model.attn_implementation != "flash_attention_2":
        return
    import importlib.util

    import torch

    missing = [what for what, ok in (("the flash-attn package (pip install flash-attn)",
                                      importlib.util.find_spec("flash_attn") is not None),
                                     ("a CUDA device", torch.cuda.is_available())) if not ok]
    if missing:
        raise ConfigError(f"{path}: model.attn_implementation: flash_attention_2 needs {' and '.join(missing)}, "
                          "not found here; sdpa or eager run anywhere")


def check_packing(train: TrainConfig, model: ModelLoadConfig, key: str, path: Path | str = PARAMS_FILE) -> None:
    """Packing needs flash_attention_2: checked by `python -m pipeline repro` and again by the sft and teacher
    stage mains (a plain `dvc repro` skips the former)."""
    if train.packing and model.attn_implementation != "flash_attention_2":
        raise ConfigError(f"{path}: {key}.packing: padding-free packing turns a batch into one sequence, which "
                          "attention other than flash_attention_2 reads whole (quadratic in the batch: 136 GB and "
                          "7x slower on an H200, BENCHMARKS.md); set model.attn_implementation: flash_attention_2 "
                          "or packing: false")


def check_task_fit(task: TaskConfig, prm: PRMConfig | None = None, path: Path | str = PARAMS_FILE,
                   rewards: RewardsConfig | None = None) -> None:
    """Params of other sections that the task cannot serve, each named (the stage that reads them checks too)."""
    problems = []
    path_given = task.dataset.path if task.dataset is not None else None
    if path_given and is_local_dataset(path_given) and not Path(path_given).expanduser().exists():
        # DVC watches it (task.data_dependency): missing, `dvc repro` would fail on it, after deleting the outputs
        problems.append(f"task.dataset.path: {path_given}: no such file or folder ({LOCAL_RULE}, and a file ending "
                        "in .parquet, .jsonl, .json or .csv is local too)")
    if task.kind != "cof" and prm is not None and "gold" in prm.sources:
        problems.append("prm.sources: gold labels need the chart task's gold step values; a dataset task's steps "
                        "are labelled mc (Monte-Carlo rollouts) and mcts: set prm.sources: [mc, mcts]")
    if task.kind == "cof" and prm is not None and "mc" in prm.sources:
        # prm_data labels the chart task's steps by their gold values, so it writes no mc rows to train on
        problems.append("prm.sources: mc labels are a dataset task's (no gold step values there); the chart task's "
                        "steps are labelled gold and mcts: set prm.sources: [gold, mcts]")
    if task.kind != "cof" and rewards is not None and "step_correctness" in rewards.weights:
        # it would score no completion at all (None on every row), and TRL logs a warning for it every step
        kept = {k: v for k, v in rewards.weights.items() if k != "step_correctness"} or {"accuracy": 1.0}
        problems.append("rewards.weights: step_correctness matches the chart task's gold step values, which a "
                        "dataset task has none of: set rewards.weights: {"
                        + ", ".join(f"{k}: {v}" for k, v in kept.items()) + "}")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))
