"""Build the tiny default student or load any Hugging Face model; save with its config.

The default runs offline: a byte-level BPE tokenizer trained with `tokenizers`
on the synthetic corpus (numbers cut into pieces of at most two digits, each
with the space before it, so a chart's value is one token) and a small Qwen2
causal LM built from a config.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from pipeline.core import sharding
from pipeline.core.io import ConfigError, InputError, rank
from pipeline.core.params import LOCAL_RULE, given, is_local, is_stage_output, watched
from pipeline.core.phases import phase
from pipeline.modeling.chat import TOKENIZER_FILES, WEIGHT_FILES, has_template, save_tokenizer
from pipeline.modeling.params import BaseModelConfig, ModelLoadConfig, PromptConfig, Sized


class TeacherSource(Protocol):
    """What the model checks read of the `teacher` section (the training room's, above this one)."""

    backend: str
    api: str
    model: str | None

DTYPES: dict[str, torch.dtype | str] = {"auto": "auto", "bfloat16": torch.bfloat16, "float32": torch.float32}
# What a model to be trained loads as, whatever `model.dtype`: AdamW on bfloat16 weights rounds away any update
# below about 1/256 of a weight (a pretrained model's 1e-5 learning rate moved 7% of its elements); the trainers
# compute in bfloat16 on a GPU by autocast instead (training.device_args).
MASTER_DTYPE = torch.float32
EOS = "<|endoftext|>"
PAD = "<|pad|>"

# The chat template of every tokenizer the DAG builds (prompt.format chat): ChatML's layout with
# plain-text headers, so the vocabulary stays the corpus's own. The assistant turn ends with EOS and
# nothing after it, so the rendered prompt (ending "<|assistant|>\n") is a prefix of the rendered
# prompt + completion (TRL masks the completion by that prefix).
BUILT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}{{ eos_token }}{%- else -%}{{ '\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int, digits: str = "pairs") -> PreTrainedTokenizerFast:
    """Byte-level BPE on the corpus; digit runs are cut before merging, so no token spans two numbers.

    digits="pairs" cuts a number into pieces of at most two digits, each with the space before it:
    "Tigers: 19" is ..., ":", " 19" (merged into one token where the corpus has it often enough; "2019"
    is " 20", "19"; "12.5" is " 12", ".", "5"). A chart value of 1 to 99 is then one token, like a colour
    word, so looking it up is one lookup; with "spaced" (" 1", "9") the second digit is a second lookup,
    which the drilled student learns only for some inits and machines; with "split" (" ", "1", "9") no
    probe learned it. Measured: docs/experiments/digit-pair-tokenizer.md (pairs against spaced),
    numeric-lookup-clicks.md (spaced, by init) and does-the-student-read-the-table.md (split).
    """
    rules = {"pairs": r" ?[0-9]{1,2}", "spaced": r" ?[0-9]"}
    if digits not in (*rules, "split"):
        raise ValueError(f"digits: {digits!r} is none of {sorted([*rules, 'split'])}")
    split = (pre_tokenizers.Split(Regex(rules[digits]), behavior="isolated") if digits in rules
             else pre_tokenizers.Digits(individual_digits=True))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte stays encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    fast.padding_side = "left"  # decoder-only generation pads on the left
    fast.chat_template = BUILT_TEMPLATE  # used with prompt.format chat; raw prompts never read it
    return fast


ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


def build_student(cfg: BaseModelConfig, tokenizer: PreTrainedTokenizerFast):
    """A freshly initialised causal LM of `cfg.architecture` at the configured size (seeded)."""
    torch.manual_seed(cfg.seed)
    config_class, model_class = ARCHITECTURES[cfg.architecture]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def base_model(cfg: BaseModelConfig, train_rows: Iterable[dict]):
    """Stage base's (model, tokenizer) before its drills: loaded from `cfg.model`, or a student built from scratch
    with a tokenizer trained on the rows' prompts and rationales (`cfg.vocab_size`, `cfg.digits`)."""
    if cfg.model:
        return load_model(cfg.model)
    corpus = (row["prompt"] + row["rationale"] for row in train_rows)
    tokenizer = train_tokenizer(corpus, cfg.vocab_size, cfg.digits)
    return build_student(cfg, tokenizer), tokenizer


# The embedded teacher's longest sequence, in tokens: its params do not name one (the student's is
# base.max_position_embeddings); spelled here rather than left to a schema default, which DVC does not track.
TEACHER_POSITIONS = 1024


def build_teacher(cfg: Sized, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """The untrained embedded teacher: a Qwen2 at the size the `teacher` section gives."""
    size = BaseModelConfig(
        seed=cfg.seed, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=TEACHER_POSITIONS,
    )
    return build_student(size, tokenizer)


def default_device() -> torch.device:
    """The GPU when there is one, else the CPU: where loaded models sample, score and train."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_tokenizer(path: Path | str) -> PreTrainedTokenizerFast:
    """A tokenizer exactly as its tokenizer.json defines it (a folder or a Hub id), else AutoTokenizer's.

    transformers 5's AutoTokenizer builds the model type's own class (Qwen2Tokenizer
    for a Qwen2 config; likewise for Llama- or GPT2-typed Hub models), which replaces
    the saved pre-tokenizer with that class's defaults (huggingface/transformers#45920):
    a tokenizer trained with other pre-tokenization rules then silently encodes
    differently from training. The default tokenizer is one: its numbers (" 15", one token)
    come back split (" ", "1", "5"). tokenizer.json is the definition that was trained.
    Without one (slow tokenizer files only) AutoTokenizer converts what there is.
    """
    path = watched(str(path))  # `~` expanded
    if is_gguf(path):
        from pipeline.modeling.pretrained import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    try:
        return PreTrainedTokenizerFast.from_pretrained(path)
    except ValueError:  # no tokenizer.json; OSError (nothing there, offline) propagates, not retried twice
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=given(ModelLoadConfig).trust_remote_code)


def load_kwargs(dtype: torch.dtype | str | None = None) -> dict:
    """`from_pretrained` keywords from the `model` section: the dtype (unless `dtype` is given), the attention,
    remote code; weights from safetensors files only."""
    cfg = given(ModelLoadConfig)
    # safetensors only: a pickled checkpoint (pytorch_model.bin) can run code as it loads
    out: dict = {"dtype": dtype if dtype is not None else DTYPES[cfg.dtype], "use_safetensors": True,
                 "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        out["attn_implementation"] = cfg.attn_implementation
    return out


def load_weights(path: Path | str, dtype: torch.dtype | str | None = None):
    """The causal LM in `path` (on the CPU). A LoRA adapter folder (`lora.save: adapter`) loads its base (the
    folder its adapter_config.json names, itself possibly an adapter) and folds the adapter into it."""
    path = watched(str(path))  # `~` expanded
    if is_gguf(path):
        from pipeline.modeling.pretrained import load_gguf

        return load_gguf(path, dtype if dtype is not None else DTYPES[given(ModelLoadConfig).dtype])[0]
    adapter = Path(path) / "adapter_config.json"
    if not adapter.is_file():
        return AutoModelForCausalLM.from_pretrained(str(path), **load_kwargs(dtype))
    from peft import PeftModel

    named = json.loads(adapter.read_text()).get("base_model_name_or_path")
    base = adapter_base(Path(path), named)
    if base is None:  # the pipeline's adapters sit on its own model folders, never a Hub id
        raise FileNotFoundError(f"{adapter}: base_model_name_or_path {named!r} is not a model folder here or beside "
                                "the adapter's repository (an adapter loads beneath its base: build the base's stage)")
    model = PeftModel.from_pretrained(load_weights(base, dtype), str(path)).merge_and_unload()
    # PEFT froze the base's weights and merging keeps them frozen: as any loaded model, every weight trains again
    # (full fine-tuning after an adapter: sft_extended, the PRM; a later adapter freezes them itself)
    model.requires_grad_(True)
    # What TRL builds a frozen reference from (DPO, GRPO's KL) when no adapter is trained on top: this folder,
    # which transformers loads as its base with the adapter on it (the same function), not the base alone.
    model.config._name_or_path = str(path)
    return model


def adapter_base(folder: Path, named: str | None) -> Path | None:
    """The base folder of the adapter in `folder`: `named` as it stands (absolute, or relative to the working
    directory: the repository root, where every stage runs), else relative to one of the adapter folder's parents
    (`lora.save` names the base from the repository root, so `/elsewhere/repo/models/grpo` finds
    `/elsewhere/repo/models/sft` from any working directory). None: no such folder."""
    if not named:
        return None
    if Path(named).is_dir():
        return Path(named)
    if Path(named).is_absolute():
        return None
    return next((parent / named for parent in folder.resolve().parents if (parent / named).is_dir()), None)


def is_gguf(path: Path | str) -> bool:
    """A GGUF file (llama.cpp's format) rather than a Hugging Face folder or id: transformers de-quantizes it."""
    return str(path).lower().endswith(".gguf")


def check_local_folder(path: str) -> None:
    """A path that names a local folder (config.is_local) must be one, with a tokenizer file: missing, transformers
    would look the path up on the Hub (minutes of retries offline); without tokenizer.json it would build an empty
    tokenizer from tokenizer_config.json alone, which encodes every prompt as nothing."""
    if not is_local(path, (".gguf",)):
        return
    if is_gguf(path):
        if not Path(path).expanduser().is_file():
            raise InputError(f"{path}: no such GGUF file ({LOCAL_RULE})")
        return
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise InputError(f"{path}: no such model folder ({LOCAL_RULE})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{path}: no tokenizer file in it ({', '.join(TOKENIZER_FILES[:2])}, ...): restore it (dvc "
                         "checkout) or save the tokenizer beside the weights")


@phase("load model")
def load_model(path: Path | str, dtype: torch.dtype | str | None = None, device: torch.device | str | None = None):
    """A causal LM and its tokenizer from a local folder or a Hub id (offline with HF_HUB_OFFLINE=1).

    Its dtype and attention come from the `model` section unless `dtype` is given. The model goes
    to `device` (default: `default_device()`), so that the stages that sample (mine, prm_data,
    evaluate) use a GPU when there is one, as the trainers do.
    """
    path = str(path)
    check_local_folder(path)
    try:
        tokenizer = load_tokenizer(path)
        model = load_weights(path, dtype)
    except (OSError, ValueError, SafetensorError) as exc:  # missing, truncated or corrupted files
        raise InputError(f"{path}: cannot load model/tokenizer: {exc}") from exc
    if damaged := [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]:
        # bytes damaged inside the tensor data (the header still parses), or weights saved by a diverged run:
        # sampling would fail later on "probability tensor contains inf or nan", training on a NaN loss
        raise InputError(f"{path}: {len(damaged)} weight tensor(s) hold NaN or infinite values ({damaged[0]}, ...): "
                         "the file is damaged or the model diverged; restore it (dvc checkout) or re-run its stage")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:  # batched decoding and every trainer pad with one of the two
            raise InputError(f"{path}: its tokenizer has neither a pad nor an EOS token; give it one "
                             "(tokenizer.eos_token = ..., then save_pretrained) so generation can stop and batches pad")
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device or default_device())
    tokenizer.padding_side = "left"
    return model, tokenizer


@phase("save model")
def save_model(model, tokenizer, folder: Path) -> None:
    """Hugging Face format, safetensors weights, tokenizer beside them.

    A model sharded by FSDP is gathered whole first, by every rank; the ranks without the gathered weights (all
    but global rank 0, which writes the stage's outputs) write nothing. Unsharded (DDP, ZeRO-2), every rank holds
    the same weights and only rank 0 writes them: another rank's output folder is a throwaway stand-in, and N - 1
    copies of a large model there would fill the temporary disk.
    """
    state = None
    if sharding.sharded(model):
        state = sharding.full_state_dict(model)
        if not state:
            return
    elif not writes_weights(model):
        return
    model.save_pretrained(folder, safe_serialization=True, state_dict=state)
    save_tokenizer(tokenizer, folder, getattr(getattr(model, "config", None), "max_position_embeddings", None))


def writes_weights(model) -> bool:
    """Does this rank write `model`'s weights? Sharded, every rank takes part (the gather decides who gets them);
    otherwise every rank holds the same weights and only global rank 0 writes them."""
    return sharding.sharded(model) or rank() == 0


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _check_local_model(key: str, folder: Path, path: Path | str) -> None:
    """A local model folder that the stages could not load, named now: missing, without safetensors weights, or
    without tokenizer files (transformers would otherwise make up an empty tokenizer from the config alone)."""
    if not folder.is_dir():
        from pipeline.modeling.pretrained import known_folder

        known = known_folder(folder)
        hint = (f"; `python -m pipeline fetch {known}` makes it (`python -m pipeline repro` does so itself)" if known
                else f" ({LOCAL_RULE})")
        raise ConfigError(f"{path}: {key}: {folder}: no such folder{hint}")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        found = sorted(p.name for p in folder.iterdir())[:8]
        hint = ("; pickled weights (.bin) are not loaded, as they can run code: convert them once with "
                "AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder)"
                if any(name.endswith((".bin", ".pt", ".pth")) for name in found) else "")
        raise ConfigError(f"{path}: {key}: {folder}: no model.safetensors (or its shards' index) in it; found "
                          f"{', '.join(found) or 'nothing'}{hint}")
    tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    if not tokenizer and not (folder / "adapter_config.json").is_file():
        raise ConfigError(f"{path}: {key}: {folder}: no tokenizer files (tokenizer.json, tokenizer_config.json); save "
                          "the tokenizer beside the weights (tokenizer.save_pretrained(folder))")


def check_models(prompt_cfg: PromptConfig, base: BaseModelConfig | None = None, teacher: TeacherSource | None = None,
                 path: Path | str = "params.yaml") -> None:
    """Every model the params load must load: its config and its tokenizer, with a pad or an EOS token to pad and
    stop with (said at validation, naming the key, rather than by the first stage that loads it). With `format:
    chat` each must carry a chat template too (the built ones get one), and an OpenAI-compatible teacher must be
    called on its chat route, where the server applies it."""
    chat = prompt_cfg.format == "chat"
    if chat and teacher is not None and teacher.backend == "openai" and teacher.api != "chat":
        raise ConfigError(f"{path}: teacher.api: prompt.format chat sends conversations; set teacher.api: chat "
                          "(the server applies its model's template)")
    from transformers import AutoConfig

    loaded = [("base.model", base.model if base is not None else None),
              ("teacher.model", teacher.model if teacher is not None and teacher.backend == "transformers" else None)]
    for key, source in loaded:
        if not source:
            continue
        source = watched(source)  # `~` expanded, as the stages load it
        if is_stage_output(source) and not Path(source).exists():
            continue  # a stage's output (models/base: self-distillation), checked by the stage that loads it
        gguf = is_gguf(source)
        if gguf and not Path(source).is_file():
            raise ConfigError(f"{path}: {key}: {source}: no such GGUF file ({LOCAL_RULE})")
        if is_local(source) and not gguf:
            _check_local_model(key, Path(source), path)
        try:
            if gguf:  # its metadata only: the weights are de-quantized by the stage that loads them
                AutoConfig.from_pretrained(str(Path(source).parent), gguf_file=Path(source).name)
            else:
                AutoConfig.from_pretrained(source)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: {key}: {source!r} is not a model folder or a Hub id found here "
                              f"(HF_HUB_OFFLINE=1 reads the local cache only): {exc}") from None
        try:
            tokenizer = load_tokenizer(source)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: {key}: cannot load the tokenizer of {source!r}: {exc}") from None
        if tokenizer.pad_token is None and tokenizer.eos_token is None:
            raise ConfigError(f"{path}: {key}: the tokenizer of {source!r} has neither a pad nor an EOS token; give it "
                              "one (tokenizer.eos_token = ..., then save_pretrained)")
        if chat and not has_template(tokenizer):
            raise ConfigError(f"{path}: {key}: {source!r} has no chat template; prompt.format chat needs one (set "
                              "prompt.format: raw, or give the tokenizer a chat_template)")
