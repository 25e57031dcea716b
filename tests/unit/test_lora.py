"""LoRA adapters (pipeline/modeling/lora.py): wrapped only when the stage is switched on, saved merged or as an adapter
on its base folder, and loaded back by `pipeline.modeling.models` as the same function."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.modeling import lora
from pipeline.modeling.models import build_student, load_model, load_weights, save_model, train_tokenizer
from pipeline.modeling.params import BaseModelConfig, LoraConfig


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny model saved as a base folder, relative to a working directory as the stages' models/ are."""
    root = tmp_path_factory.mktemp("lora")
    tokenizer = train_tokenizer(["Step 1: 2 + 3 = 5\nAnswer: 5", "What is the largest value?"] * 20, 200)
    model = build_student(BaseModelConfig(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=200), tokenizer)
    save_model(model, tokenizer, root / "models/base")
    return root


def trained(model) -> None:
    """One made-up update of every trainable weight (what an optimizer step does to the adapter)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)


def logits(model, ids: torch.Tensor | None = None) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 9, 14, 3]]) if ids is None else ids
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_wrap_is_a_no_op_unless_the_stage_is_switched_on(base, monkeypatch):
    monkeypatch.chdir(base)
    model, _ = load_model("models/base", device="cpu")
    assert lora.wrap(model, LoraConfig(grpo=True), "sft") is model
    wrapped = lora.wrap(model, LoraConfig(sft=True, r=2, target_modules=["q_proj", "v_proj"]), "sft")
    assert lora.is_adapter(wrapped)
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ("q_proj" in n or "v_proj" in n) for n in trainable)
    # hidden 32, r 2, one layer: q_proj 32->32 and v_proj 32->16 (1 key/value head of 16) get A (2 x in) and
    # B (out x 2)
    assert lora.summary(wrapped, LoraConfig(sft=True, r=2))["lora"]["trainable_parameters"] == \
        (2 * 32 + 32 * 2) + (2 * 32 + 16 * 2)


@pytest.mark.parametrize("save", ["merged", "adapter"])
def test_a_saved_adapter_loads_back_as_the_same_function(base, tmp_path, monkeypatch, save):
    monkeypatch.chdir(base)
    cfg = LoraConfig(dpo=True, r=2, dropout=0.0, save=save)
    model, tokenizer = load_model("models/base", device="cpu")
    wrapped = lora.wrap(model, cfg, "dpo")
    trained(wrapped)
    expected = logits(wrapped)
    out = base / f"models/{save}"
    kept = lora.save(wrapped, tokenizer, out, cfg, base=base.joinpath("models/base").relative_to(base))
    if save == "merged":
        assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
        assert not lora.is_adapter(kept)
    else:
        assert not (out / "model.safetensors").exists() and (out / "adapter_model.safetensors").exists()
        assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "models/base"
    loaded = load_weights(out)
    torch.testing.assert_close(logits(loaded), expected, rtol=1e-4, atol=1e-5)
    # every weight trains again, as a plain folder's do (sft_extended and the PRM fine-tune all of them)
    assert all(p.requires_grad for p in loaded.parameters())
    # the base folder is untouched: it still computes what it did
    torch.testing.assert_close(logits(load_weights("models/base")), logits(load_model("models/base", device="cpu")[0]))


def test_an_adapter_on_an_adapter_loads_through_both(base, monkeypatch):
    """grpo's adapter on sft's adapter (lora.save adapter for both): the loader folds both into the base."""
    monkeypatch.chdir(base)
    cfg = LoraConfig(sft=True, grpo=True, r=2, dropout=0.0, save="adapter")
    model, tokenizer = load_model("models/base", device="cpu")
    first = lora.wrap(model, cfg, "sft")
    trained(first)
    lora.save(first, tokenizer, base / "models/sft", cfg, base="models/base")
    policy, tokenizer = load_model("models/sft", device="cpu")
    second = lora.wrap(policy, cfg, "grpo")
    trained(second)
    expected = logits(second)
    lora.save(second, tokenizer, base / "models/grpo", cfg, base="models/sft")
    torch.testing.assert_close(logits(load_model("models/grpo", device="cpu")[0]), expected, rtol=1e-4, atol=1e-5)
    # from another working directory (a user's notebook), by the folder's path: the bases named from the
    # repository root are found beside it
    monkeypatch.chdir(base / "models")
    torch.testing.assert_close(logits(load_model(base / "models/grpo", device="cpu")[0]), expected, rtol=1e-4,
                               atol=1e-5)


def test_only_the_trained_adapter_is_saved(base, monkeypatch):
    """TRL's GRPO adds a frozen copy named "ref" beside the adapter it trains (its KL reference, when beta > 0):
    the saved folder holds the trained adapter alone, with no `ref/` subfolder naming a base of its own."""
    monkeypatch.chdir(base)
    cfg = LoraConfig(grpo=True, r=2, dropout=0.0, save="adapter")
    model, tokenizer = load_model("models/base", device="cpu")
    wrapped = lora.wrap(model, cfg, "grpo")
    wrapped.add_adapter("ref", wrapped.peft_config["default"])  # as GRPOTrainer does
    trained(wrapped)
    expected = logits(wrapped)
    out = base / "models/grpo_ref"
    lora.save(wrapped, tokenizer, out, cfg, base="models/base")
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == []
    torch.testing.assert_close(logits(load_model("models/grpo_ref", device="cpu")[0]), expected, rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("save", ["merged", "adapter"])
def test_a_rank_other_than_0_writes_no_weights(base, tmp_path, monkeypatch, save):
    """Under DDP every rank holds the same weights and rank 0 writes them; another rank's output folder is a
    throwaway stand-in, so a copy of the model there is only disk spent (N - 1 copies of it)."""
    from pipeline.core import io

    monkeypatch.chdir(base)
    monkeypatch.setenv(io.LAUNCHED, "sft")
    monkeypatch.setenv("RANK", "1")
    cfg = LoraConfig(sft=True, r=2, save=save)
    model, tokenizer = load_model("models/base", device="cpu")
    kept = lora.save(lora.wrap(model, cfg, "sft"), tokenizer, tmp_path / "out", cfg, base="models/base")
    save_model(model, tokenizer, tmp_path / "plain")
    assert list(tmp_path.iterdir()) == []
    assert lora.is_adapter(kept) == (save == "adapter")  # the model to go on with, as rank 0 has it


def test_an_adapter_whose_base_is_missing_fails_naming_it(base, monkeypatch):
    from pipeline.core.io import InputError

    monkeypatch.chdir(base)
    folder = base / "models/orphan"
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((base / "models/base" / name).read_bytes())
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "models/gone"}))
    with pytest.raises(InputError, match="models/orphan") as caught:
        load_model("models/orphan", device="cpu")
    assert "models/gone" in str(caught.value)


def test_a_reference_built_from_a_loaded_adapter_is_the_adapted_model(base, monkeypatch):
    """DPO's reference and GRPO's KL reference, with no adapter trained on top, are rebuilt by TRL from the loaded
    model's `_name_or_path`: for an adapter folder that must give the adapted function, not its bare base."""
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(base)
    cfg = LoraConfig(sft=True, r=2, dropout=0.0, save="adapter")
    model, tokenizer = load_model("models/base", device="cpu")
    wrapped = lora.wrap(model, cfg, "sft", seed=3)
    trained(wrapped)
    lora.save(wrapped, tokenizer, base / "models/policy", cfg, base="models/base")
    policy = load_weights("models/policy")
    reference = AutoModelForCausalLM.from_pretrained(policy.config._name_or_path)
    torch.testing.assert_close(logits(reference), logits(policy), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(logits(load_weights("models/base")), logits(policy))


def test_the_adapter_starts_from_the_stage_seed(base, monkeypatch):
    monkeypatch.chdir(base)
    cfg = LoraConfig(grpo=True, r=2)
    first = lora.wrap(load_model("models/base", device="cpu")[0], cfg, "grpo", seed=5)
    torch.manual_seed(123)  # whatever ran before does not matter
    second = lora.wrap(load_model("models/base", device="cpu")[0], cfg, "grpo", seed=5)
    a = {n: p for n, p in first.named_parameters() if "lora_A" in n}
    assert a and all(torch.equal(p, dict(second.named_parameters())[n]) for n, p in a.items())
    with pytest.raises(Exception, match="lora.target_modules"):
        lora.wrap(load_model("models/base", device="cpu")[0], LoraConfig(grpo=True, target_modules=["nope"]), "grpo")
