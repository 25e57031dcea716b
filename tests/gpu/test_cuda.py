"""The CUDA paths, on a tiny model: loading onto the GPU, sampling, PRM scoring, SFT and PRM training steps.

Skipped without a CUDA device (the CPU paths are covered everywhere else); bench/gpu.sh runs them on a GPU machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from pipeline.inference.generation import generate
from pipeline.modeling.models import load_model, save_model
from pipeline.prm.model import PRMScorer, line_labels, prm_from_policy, scored_lines
from pipeline.prm.params import PRMConfig
from pipeline.training import trainer as training
from pipeline.training.params import TrainConfig
from tests.gpu.conftest import save_wide_student

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROW = {"answer": "7", "answer_type": "number", "step_values": ["3 4", "7"]}
TEXTS = [f"Question: what is {a}+{b}?\nStep 1: Select them: {a} {b}.\nStep 2: {a} + {b} = {a + b}.\nAnswer: {a + b}"
         for a in range(10) for b in range(10)]
PROMPTS = [f"Question: what is {a}+{b}?\n" for a, b in ((3, 4), (1, 8), (9, 9), (0, 5))]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny student with wide random weights (distinct continuations per prompt), saved like a stage saves it."""
    return save_wide_student(tmp_path_factory.mktemp("student"), TEXTS, hidden_size=32, intermediate_size=64)


@pytest.fixture
def no_dvclive(monkeypatch):
    """The trainers without their dvclive logger: these tests are about the device, not the curves."""
    monkeypatch.setattr(training, "dvclive_callback", lambda live_dir: TrainerCallback())


def test_load_model_puts_the_model_on_the_gpu(saved):
    model, _ = load_model(saved)
    assert model.device.type == "cuda"
    cpu, _ = load_model(saved, device="cpu")
    assert cpu.device.type == "cpu"


def test_greedy_decoding_on_the_gpu_matches_the_cpu(saved):
    gpu, tok = load_model(saved)
    cpu, _ = load_model(saved, device="cpu")
    on_gpu = generate(gpu, tok, PROMPTS, max_new_tokens=24, progress=False)
    on_cpu = generate(cpu, tok, PROMPTS, max_new_tokens=24, progress=False)
    assert [g[0].text for g in on_gpu] == [g[0].text for g in on_cpu]
    assert len({g[0].text for g in on_gpu}) > 1  # the prompts lead to different texts: the check can fail


def test_sampling_on_the_gpu_is_seeded(saved):
    model, tok = load_model(saved)
    draw = [generate(model, tok, PROMPTS, max_new_tokens=16, do_sample=True, num_return_sequences=3, seed=5,
                     progress=False) for _ in range(2)]
    texts = [[g.text for g in gens] for gens in draw[0]]
    assert texts == [[g.text for g in gens] for gens in draw[1]]
    assert any(len(set(t)) > 1 for t in texts)


def test_prm_scores_on_the_gpu_match_the_cpu(saved):
    head = prm_from_policy(saved)  # untrained: the policy's own LM head read as verdicts
    save_model(head, load_model(saved, device="cpu")[1], saved.parent / "prm")
    gpu = PRMScorer.load(saved.parent / "prm")
    cpu = PRMScorer.load(saved.parent / "prm", device="cpu")
    assert gpu.model.device.type == "cuda"
    assert gpu.head is not None and cpu.head is not None  # each verdict through the plain LM head, on both
    lines = [scored_lines(t.split("\n", 1)[1]) for t in TEXTS[:12]]
    prompts = [t.split("\n", 1)[0] + "\n" for t in TEXTS[:12]]
    on_gpu, on_cpu = gpu.score(prompts, lines), cpu.score(prompts, lines)
    assert [len(s) for s in on_gpu] == [len(s) for s in on_cpu] == [3] * 12
    assert max(abs(a - b) for x, y in zip(on_gpu, on_cpu) for a, b in zip(x, y)) < 1e-4


def test_sft_trains_on_the_gpu(saved, tmp_path, no_dvclive):
    model, tok = load_model(saved)
    rows = [{"prompt": t.split("\n", 1)[0] + "\n", "rationale": t.split("\n", 1)[1]} for t in TEXTS]
    cfg = TrainConfig(max_steps=4, per_device_train_batch_size=8, eval_steps=2, logging_steps=1,
                      max_eval_samples=8)
    metrics = training.sft_train(cfg, model, tok, rows, rows, tmp_path / "work", tmp_path / "live")
    assert metrics["steps"] == 4 and metrics["weights_changed"] > 0.5
    assert next(model.parameters()).device.type == "cuda"


def test_prm_trains_on_the_gpu(saved, tmp_path, no_dvclive):
    tok = load_model(saved, device="cpu")[1]
    model = prm_from_policy(saved)
    rows = []
    for text in TEXTS[:32]:
        prompt, completion = text.split("\n", 1)
        lines = scored_lines(completion)
        rows.append({"prompt": prompt + "\n", "steps": lines, "labels": line_labels(lines, ROW), "source": "gold"})
    cfg = PRMConfig(num_train_epochs=1, per_device_train_batch_size=8, logging_steps=1)
    metrics = training.prm_train(cfg, model, tok, rows, tmp_path / "work", tmp_path / "live")
    assert metrics["steps"] == 4 and metrics["weights_changed"] > 0.5
    assert next(model.parameters()).device.type == "cuda"
