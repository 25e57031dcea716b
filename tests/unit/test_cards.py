"""A model folder says what it is: the manifest records the prompt format it was trained on, and README.md (the
model card) names the stage, the params, the training metrics without timings, and how to load it in that format."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.modeling import cards, chat
from pipeline.modeling.models import build_student, save_model, train_tokenizer
from pipeline.modeling.params import BaseModelConfig, PromptConfig
from pipeline.training.params import SFTConfig


@pytest.fixture
def folder(tmp_path):
    tokenizer = train_tokenizer(["Question: 1 + 2?\nAnswer: 3"] * 20, 280)
    cfg = BaseModelConfig(seed=0, vocab_size=280, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    save_model(build_student(cfg, tokenizer), tokenizer, tmp_path / "sft")
    return tmp_path / "sft"


@pytest.mark.parametrize("prompt", [PromptConfig(format="raw"), PromptConfig(format="chat", system="Be brief.")],
                         ids=["raw", "chat"])
def test_the_card_and_manifest_say_what_the_model_is_and_how_to_load_it(folder, prompt):
    chat.use(prompt)
    try:
        cards.write_model_manifest(folder, "sft", SFTConfig(learning_rate=0.002), inputs=[],
                                   metrics={"train_loss": 0.4, "train_seconds": 52.0, "eval": {"runtime": 1.0}})
    finally:
        chat.use(None)
    manifest = json.loads((folder / "pipeline_config.json").read_text())
    assert manifest["prompt"] == prompt.model_dump(mode="json")
    card = (folder / "README.md").read_text()
    head = yaml.safe_load(card.split("---")[1])
    assert head["library_name"] == "transformers" and "sft" in head["tags"]
    assert "# models/sft" in card and "LlamaForCausalLM (layers 1, hidden size 16, vocabulary" in card
    assert "learning_rate: 0.002" in card and "train_loss: 0.4" in card
    assert "seconds" not in card and "runtime" not in card  # a re-run that trains the same weights writes the same card
    assert "metrics/evaluate/sft.json" in card and 'AutoTokenizer.from_pretrained("models/sft")' in card
    if prompt.format == "chat":
        assert "apply_chat_template" in card and "'Be brief.'" in card and "| prompt format | chat" in card
    else:
        assert "apply_chat_template" not in card and "| prompt format | raw" in card
