"""A model of your own, loaded from a local folder (`base.model`): DVC watches the folder, so retraining it in place
re-runs what loaded it, as a local dataset file re-runs the data stage."""

from __future__ import annotations

import sys

import pytest
import yaml

from tests.e2e.test_dataset_task import make_repo
from tests.e2e.test_repro import dvc, ran_stages, sh

pytestmark = pytest.mark.e2e


def save_student(folder, seed: int) -> None:
    from pipeline.modeling.models import build_student, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    tokenizer = train_tokenizer(["Step 1: 3 + 4 = 7.\nAnswer: 7", "What is the largest value?"] * 20, 300)
    cfg = BaseModelConfig(seed=seed, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    save_model(build_student(cfg, tokenizer), tokenizer, folder)


def test_a_local_model_folder_is_declared_to_dvc_for_base_and_teacher(tmp_path, monkeypatch):
    """What DVC reads from dvc.yaml with the params `python -m pipeline params` wrote: the folders among the deps."""
    from dvc.repo import Repo

    mine, theirs = tmp_path / "my-model", tmp_path / "their-model"
    save_student(mine, seed=0)
    save_student(theirs, seed=1)
    repo = make_repo(tmp_path, "repo", [f"base.model={mine}", "teacher.backend=transformers",
                                        f"teacher.model={theirs}"])
    monkeypatch.chdir(repo)  # DVC reads params.yaml for dvc.yaml's ${...} from the working directory
    with Repo(str(repo)) as dvc_repo:
        deps = {name: {str(d.def_path) for d in dvc_repo.stage.collect(name)[0].deps} for name in ("base", "teacher")}
    assert str(mine) in deps["base"] and str(theirs) in deps["teacher"]
    assert str(mine) not in deps["teacher"] and str(theirs) not in deps["base"]


@pytest.mark.slow  # two stages run (the declaration above is checked in `make test`)
def test_a_local_model_folder_is_a_dependency_of_the_stage_that_loads_it(tmp_path, prefect_api):
    mine = tmp_path / "my-model"
    save_student(mine, seed=0)
    repo = make_repo(tmp_path, "repo", [f"base.model={mine}"])
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["base"]["model_dependency"] == str(mine)  # written by `python -m pipeline params`
    assert params["teacher"]["model_dependency"] == "pipeline/modeling/models.py"  # the embedded teacher loads nothing
    proc = sh([sys.executable, "-m", "pipeline", "repro", "base"], repo)
    assert ran_stages(proc.stdout + proc.stderr) == ["base", "synthesize"]
    assert dvc("status", "base", cwd=repo).stdout.strip().endswith("up to date.")
    save_student(mine, seed=1)  # the model retrained in place
    status = dvc("status", "base", cwd=repo).stdout
    assert "changed deps" in status and f"modified:           {mine}" in status, status
