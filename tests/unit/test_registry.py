"""The stage registry agrees with everything else that names stages: dvc.yaml, the params sections, the stage
modules, the `lora` switches, and the Literal types that params are checked against."""

from __future__ import annotations

import typing
from pathlib import Path

import yaml

from pipeline.core.registry import BY_NAME, EVALUATED, LORA_STAGES, STAGES, STUDENTS, TRAINING_STAGES
from pipeline.modeling.cards import WHAT
from pipeline.modeling.params import LoraConfig
from pipeline.orchestration.params import TrainingStage
from pipeline.orchestration.sections import SECTIONS
from pipeline.prm.params import PRMDataConfig

ROOT = Path(__file__).resolve().parents[2]
DAG = yaml.safe_load((ROOT / "dvc.yaml").read_text())


def test_the_registry_lists_dvc_yamls_stages_each_with_its_module():
    assert sorted(DAG["stages"]) == sorted(BY_NAME), "dvc.yaml's stages and pipeline/core/registry.py's differ"
    for name, stage in DAG["stages"].items():
        assert stage["cmd"].startswith(f"python -m stages.{name}"), f"dvc.yaml: {name} runs {stage['cmd']}"
        assert (ROOT / "stages" / f"{name}.py").exists()


def test_the_evaluate_matrix_is_the_evaluated_stages_in_order():
    assert DAG["stages"]["evaluate"]["matrix"]["model"] == list(EVALUATED)
    assert typing.get_args(PRMDataConfig.model_fields["policy"].annotation) == EVALUATED


def test_each_stage_section_is_a_params_section():
    for stage in STAGES:
        assert stage.section is None or stage.section in SECTIONS, f"{stage.name}: no params section {stage.section}"


def test_the_lora_switches_are_the_lora_stages():
    switches = tuple(name for name, field in LoraConfig.model_fields.items() if field.annotation is bool)
    assert switches == LORA_STAGES
    assert set(LORA_STAGES) <= set(TRAINING_STAGES)


def test_derived_lists_hold_what_the_code_used_to_spell_out():
    assert typing.get_args(TrainingStage) == TRAINING_STAGES == ("teacher", "sft", "sft_extended", "grpo", "dpo", "prm")
    assert STUDENTS == ("sft", "sft_extended", "grpo", "dpo")
    assert set(STUDENTS) <= set(EVALUATED)
    # every model a stage trains or grades carries a card line
    assert {s.name for s in STAGES if s.trains or s.evaluated} == set(WHAT)
