"""vLLM on a CUDA machine: the sampler against the decode loop, and GRPO with TRL's colocated vLLM engine.

Skipped without a CUDA device or without vLLM (`pip install -e .[gpu]`); bench/gpu.sh runs them where both are.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from pipeline.modeling.models import load_model
from pipeline.rl.params import GRPOStageConfig, RewardsConfig
from tests.gpu.conftest import save_wide_student

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install -e .[gpu])")]

TEXTS = [f"Question: what is {a}+{b}?\nStep 1: {a} + {b} = {a + b}.\nAnswer: {a + b}"
         for a in range(10) for b in range(10)]
PROMPTS = [f"Question: what is {a}+{b}?\n" for a, b in ((3, 4), (1, 8), (9, 9), (0, 5))]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A small student with wide random weights; 64-wide heads, which every vLLM attention backend takes."""
    return save_wide_student(tmp_path_factory.mktemp("student"), TEXTS, hidden_size=128, intermediate_size=256)


@pytest.fixture(scope="module")
def vllm_sampler(saved):
    from pipeline.inference.engines import VLLMSampler

    return VLLMSampler(saved, "student")


def test_the_vllm_sampler_gives_the_decode_loops_greedy_text(saved, vllm_sampler):
    from pipeline.inference.generation import LocalSampler

    model, tok = load_model(saved)
    hf = LocalSampler(model, tok).sample(PROMPTS, n=1, temperature=0.0, max_new_tokens=24)
    ours = vllm_sampler.sample(PROMPTS, n=1, temperature=0.0, max_new_tokens=24)
    assert [g[0].text for g in ours] == [g[0].text for g in hf]
    assert [g[0].tokens for g in ours] == [g[0].tokens for g in hf]
    assert len({g[0].text for g in hf}) > 1  # the prompts lead to different texts: the check can fail


def test_vllm_sampling_is_seeded_and_returns_n_per_prompt(vllm_sampler):
    a = vllm_sampler.sample(PROMPTS, n=3, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=1)
    b = vllm_sampler.sample(PROMPTS, n=3, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=1)
    assert [len(g) for g in a] == [3] * len(PROMPTS)
    assert [[x.text for x in g] for g in a] == [[x.text for x in g] for g in b]
    assert vllm_sampler.model.device.type == "cuda"  # the transformers copy for step search, loaded on demand


def test_grpo_with_colocated_vllm_runs_steps_and_moves_the_weights(saved, tmp_path, monkeypatch):
    from transformers import TrainerCallback

    import pipeline.rl.grpo as rl

    # one process, not launched: the torch.distributed variables TRL's colocated vLLM (external launcher) reads
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29533"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(rl, "dvclive_callback", lambda live_dir: TrainerCallback())  # the device, not the curves
    model, tok = load_model(saved)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = [{"id": str(i), "prompt": t.split("\n", 1)[0] + "\n", "answer": t.rsplit(" ", 1)[1],
             "answer_type": "number", "step_values": [], "rationale": t.split("\n", 1)[1]} for i, t in enumerate(TEXTS)]
    cfg = GRPOStageConfig(max_steps=3, prompts_per_step=4, num_generations=4, max_completion_length=24,
                          use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.2, success_prompts=0)
    metrics = rl.rl_train(cfg, RewardsConfig(), model, tok, rows, tmp_path / "work", tmp_path / "live")
    assert metrics["steps"] == 3
    assert metrics["guided_replay"]["groups"] == 3 * 4  # every step's rollouts came through GuidedRollout on vLLM
    moved = sum(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())
    assert moved > len(before) // 2
