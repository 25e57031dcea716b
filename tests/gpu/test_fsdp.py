"""FSDP 2 through accelerate's launcher (configs/accelerate/fsdp.yaml), as the training stages run it: TRL's SFT
on sharded weights, the model saved whole by rank 0, greedy decoding and GRPO rollouts in step over the ranks.
One process per GPU, two at most (one on a machine with one GPU: sharded over a mesh of one). Skipped without
CUDA: accelerate runs FSDP on CUDA devices only (tests/unit/test_sharding.py checks the same paths on CPUs with
torch's own FSDP 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.generation import decode, pad, pad_id
from pipeline.models import count_parameters, load_model
from tests.conftest import venv_env
from tests.gpu.conftest import save_wide_student
from tests.gpu.fsdp_rank import TEXTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    saved = save_wide_student(tmp_path_factory.mktemp("student"), TEXTS, hidden_size=64, intermediate_size=128)
    out = tmp_path_factory.mktemp("fsdp")
    n = min(2, torch.cuda.device_count())
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           "configs/accelerate/fsdp.yaml", "--num_processes", str(n),
                           "tests/gpu/fsdp_rank.py", str(saved), str(out)], cwd=ROOT, env=venv_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return saved, out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_sft_trains_sharded_and_rank_zero_measures_it(run):
    _, _, ranks = run
    zero = ranks[0]
    assert zero["sharded"] and zero["lockstep"] == (len(ranks) > 1)
    assert zero["sft"]["steps"] == 6 and zero["sft"]["world_size"] == len(ranks)
    assert zero["sft"]["weights_changed"] == 1.0  # gathered whole on rank 0
    assert all(r["sft"]["weights_changed"] == 0.0 for r in ranks[1:])  # the others measure nothing


def test_the_saved_model_is_whole_and_decodes_as_the_sharded_one_did(run):
    saved, out, ranks = run
    model, tok = load_model(out / "sft")
    start, _ = load_model(saved)
    assert count_parameters(model) == count_parameters(start)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("sft")) == ["sft"]  # the others wrote nothing
    for rank, report in enumerate(ranks):  # each rank's own prompts and length, on one unsharded process
        ids, mask = pad(report["prompts"], pad_id(tok), left=True)
        again = decode(model, ids.to(model.device), mask.to(model.device), 24 + 8 * rank, tok.eos_token_id)
        assert again == report["decoded"], rank


def test_grpo_steps_run_on_the_sharded_policy(run):
    _, _, ranks = run
    grpo = ranks[0]["grpo"]
    assert grpo["steps"] == 3 and grpo["world_size"] == len(ranks) and grpo["weights_changed"] == 1.0
    assert grpo["rollouts"] == 3 * 2 * 4 * len(ranks)
