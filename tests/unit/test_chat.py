"""`prompt.format`: raw prompts as before; chat prompts through the tokenizer's own template, the same for
sampling, step search, PRM encoding and every TRL trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.core.io import ConfigError
from pipeline.core.params import parse_section
from pipeline.modeling import chat
from pipeline.modeling.models import (
    BUILT_TEMPLATE,
    EOS,
    build_student,
    check_models,
    load_tokenizer,
    save_model,
    train_tokenizer,
)
from pipeline.modeling.params import BaseModelConfig, PromptConfig
from pipeline.training.params import TeacherConfig

CORPUS = ["Tom has 3 apples and buys 4 more. How many?\nStep 1: 3 + 4 = 7.\nAnswer: 7"] * 30
LLAMA3 = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
          "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@pytest.fixture
def tok():
    return train_tokenizer(CORPUS, 300)


@pytest.fixture
def as_chat():
    def use(system=None):
        chat.use(PromptConfig(format="chat", system=system))
    yield use
    chat.use(None)


def llama3_tokenizer():
    """Another template, with its own special tokens and an end-of-turn token as EOS (as Llama 3 has)."""
    tokenizer = train_tokenizer(CORPUS, 300)
    tokenizer.add_special_tokens({"eos_token": "<|eot_id|>",
                                  "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"]})
    tokenizer.chat_template = LLAMA3
    return tokenizer


def test_raw_prompts_are_the_question_text(tok):
    assert chat.render(tok, "How many?\n") == "How many?\n"
    assert chat.example("Q\n", "Step 1: x") == {"prompt": "Q\n", "completion": "Step 1: x"}


def test_a_built_tokenizer_carries_the_template_and_renders_roles_by_hand(tok, as_chat, tmp_path):
    as_chat(system="Be brief.")
    assert chat.render(tok, "How many?") == "<|system|>\nBe brief.\n<|user|>\nHow many?\n<|assistant|>\n"
    full = tok.apply_chat_template(chat.messages("How many?") + [{"role": "assistant", "content": "7"}], tokenize=False)
    assert full == chat.render(tok, "How many?") + "7" + EOS  # the prompt is a prefix; EOS ends the turn
    save_model(build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             max_position_embeddings=64), tok), tok, tmp_path / "m")
    assert load_tokenizer(tmp_path / "m").chat_template == BUILT_TEMPLATE  # saved and loaded back


def test_a_loaded_models_own_template_is_used(as_chat):
    as_chat()
    tokenizer = llama3_tokenizer()
    text = chat.render(tokenizer, "How many?")
    assert text == "<|start_header_id|>user<|end_header_id|>\n\nHow many?<|eot_id|>" \
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"][0]) == \
        "<|start_header_id|>"


def test_trl_examples_are_conversational_with_chat(as_chat):
    as_chat(system="S")
    assert chat.example("Q", "A") == {
        "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        "completion": [{"role": "assistant", "content": "A"}]}
    assert chat.question(chat.prompt("Q")) == "Q" and chat.question("Q") == "Q"


def test_sft_trains_on_the_completion_tokens_of_the_templated_conversation(tok, as_chat, tmp_path):
    """TRL renders the conversational example with the same template; the labels are " 7" and EOS alone."""
    from trl import SFTTrainer

    from pipeline.training.params import TrainConfig
    from pipeline.training.trainer import prompt_completion_dataset, trainer_args

    as_chat()
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64), tok)
    rows = [{"prompt": "How many?", "rationale": " 7"}]
    trainer = SFTTrainer(model=model, args=trainer_args(TrainConfig(max_steps=1), tmp_path, eval_strategy="no"),
                         processing_class=tok, train_dataset=prompt_completion_dataset(rows))
    example = trainer.train_dataset[0]
    prompt_ids = tok(chat.render(tok, "How many?"), add_special_tokens=False)["input_ids"]
    completion_ids = tok(" 7" + EOS, add_special_tokens=False)["input_ids"]
    assert example["input_ids"] == prompt_ids + completion_ids
    assert example["labels"] == [-100] * len(prompt_ids) + completion_ids  # the loss falls on " 7" and EOS only


def test_guided_rollout_renders_conversational_prompts_and_finds_their_gold(tok, as_chat):
    from pipeline.rl.grpo import GuidedRollout

    as_chat()
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64), tok)
    gold = {"How many?": {"answer": "7", "answer_type": "number", "rationale": "Step 1: 3 + 4 = 7.\nAnswer: 7"}}
    rollout = GuidedRollout(gold, num_generations=2, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=0,
                            replay=True, replay_max_accuracy=0.0, replay_samples=1)
    trainer = SimpleNamespace(processing_class=tok, model=model, state=SimpleNamespace(global_step=0),
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m, process_index=0))
    out = rollout([chat.prompt("How many?")] * 2, trainer)
    assert tok.decode(out["prompt_ids"][0]) == "<|user|>\nHow many?\n<|assistant|>\n"
    # an untrained model never answers 7 in 6 tokens: the last rollout is the gold rationale (the token budget)
    assert out["completion_ids"][1] == tok(gold["How many?"]["rationale"], add_special_tokens=False)["input_ids"][:5] \
        + [tok.eos_token_id]
    assert rollout.stats["replayed_groups"] == 1


def test_prm_spans_point_at_the_steps_after_a_templated_prompt(tok, as_chat):
    from pipeline.prm.model import encode_many

    as_chat()
    (ids, spans), = encode_many(tok, ["How many?"], [["Step 1: 3 + 4 = 7.", "Answer: 7"]])
    assert tok.decode(ids[: spans[0][0]]) == "<|user|>\nHow many?\n<|assistant|>\n"
    assert [tok.decode(ids[a:b]).strip() for a, b in spans] == ["Step 1: 3 + 4 = 7.", "Answer: 7"]


def test_step_search_and_samplers_render_the_prompt(tok, as_chat):
    from pipeline.evaluation.search import StepPolicy
    from pipeline.inference.generation import LocalSampler

    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64), tok)
    torch.manual_seed(0)
    raw = LocalSampler(model, tok).sample(["How many?"], max_new_tokens=4)
    as_chat()
    assert StepPolicy(model, tok).render("How many?") == "<|user|>\nHow many?\n<|assistant|>\n"
    templated = LocalSampler(model, tok).sample(["How many?"], max_new_tokens=4)
    from pipeline.inference.generation import generate
    assert templated == generate(model, tok, ["<|user|>\nHow many?\n<|assistant|>\n"], max_new_tokens=4)
    assert raw == generate(model, tok, ["How many?"], max_new_tokens=4)


def test_chat_needs_a_template_a_chat_route_and_system_needs_chat(tmp_path, tok):
    chat_cfg = PromptConfig(format="chat")
    tok.chat_template = None
    save_model(build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             max_position_embeddings=64), tok), tok, tmp_path / "plain")
    base = BaseModelConfig(model=str(tmp_path / "plain"))
    with pytest.raises(ConfigError, match=r"base\.model: .*plain' has no chat template"):
        check_models(chat_cfg, base=base)
    check_models(PromptConfig(format="raw"), base=base)  # raw prompts need no template
    teacher = TeacherConfig(backend="transformers", model=str(tmp_path / "plain"))
    with pytest.raises(ConfigError, match=r"teacher\.model"):
        check_models(chat_cfg, teacher=teacher)
    remote = TeacherConfig(backend="openai", model="m", base_url="http://127.0.0.1:1/v1", api="completions")
    with pytest.raises(ConfigError, match=r"teacher\.api: .*set teacher\.api: chat"):
        check_models(chat_cfg, teacher=remote)
    with pytest.raises(ConfigError, match=r"prompt: .*system: a system message needs format chat"):
        parse_section("prompt", PromptConfig, {"format": "raw", "system": "Be brief."})


def test_a_loaded_model_must_load_in_any_format_naming_its_key(tmp_path, tok, monkeypatch):
    """Raw prompts need no template, but the model itself must be there: its config, and a tokenizer with a pad
    or an EOS token; each failure names the key at validation."""
    raw = PromptConfig(format="raw")
    (tmp_path / "tokenizer_only").mkdir()
    tok.save_pretrained(tmp_path / "tokenizer_only")
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64), tok)
    (tmp_path / "config_only").mkdir()
    model.config.save_pretrained(tmp_path / "config_only")  # transformers would make up an empty tokenizer
    (tmp_path / "bin_only").mkdir()
    model.config.save_pretrained(tmp_path / "bin_only")
    tok.save_pretrained(tmp_path / "bin_only")
    torch.save(model.state_dict(), tmp_path / "bin_only" / "pytorch_model.bin")
    save_model(model, tok, tmp_path / "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "no_tokenizer" / name).unlink()
    for folder, message in (
            (tmp_path / "absent", ": no such folder"),
            (tmp_path / "tokenizer_only",
             ": no model.safetensors .*; found chat_template.jinja, tokenizer.json, tokenizer_config.json$"),
            (tmp_path / "config_only", ": no model.safetensors .*; found config.json$"),
            (tmp_path / "bin_only", ": no model.safetensors .*pickled weights .*convert them once"),
            (tmp_path / "no_tokenizer", ": no tokenizer files")):
        with pytest.raises(ConfigError, match=rf"base\.model: {folder}{message}"):
            check_models(raw, base=BaseModelConfig(model=str(folder)))
    with monkeypatch.context() as m:  # a mistyped folder beside real ones: local, named at once (not a Hub id)
        m.chdir(tmp_path)
        with pytest.raises(ConfigError, match=r"base\.model: tokenizer_only/typo: no such folder \(a local path"):
            check_models(raw, base=BaseModelConfig(model="tokenizer_only/typo"))
    tok.pad_token = tok.eos_token = None
    save_model(model, tok, tmp_path / "no_pad")
    with pytest.raises(ConfigError, match=r"teacher\.model: the tokenizer of .*no_pad' has neither a pad nor an EOS"):
        check_models(raw, teacher=TeacherConfig(backend="transformers", model=str(tmp_path / "no_pad")))


def test_the_server_chat_route_applies_the_template_or_concatenates_without_one(tok):
    from pipeline.inference.openai_server import _chat_prompt

    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "Q"}]}]
    assert _chat_prompt(messages, tok) == "<|system|>\nS\n<|user|>\nQ\n<|assistant|>\n"
    assert _chat_prompt(messages, None) == "SQ"
