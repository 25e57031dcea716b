"""Smoke runs of each stage on tiny sizes, in order, as real Prefect flows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline import paths
from pipeline.io import EXAMPLE_COLUMNS, read_rows
from tests.conftest import TINY_PARAMS, write_params


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, prefect_api):
    """A folder with tiny params.yaml; the stages run with it as the working directory."""
    folder = tmp_path_factory.mktemp("workspace")
    write_params(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    yield folder
    os.chdir(cwd)


def test_synthesize(workspace):
    from stages import synthesize

    synthesize.main()
    counts = {s: len(read_rows(paths.split_file(s), required=EXAMPLE_COLUMNS)) for s in paths.SPLITS}
    p = TINY_PARAMS["synthesize"]
    assert counts == {"train": p["n_train"], "val": p["n_val"], "test": p["n_test"], "ood": p["n_ood"]}
    charts = sorted(paths.charts_dir().glob("*.png"))
    assert len(charts) == 2 * len(paths.SPLITS)
    assert all(c.read_bytes().startswith(b"\x89PNG") for c in charts)
    test_rows = read_rows(paths.split_file("test"))
    assert test_rows[0]["image_path"] and Path(test_rows[0]["image_path"]).exists()
    manifest = json.loads((paths.stage_data("synthesize") / "config.json").read_text())
    assert manifest["params"]["n_train"] == p["n_train"] and manifest["seed"] == 0
    metrics = json.loads(paths.metrics_file("synthesize").read_text())
    assert metrics["questions"] == sum(counts.values())


def test_synthesize_is_byte_identical_on_rerun(workspace):
    from stages import synthesize

    before = {f.name: f.read_bytes() for f in paths.stage_data("synthesize").rglob("*") if f.is_file()}
    synthesize.main()
    after = {f.name: f.read_bytes() for f in paths.stage_data("synthesize").rglob("*") if f.is_file()}
    assert before.keys() == after.keys()
    assert [name for name in before if before[name] != after[name]] == []


def test_base(workspace):
    from stages import base

    base.main()
    folder = paths.model_dir("base")
    for name in ("model.safetensors", "config.json", "tokenizer.json", paths.MODEL_MANIFEST):
        assert (folder / name).exists(), name
    metrics = json.loads(paths.metrics_file("base").read_text())
    assert 1_000 < metrics["parameters"] < 200_000
    assert metrics["vocab_size"] <= TINY_PARAMS["base"]["vocab_size"]


def test_sft_changes_the_weights(workspace):
    from stages import sft

    sft.main()
    before = load_file(paths.model_dir("base") / "model.safetensors")
    after = load_file(paths.model_dir("sft") / "model.safetensors")
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)
    metrics = json.loads(paths.metrics_file("sft").read_text())
    assert metrics["steps"] == TINY_PARAMS["sft"]["max_steps"]
    assert metrics["weights_changed"] == 1.0
    assert (paths.live_dir("sft") / "plots" / "metrics" / "loss.tsv").exists()
    assert (paths.live_dir("sft") / "plots" / "metrics" / "eval" / "loss.tsv").exists()


def test_evaluate(workspace):
    from stages import evaluate

    evaluate.main(["--model", "sft"])
    metrics = json.loads(paths.eval_metrics_file("sft").read_text())
    for key in ("accuracy", "accuracy_ood", "step_accuracy", "by_answer_type", "by_task_type", "by_chain_length",
                "tokens_per_question", "seconds_per_question", "baseline_majority"):
        assert key in metrics, key
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["tokens_per_question"] > 0
    records = read_rows(paths.eval_predictions_dir("sft") / "predictions.parquet")
    p = TINY_PARAMS["synthesize"]
    assert len(records) == p["n_test"] + p["n_ood"]
    assert metrics["accuracy"] == pytest.approx(
        sum(r["correct"] for r in records if r["split"] == "test") / p["n_test"], abs=1e-4
    )
    assert (paths.eval_plots_dir("sft") / "by_task_type.png").exists()


def test_corrupted_input_fails_naming_the_file(workspace, capsys):
    from stages import base

    train = paths.split_file("train")
    good = train.read_bytes()
    model_before = (paths.model_dir("base") / "model.safetensors").read_bytes()
    train.write_bytes(good[: len(good) // 2])  # a truncated download
    try:
        with pytest.raises(SystemExit) as exc:
            base.main()
    finally:
        train.write_bytes(good)
    assert exc.value.code == 2
    assert "data/synthesize/train.parquet" in capsys.readouterr().err
    # the previous output is untouched and no temporary folder is left
    assert (paths.model_dir("base") / "model.safetensors").read_bytes() == model_before
    assert [p.name for p in paths.MODELS.iterdir() if p.name.startswith(".")] == []
