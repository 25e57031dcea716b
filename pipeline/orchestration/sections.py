"""Every params section by name, gathered from the rooms that hold their schemas, and what the orchestrator and
the CLI read of them.

The library never reads params.yaml: a stage's main loads its own sections (`load_section`) and passes them on,
and `run_stage` hands the run-wide ones (`RUN_WIDE`: the task, the prompt format, model loading, the generation
engine, checkpoints, trackers) to the rooms that read them (`pipeline.core.params.give`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core import params
from pipeline.core.params import Section, load_section
from pipeline.data.params import AnimateConfig, DistillConfig, MineConfig, SynthesizeConfig, TaskConfig
from pipeline.evaluation.params import EvaluateConfig
from pipeline.inference.params import GenerationConfig
from pipeline.modeling.params import BaseModelConfig, LoraConfig, ModelLoadConfig, PromptConfig
from pipeline.orchestration.params import LaunchConfig
from pipeline.prm.params import PRMConfig, PRMDataConfig
from pipeline.rl.params import DPOStageConfig, GRPOStageConfig, RewardsConfig
from pipeline.training.params import ReproConfig, SFTConfig, SFTExtendedConfig, TeacherConfig, TrackingConfig

SECTIONS: dict[str, type[Section]] = {
    "task": TaskConfig,
    "prompt": PromptConfig,
    "model": ModelLoadConfig,
    "generation": GenerationConfig,
    "synthesize": SynthesizeConfig,
    "base": BaseModelConfig,
    "teacher": TeacherConfig,
    "distill": DistillConfig,
    "sft": SFTConfig,
    "rewards": RewardsConfig,
    "mine": MineConfig,
    "grpo": GRPOStageConfig,
    "dpo": DPOStageConfig,
    "sft_extended": SFTExtendedConfig,
    "prm_data": PRMDataConfig,
    "prm": PRMConfig,
    "evaluate": EvaluateConfig,
    "animate": AnimateConfig,
    "lora": LoraConfig,
    "launch": LaunchConfig,
    "repro": ReproConfig,
    "tracking": TrackingConfig,
}

# Sections that code all over a run reads (a completion graded by the task, a model loaded, a trainer checkpointed)
RUN_WIDE = ("task", "prompt", "model", "generation", "repro", "tracking")


def read_section(name: str, path: Path | None = None) -> Section:
    """`core.params.read_section` by the section's name alone."""
    return params.read_section(name, SECTIONS[name], path)


def load_named(name: str, path: Path | None = None) -> Section:
    """`load_section` by the section's name alone (tests, benches, experiments): every key spelled out."""
    return load_section(name, SECTIONS[name], path)


def run_settings(path: Path | None = None) -> list[Section]:
    """The run-wide sections of params.yaml, for `give`."""
    return [read_section(name, path) for name in RUN_WIDE]
