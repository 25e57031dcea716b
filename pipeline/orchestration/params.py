"""The orchestration room's params: `launch`, how a training stage's processes start (accelerate).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.params import Section
from pipeline.core.registry import TRAINING_STAGES

TrainingStage = Literal[TRAINING_STAGES]  # type: ignore[valid-type]


class LaunchOverride(Section):
    """`launch.stages.<stage>`: that training stage's own process count or accelerate config."""

    num_processes: int | None = Field(None, ge=1, description="processes for this stage (null: launch.num_processes)")
    config_file: str | None = Field(None, min_length=1, description="accelerate config for this stage (null: "
                                    "launch.config_file)")


class LaunchConfig(Section):
    """`launch`: how the training stages (teacher, sft, sft_extended, grpo, dpo, prm) run: one process, or several
    through `accelerate launch` (pipeline/orchestration/launch.py). No stage declares this section among its DVC params,
    so changing it re-runs nothing (`dvc repro -f -s <stage>` does); each process gets per_device_train_batch_size
    rows a step, so N processes train on N times the batch."""

    num_processes: int = Field(1, ge=1, description="processes in all, over every machine (one per GPU; on a CPU, "
                               "at most one per core, with gloo): more than 1 starts the ranks through accelerate")
    config_file: str | None = Field(
        None, min_length=1, description="an accelerate config file (configs/accelerate/: ddp.yaml, fsdp.yaml "
        "(FSDP 2, CUDA only), deepspeed_zero2.yaml, deepspeed_zero3.yaml (GPUs, or CPUs over gloo)); null: DDP (gloo "
        "on CPU)")
    num_machines: int = Field(1, ge=1, description="machines taking part (multi-node: run the stage on each)")
    machine_rank: int = Field(0, ge=0, description="this machine's rank (0: the one that runs DVC and writes the "
                              "outputs)")
    main_process_ip: str | None = Field(None, min_length=1, description="multi-node: the address of machine 0")
    main_process_port: int | None = Field(None, ge=1, le=65535, description="multi-node: a free port on machine 0")
    stages: dict[TrainingStage, LaunchOverride] = Field(
        default_factory=dict, description="per-stage overrides, e.g. {grpo: {num_processes: 4}}")

    @model_validator(mode="after")
    def _machines(self) -> "LaunchConfig":
        if self.machine_rank >= self.num_machines:
            raise ValueError(f"machine_rank: {self.machine_rank} must be below num_machines ({self.num_machines})")
        if self.num_machines > 1 and (self.main_process_ip is None or self.main_process_port is None):
            raise ValueError("main_process_ip and main_process_port: needed when num_machines > 1")
        return self
