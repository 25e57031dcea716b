"""Every stage of the DAG, once: its params section, what it makes, and which of the pipeline's lists it is in.

The lists the code needs (the stages `launch` may spread over processes, the models the evaluate matrix grades,
the students the report compares, the stages a LoRA adapter can train) derive from these rows. dvc.yaml's stages
and its evaluate matrix, `params.yaml`'s sections, the `lora` switches and the model cards' lines are checked
against them (tests/unit/test_registry.py). docs/adding-a-stage.md says what else a new stage needs.

Names and flags only: which stages exist and which lists they join decides how stages run and are checked, not
what one computes (a new stage comes with its dvc.yaml entry, which re-runs what it feeds), so DVC counts this
file as plumbing; the report, whose rows are the students, lists it among its deps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str  # its dvc.yaml stage, `python -m stages.<name>`, and (when it makes one) models/<name>
    section: str | None  # its own params section (None: it has none)
    trains: bool = False  # runs a TRL trainer: `launch` can spread it over processes; `tracking` sees it
    evaluated: bool = False  # makes a model that the evaluate matrix grades
    student: bool = False  # a post-trained student: the report and `compare` rank it against the teacher
    lora: bool = False  # can train a LoRA adapter instead of every weight (`lora.<name>`)


# In the order the evaluate matrix, the report's rows and the params list them (dvc.yaml runs grpo before
# sft_extended, which matches GRPO's compute).
STAGES = (
    Stage("synthesize", "synthesize"),
    Stage("animate", "animate"),
    Stage("base", "base", evaluated=True),
    Stage("teacher", "teacher", trains=True, evaluated=True),
    Stage("distill", "distill"),
    Stage("sft", "sft", trains=True, evaluated=True, student=True, lora=True),
    Stage("mine", "mine"),
    Stage("sft_extended", "sft_extended", trains=True, evaluated=True, student=True),
    Stage("grpo", "grpo", trains=True, evaluated=True, student=True, lora=True),
    Stage("dpo", "dpo", trains=True, evaluated=True, student=True, lora=True),
    Stage("prm_data", "prm_data"),
    Stage("prm", "prm", trains=True),
    Stage("evaluate", "evaluate"),
    Stage("report", None),
)
BY_NAME = {stage.name: stage for stage in STAGES}

TRAINING_STAGES = tuple(s.name for s in STAGES if s.trains)
EVALUATED = tuple(s.name for s in STAGES if s.evaluated)
STUDENTS = tuple(s.name for s in STAGES if s.student)
LORA_STAGES = tuple(s.name for s in STAGES if s.lora)
