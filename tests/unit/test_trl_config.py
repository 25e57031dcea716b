"""TRL configs from the params schema: the fields that share TRL's names, then `<section>.trl_args` for the rest."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pipeline.core.io import ConfigError
from pipeline.core.params import parse_section
from pipeline.orchestration.sections import load_named
from pipeline.prm.params import PRMConfig
from pipeline.rl.grpo import grpo_args
from pipeline.rl.params import DPOStageConfig, GRPOStageConfig
from pipeline.training.params import TrainConfig
from pipeline.training.trainer import dpo_args, prm_args, trainer_args
from tests.conftest import ROOT, TINY_PARAMS, write_params


def test_schema_fields_named_as_trl_names_them_reach_its_config(tmp_path):
    sft = trainer_args(TrainConfig(learning_rate=0.0123, weight_decay=0.2, eval_steps=7), tmp_path)
    assert (sft.learning_rate, sft.weight_decay, sft.eval_steps) == (0.0123, 0.2, 7)
    grpo = grpo_args(GRPOStageConfig(temperature=0.7, top_p=0.9, epsilon=0.3, max_steps=3), [1.0], tmp_path)
    assert (grpo.temperature, grpo.top_p, grpo.epsilon, grpo.max_steps) == (0.7, 0.9, 0.3, 3)
    dpo = dpo_args(DPOStageConfig(beta=0.25, nll_weight=0.5), tmp_path)
    assert dpo.beta == 0.25 and dpo.loss_type == ["sigmoid", "sft"] and dpo.loss_weights == [1.0, 0.5]
    assert prm_args(PRMConfig(weight_decay=0.05), tmp_path).weight_decay == 0.05


def test_trl_args_pass_any_other_option_of_the_stages_trl_config(tmp_path):
    sft = trainer_args(TrainConfig(trl_args={"neftune_noise_alpha": 5.0}), tmp_path)
    assert sft.neftune_noise_alpha == 5.0
    grpo = grpo_args(GRPOStageConfig(trl_args={"mask_truncated_completions": True, "top_k": 50}), [1.0], tmp_path)
    assert grpo.mask_truncated_completions is True and grpo.top_k == 50
    assert dpo_args(DPOStageConfig(trl_args={"label_smoothing": 0.1}), tmp_path).label_smoothing == 0.1
    assert prm_args(PRMConfig(trl_args={"max_grad_norm": 0.5}), tmp_path).max_grad_norm == 0.5
    # without any, the stage's own settings stand
    assert trainer_args(TrainConfig(), tmp_path).neftune_noise_alpha is None


@pytest.mark.parametrize("section, trl_args, message", [
    ("sft", {"neftune_noise": 5}, r"sft.trl_args: .*neftune_noise: not an option of trl.SFTConfig"),
    ("grpo", {"top_kk": 5}, r"grpo.trl_args: .*top_kk: not an option of trl.GRPOConfig"),
    ("prm", {"beta": 0.1}, r"prm.trl_args: .*beta: not an option of transformers.TrainingArguments"),
    ("dpo", {"beta": 0.2}, r"dpo.trl_args: .*beta: a key of this section itself; set it there"),
])
def test_an_unknown_or_owned_trl_arg_is_bad_params_naming_it(section, trl_args, message):
    raw = {**TINY_PARAMS[section], "trl_args": trl_args}
    with pytest.raises(ConfigError, match=message):
        parse_section(section, load_named(section).__class__, raw)


def test_an_option_the_stage_sets_itself_is_refused_when_the_run_is_built(tmp_path):
    with pytest.raises(ConfigError, match=r"trl_args.output_dir: the stage sets it itself"):
        trainer_args(TrainConfig(trl_args={"output_dir": "elsewhere"}), tmp_path)
    with pytest.raises(ConfigError, match=r"trl_args.report_to: the stage sets it itself"):
        dpo_args(DPOStageConfig(trl_args={"report_to": ["wandb"]}), tmp_path, report_to="none")


def test_a_stage_with_an_unknown_trl_arg_exits_2_before_any_work(tmp_path):
    write_params(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["teacher"]["train"]["trl_args"] = {"no_such_option": 1}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPELINE_SHARED_SERVER": "0"}
    proc = subprocess.run([sys.executable, "-m", "stages.teacher"], cwd=tmp_path, capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "teacher.train.trl_args" in proc.stderr and "no_such_option: not an option of trl.SFTConfig" in proc.stderr
    assert not (tmp_path / "models").exists()
