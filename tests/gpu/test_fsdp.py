"""Sharded training through accelerate's launcher, as the training stages run it: FSDP 2
(configs/accelerate/fsdp.yaml: TRL's SFT on sharded weights, the model saved whole by rank 0, greedy decoding and
GRPO rollouts in step over the ranks) and DeepSpeed ZeRO-3 where the image has DeepSpeed
(configs/accelerate/deepspeed_zero3.yaml: the weights whole again after each trainer). One process per GPU, two at
most (one on a machine with one GPU: sharded over a mesh of one). Skipped without CUDA: accelerate runs FSDP on
CUDA devices only (tests/unit/test_sharding.py checks the same paths on CPUs with torch's own FSDP 2; ZeRO-3 runs
on CPUs in tests/stages/test_launched_stages.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.inference.generation import decode, pad, pad_id
from pipeline.modeling.models import count_parameters, load_model
from tests.conftest import venv_env
from tests.gpu.conftest import save_wide_student
from tests.gpu.fsdp_rank import TEXTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["fsdp.yaml", "deepspeed_zero3.yaml"])
def run(request, tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    if request.param.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="not on this image")
    saved = save_wide_student(tmp_path_factory.mktemp("student"), TEXTS, hidden_size=64, intermediate_size=128)
    out = tmp_path_factory.mktemp(request.param.split(".")[0])
    n = min(2, torch.cuda.device_count())
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           f"configs/accelerate/{request.param}", "--num_processes", str(n),
                           "tests/gpu/fsdp_rank.py", str(saved), str(out)], cwd=ROOT, env=venv_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return request.param, saved, out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_sft_trains_sharded_and_rank_zero_measures_it(run):
    config, _, _, ranks = run
    zero = ranks[0]
    assert zero["sft"]["steps"] == 6 and zero["sft"]["world_size"] == len(ranks)
    assert zero["sft"]["weights_changed"] == 1.0  # gathered whole on rank 0
    if config == "fsdp.yaml":  # FSDP stays sharded after its trainer
        assert zero["sharded"] and zero["lockstep"] == (len(ranks) > 1)
        assert all(r["sft"]["weights_changed"] == 0.0 for r in ranks[1:])  # the others measure nothing
    else:  # ZeRO-3 gives every rank the whole weights back (sharding.unshard): each measures them
        assert not zero["sharded"] and zero["sft"]["distributed"] == "DEEPSPEED zero-3"
        assert all(r["sft"]["weights_changed"] == 1.0 for r in ranks)


def test_the_saved_model_is_whole_and_decodes_as_the_sharded_one_did(run):
    config, saved, out, ranks = run
    model, tok = load_model(out / "sft")
    start, _ = load_model(saved)
    assert count_parameters(model) == count_parameters(start)
    others = sorted(p.name for p in out.iterdir() if p.name.startswith("sft-rank"))
    if config == "fsdp.yaml":
        assert others == []  # ranks without the gathered weights write nothing
    else:  # each rank holds the whole weights and saves them here (in a stage, pipeline.core.io writes rank 0's only)
        assert len(others) == len(ranks) - 1
    for rank, report in enumerate(ranks):  # each rank's own prompts and length, on one unsharded process
        ids, mask = pad(report["prompts"], pad_id(tok), left=True)
        again = decode(model, ids.to(model.device), mask.to(model.device), 24 + 8 * rank, tok.eos_token_id)
        assert again == report["decoded"], rank


def test_grpo_steps_run_on_the_sharded_policy(run):
    _, _, _, ranks = run
    grpo = ranks[0]["grpo"]
    assert grpo["steps"] == 3 and grpo["world_size"] == len(ranks) and grpo["weights_changed"] == 1.0
    assert grpo["rollouts"] == 3 * 2 * 4 * len(ranks)
