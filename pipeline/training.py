"""Shared pieces of the TRL training stages: datasets, dvclive logging, weight checks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from datasets import Dataset


def prompt_completion_dataset(rows: Sequence[dict], completion_key: str = "rationale") -> Dataset:
    """TRL's prompt-completion format: the loss falls on the completion only."""
    return Dataset.from_dict(
        {"prompt": [r["prompt"] for r in rows], "completion": [r[completion_key] for r in rows]}
    )


def dvclive_callback(live_dir: Path):
    """transformers' DVCLiveCallback writing curves into `live_dir` (no dvc.yaml edits, no DVC experiment)."""
    from dvclive import Live
    from transformers.integrations import DVCLiveCallback

    return DVCLiveCallback(live=Live(dir=str(live_dir), dvcyaml=None, save_dvc_exp=False))


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def weights_changed(before: dict[str, torch.Tensor], model) -> float:
    """Share of parameter tensors that differ from `before` (0.0: training did nothing)."""
    after = model.state_dict()
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    return changed / max(len(before), 1)


def device_kwargs() -> dict:
    """Trainer precision/device settings for this machine.

    TRL defaults to bf16 and gradient checkpointing; on a CPU both make a tiny
    model about 10x slower (bf16 autocast has no fast CPU kernels here, and
    re-computing activations buys nothing when they are a few MB).
    """
    cuda = torch.cuda.is_available()
    return {
        "use_cpu": not cuda,
        "bf16": cuda and torch.cuda.is_bf16_supported(),
        "gradient_checkpointing": False,
    }
