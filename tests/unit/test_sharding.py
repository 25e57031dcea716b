"""Sharded parameters on 2 CPU processes (gloo): FSDP 2 through torch's `fully_shard` (accelerate runs its FSDP
plugin on GPUs only, so the pipeline's sharded paths are checked on torch's own sharding, the same DTensor
parameters and collectives), and DeepSpeed ZeRO-3 through its own engine on its CPU accelerator.

tests/unit/sharded_ranks.py is each rank's script; without `sharding.lockstep` its decode fails (rank 0's rows end
at their first token, rank 1's run 12 steps: rank 0 would leave the collectives of rank 1's forward passes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import venv_env

SCRIPT = Path(__file__).with_name("sharded_ranks.py")


def run_ranks(kind: str, out: Path) -> list[dict]:
    # --standalone: a free port of its own (a static rendezvous on port 0 never meets)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(SCRIPT), str(out), kind], env=venv_env(OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=240, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def fsdp_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks("fsdp", tmp_path_factory.mktemp("fsdp"))


@pytest.fixture(scope="module")
def zero3_ranks(tmp_path_factory) -> list[dict]:
    pytest.importorskip("deepspeed", reason="the dev extra installs it")
    return run_ranks("zero3", tmp_path_factory.mktemp("zero3"))


@pytest.fixture(params=["fsdp", "zero3"])
def ranks(request) -> list[dict]:
    return request.getfixturevalue(f"{request.param}_ranks")


def test_decoding_keeps_pace_over_the_ranks_and_matches_one_process(ranks):
    zero, one = ranks
    assert zero["lockstep"] and one["lockstep"] and not zero["lockstep_whole"]
    assert [len(row) for row in zero["reference"]] == [1, 1]  # rank 0's rows end at once ...
    assert [len(row) for row in one["reference"]] == [12, 12]  # ... rank 1's run every step
    assert zero["sharded"] == zero["reference"] and one["sharded"] == one["reference"]


def test_weights_are_gathered_whole_on_rank_zero_only(ranks):
    zero, one = ranks
    assert len(zero["gathered_keys"]) == 27 and "lm_head.weight" in zero["gathered_keys"]  # 2 layers, tied head
    assert zero["gathered_equal"] and one["gathered_keys"] == []
    assert zero["changed_untrained"] == 0.0 and zero["changed_trained"] == 1.0  # every tensor moved in one step
    assert one["changed_trained"] == 0.0  # only rank 0 measures: it writes the metrics
    # a second phase's snapshot of the sharded model: whole on rank 0, where nothing has changed since
    assert zero["snapshot_keys"] == 27 and one["snapshot_keys"] == 0 and zero["changed_since_snapshot"] == 0.0


def test_a_checkpoint_key_reads_the_whole_weights_on_every_rank(ranks):
    zero, one = ranks
    assert zero["key_sharded"] == zero["key_whole"] == one["key_sharded"] == one["key_whole"]


def test_rank_zero_saves_the_whole_trained_model_and_the_others_nothing(ranks):
    zero, one = ranks
    assert "model.safetensors" in zero["saved_files"] and zero["saved_equal"]
    assert zero["saved_architecture"] == ["Qwen2ForCausalLM"]  # not FSDP's wrapper class
    assert one["saved_files"] == []


def test_after_zero3_every_rank_holds_the_whole_trained_weights_as_plain_parameters(zero3_ranks):
    zero, one = zero3_ranks
    assert zero["unsharded"] and one["unsharded"]  # no DeepSpeed parameter left: the drills' own loops step them
    assert zero["still_tied"] and one["still_tied"]  # the head is still the embedding, one parameter
    assert zero["unsharded_equal"] and zero["unsharded_trainable"] and one["unsharded_trainable"]
    assert zero["unsharded_key"] == one["unsharded_key"]  # the same weights on both ranks
    assert zero["unsharded_key"] != zero["key_whole"]  # the trained ones
    # a plain model decodes on each rank alone now: its own rows' lengths, no stand-in steps
    assert len(zero["unsharded_decode"]) == 2 and len(one["unsharded_decode"]) == 2
