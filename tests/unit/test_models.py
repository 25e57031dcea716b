"""Saved models load back with the tokenizer they were trained with."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pipeline.modeling.models import EOS, PAD, build_student, load_model, load_tokenizer, save_model, train_tokenizer
from pipeline.modeling.params import BaseModelConfig

CORPUS = [
    "Chart: bar. Title: Sales.\n2016: 15 grey | 2017: 7 teal\nQuestion: What is the total?\n"
    "Step 1: Select all bars: 2016 15, 2017 7.\nStep 2: Their sum is 22.\nAnswer: 22",
    "Chart: pie. Title: Visitors (k).\nWed: 17 gold | Thu: 9 grey\nQuestion: Which is larger?\n"
    "Step 1: Select all slices: Wed 17, Thu 9.\nStep 2: The largest is Wed 17.\nAnswer: Wed",
] * 30
PROBES = ["2018: 12.5 | 2019: 120\nStep 3: 15 - 7 = 8.", "Wed 17, Thu 9; total 1,026"]


def whole_number_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE whose pre-tokenizer keeps digit runs whole (" 15" can be one token), unlike Qwen2's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    ))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)


def saved(tmp_path, tokenizer, architecture: str = "llama"):
    cfg = BaseModelConfig(architecture=architecture, seed=0, hidden_size=32, intermediate_size=64,
                          num_attention_heads=2, num_key_value_heads=1)
    save_model(build_student(cfg, tokenizer), tokenizer, tmp_path)
    return tmp_path


def encodings(tokenizer) -> list[list[int]]:
    return tokenizer(CORPUS[:2] + PROBES, add_special_tokens=False)["input_ids"]


def test_a_custom_pre_tokenizer_survives_save_and_load(tmp_path):
    tokenizer = whole_number_tokenizer()
    assert "Ġ15" in tokenizer.tokenize("Wed: 15")  # the case that a Qwen2 class would split digit by digit
    folder = saved(tmp_path, tokenizer)
    _, loaded = load_model(folder)
    assert encodings(loaded) == encodings(tokenizer) == encodings(load_tokenizer(folder))
    assert loaded.decode(encodings(loaded)[2]) == PROBES[0]
    assert (loaded.eos_token, loaded.pad_token, loaded.padding_side) == (EOS, PAD, "left")


def test_the_default_tokenizer_survives_save_and_load(tmp_path):
    tokenizer = train_tokenizer(CORPUS, 300)
    folder = saved(tmp_path, tokenizer)
    loaded = load_model(folder)[1]
    assert encodings(loaded) == encodings(tokenizer)
    assert loaded.tokenize("Wed: 17")[-2:] == [":", "Ġ17"]  # a chart value is one token, its space with it
    # no token holds more than two digits or digits of two numbers ("1" "5" here: "15" alone is rare in CORPUS)
    assert all(sum(c.isdigit() for c in t) <= 2 for p in PROBES for t in loaded.tokenize(p))
    # Built as a Llama (base.architecture's default), the folder reads the same through AutoTokenizer, as every
    # tool pointed at it loads it (with left padding, as decoder-only batches need)
    auto = AutoTokenizer.from_pretrained(str(folder))
    assert encodings(auto) == encodings(tokenizer) and auto.padding_side == "left"
    assert encodings(PreTrainedTokenizerFast.from_pretrained(str(folder))) == encodings(tokenizer)


def test_a_qwen2_folder_still_meets_the_autotokenizer_trap(tmp_path):
    """The trap of docs/experiments/autotokenizer-reload-trap.md, why the built student is a Llama: transformers
    loads any qwen2 folder as its Qwen2Tokenizer, whose own pre-tokenizer splits the space off again. If a release
    stops doing so, base.architecture qwen2 becomes safe again."""
    tokenizer = train_tokenizer(CORPUS, 300)
    cfg = BaseModelConfig(architecture="qwen2", seed=0, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                          num_key_value_heads=1)
    save_model(build_student(cfg, tokenizer), tokenizer, tmp_path)
    assert AutoTokenizer.from_pretrained(str(tmp_path)).tokenize("Wed: 17")[-4:] == [":", "Ġ", "1", "7"]
    assert load_model(tmp_path)[1].tokenize("Wed: 17")[-2:] == [":", "Ġ17"]  # the pipeline's loader reads it right


def test_spaced_digits_keep_the_space_with_each_first_digit():
    tokenizer = train_tokenizer(CORPUS, 300, digits="spaced")
    assert tokenizer.tokenize("15") == ["1", "5"] and tokenizer.tokenize("Wed: 17")[-3:] == [":", "Ġ1", "7"]
    assert [tokenizer.decode(ids) for ids in encodings(tokenizer)] == CORPUS[:2] + PROBES


def test_pairs_cut_a_number_into_pieces_of_two_digits():
    tokenizer = train_tokenizer(CORPUS * 4 + ["Step 2: 2019 and 120 and 12.5 and 1,026."] * 40, 400)
    assert tokenizer.tokenize(" 2019 120 12.5") == ["Ġ20", "19", "Ġ12", "0", "Ġ12", ".", "5"]
    assert [tokenizer.decode(ids) for ids in encodings(tokenizer)] == CORPUS[:2] + PROBES


def test_split_digits_give_the_space_a_token_of_its_own():
    tokenizer = train_tokenizer(CORPUS, 300, digits="split")
    assert tokenizer.tokenize("Wed: 17")[-4:] == [":", "Ġ", "1", "7"]
    assert [tokenizer.decode(ids) for ids in encodings(tokenizer)] == CORPUS[:2] + PROBES
    with pytest.raises(ValueError, match="digits: 'whole'"):
        train_tokenizer(CORPUS, 300, digits="whole")


def test_a_folder_without_tokenizer_json_falls_back_to_autotokenizer(tmp_path):
    # Slow-tokenizer files only (vocab.json + merges.txt, as older Hub repos ship): AutoTokenizer converts them
    # into the config's class (Qwen2's), whose pre-tokenizer a split-digit tokenizer agrees with (Qwen2 gives
    # a space before a digit a token of its own, so the default spaced one would not).
    tokenizer = train_tokenizer(CORPUS, 300, digits="split")
    folder = saved(tmp_path / "model", tokenizer, "qwen2")
    (folder / "tokenizer.json").unlink()
    tokenizer.backend_tokenizer.model.save(str(folder))
    loaded = load_tokenizer(folder)
    assert type(loaded).__name__ == "Qwen2Tokenizer"  # AutoTokenizer's class, not the exact tokenizer.json load
    assert encodings(loaded) == encodings(tokenizer)
    assert (loaded.eos_token, loaded.pad_token) == (EOS, PAD)


def test_a_missing_tokenizer_is_an_error_not_a_second_try(tmp_path, monkeypatch):
    def second_try(*args, **kwargs):
        raise AssertionError("AutoTokenizer was tried for a folder that does not exist")

    monkeypatch.setattr("pipeline.modeling.models.AutoTokenizer.from_pretrained", second_try)
    with pytest.raises(OSError):
        load_tokenizer(tmp_path / "nothing-here")


def test_models_load_with_the_dtype_and_attention_of_the_model_section(tmp_path, monkeypatch):
    import torch

    from pipeline.core.params import giving
    from pipeline.modeling.models import build_student, load_kwargs, load_model, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig, ModelLoadConfig

    tok = train_tokenizer(["a 12 b 34 c"] * 20, 300)
    cfg = BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    save_model(build_student(cfg, tok), tok, tmp_path / "m")
    with giving(ModelLoadConfig(dtype="bfloat16", attn_implementation="eager")):  # as a stage hands `model` over
        assert load_kwargs() == {"dtype": torch.bfloat16, "attn_implementation": "eager", "use_safetensors": True,
                                 "trust_remote_code": False}
        model, _ = load_model(tmp_path / "m", device="cpu")
        assert next(model.parameters()).dtype == torch.bfloat16
        assert model.config._attn_implementation == "eager"
        assert next(load_model(tmp_path / "m", dtype=torch.float32, device="cpu")[0].parameters()).dtype == \
            torch.float32
    # nothing handed over: the schema's defaults, float32 and transformers' attention
    assert load_kwargs() == {"dtype": torch.float32, "use_safetensors": True, "trust_remote_code": False}


def test_a_tokenizer_without_pad_or_eos_fails_naming_the_folder(tmp_path):
    from pipeline.core.io import InputError

    tok = train_tokenizer(["a 12 b 34 c"] * 20, 300)
    cfg = BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = build_student(cfg, tok)
    tok.pad_token = tok.eos_token = None
    save_model(model, tok, tmp_path / "m")
    with pytest.raises(InputError, match=r"m: its tokenizer has neither a pad nor an EOS token"):
        load_model(tmp_path / "m", device="cpu")


def test_a_damaged_local_model_is_named_before_it_samples_nonsense(tmp_path, monkeypatch):
    """A mistyped or missing folder, a folder whose tokenizer.json is gone (transformers would build an empty
    tokenizer from tokenizer_config.json, and sampling failed on a reshape of 0 elements), and weights holding NaN
    (bytes damaged in the tensor data, or a diverged run): each an InputError naming the folder, before any work."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.core.io import InputError

    tok = train_tokenizer(["a 12 b 34 c"] * 20, 300)
    cfg = BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    save_model(build_student(cfg, tok), tok, tmp_path / "models/sft")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"models/sftt: no such model folder \(a local path"):
        load_model("models/sftt", device="cpu")
    load_model("models/sft", device="cpu")  # as saved: loads
    (tmp_path / "models/sft/tokenizer.json").rename(tmp_path / "tokenizer.json")
    with pytest.raises(InputError, match=r"models/sft: no tokenizer file in it \(tokenizer.json"):
        load_model("models/sft", device="cpu")
    (tmp_path / "tokenizer.json").rename(tmp_path / "models/sft/tokenizer.json")
    weights = load_file(tmp_path / "models/sft/model.safetensors")
    name = sorted(weights)[3]
    weights[name][0] = float("nan")
    save_file(weights, tmp_path / "models/sft/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=rf"models/sft: 1 weight tensor\(s\) hold NaN or infinite values \({name}"):
        load_model("models/sft", device="cpu")
    assert torch.isnan(weights[name]).any()


@pytest.mark.skipif(__import__("importlib").util.find_spec("flash_attn") is not None, reason="flash-attn installed")
def test_flash_attention_without_its_package_is_refused_at_validation():
    from pipeline.core.io import ConfigError
    from pipeline.modeling.params import ModelLoadConfig
    from pipeline.orchestration.checks import check_attention

    for fine in (None, "sdpa", "eager"):
        check_attention(ModelLoadConfig(attn_implementation=fine))
    with pytest.raises(ConfigError, match=r"model.attn_implementation: flash_attention_2 needs the flash-attn package "
                                          r"\(pip install flash-attn\).*not found here; sdpa or eager run anywhere"):
        check_attention(ModelLoadConfig(attn_implementation="flash_attention_2"))
