"""How a question reaches the model (`prompt` params): its own text, or the tokenizer's chat template.

    from pipeline import chat
    text = chat.render(tokenizer, row["prompt"])     # what the model reads before its completion
    example = chat.example(row["prompt"], target)     # a TRL prompt-completion example in the same format

With `format: raw` the question text is the model's input and the completion follows it (the
default's tiny model). With `format: chat` the question is a user message, after `system` when it is
set, rendered by `tokenizer.apply_chat_template(..., add_generation_prompt=True)`; TRL's trainers get
conversational examples and render them with the same template, so what a model trains on and what it
is sampled from agree. Every sampler, step search, PRM encoding and trainer calls this module, so the
format is one switch.

A model the DAG builds gets `pipeline.models.BUILT_TEMPLATE` when its tokenizer is trained: role headers in plain
text (the vocabulary is the corpus's own; nothing is added to it) and the end-of-sequence token ending
each assistant turn, so generation stops where a turn ends. A loaded model brings its own template;
one without a template cannot take `format: chat` (`check_models`, at params validation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.config import (LOCAL_RULE, BaseModelConfig, ConfigError, PromptConfig, TeacherConfig, active_section,
                             is_local, is_stage_output, watched)

_override: PromptConfig | None = None
_shots: tuple[tuple[str, str], ...] = ()  # worked examples shown before every question (`with_shots`)


def active() -> PromptConfig:
    """The prompt format of this run: set by `use`, else params.yaml's `prompt` section, else raw."""
    return _override if _override is not None else active_section("prompt")  # type: ignore[return-value]


def use(cfg: PromptConfig | None) -> None:
    """Make `cfg` the active format (None: back to params.yaml); tests call this."""
    global _override
    _override = cfg


def is_chat() -> bool:
    return active().format == "chat"


@contextlib.contextmanager
def with_shots(pairs: Sequence[tuple[str, str]]) -> Iterator[None]:
    """Inside this block every question is asked after these worked examples (question, answer): few-shot
    prompting, as STaR samples its rationales (`distill.shots`). Raw: each example's text and a blank line before
    the question; chat: each a user and an assistant turn before the question's."""
    global _shots
    saved, _shots = _shots, tuple(pairs)
    try:
        yield
    finally:
        _shots = saved


def shots() -> tuple[tuple[str, str], ...]:
    """The worked examples every question is asked after now (`with_shots`; none outside it)."""
    return _shots


def messages(prompt: str) -> list[dict]:
    """The conversation that asks `prompt`: the system message when there is one, the worked examples
    (`with_shots`), then the user's question."""
    system = active().system
    examples = [{"role": role, "content": text} for q, a in _shots for role, text in (("user", q), ("assistant", a))]
    return (([{"role": "system", "content": system}] if system else []) + examples
            + [{"role": "user", "content": prompt}])


def render(tokenizer, prompt: str) -> str:
    """The text the model reads before its completion: `prompt` itself (after the worked examples of `with_shots`),
    or its conversation templated."""
    if not is_chat():
        return "".join(f"{q}{a}\n\n" for q, a in _shots) + prompt
    return render_messages(tokenizer, messages(prompt))


def render_messages(tokenizer, conversation: Sequence[dict]) -> str:
    """A conversation rendered by the tokenizer's template, ending where the assistant's answer starts."""
    require_template(tokenizer)
    return tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)


def question(prompt: str | Sequence[dict]) -> str:
    """The question of a prompt in either format (a conversation's last user message)."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    if not users:
        raise ValueError("a conversational prompt without a user message")
    return users[-1]


def prompt(text: str) -> str | list[dict]:
    """A TRL dataset's `prompt` value: the text (raw) or its conversation (chat)."""
    return messages(text) if is_chat() else text


def completion(text: str) -> str | list[dict]:
    """A TRL dataset's `completion` (or `chosen`, `rejected`) value: the text, or an assistant message."""
    return [{"role": "assistant", "content": text}] if is_chat() else text


def example(prompt_text: str, completion_text: str) -> dict:
    """One TRL prompt-completion example in the active format."""
    return {"prompt": prompt(prompt_text), "completion": completion(completion_text)}


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def require_template(tokenizer, source: object = None) -> None:
    if not has_template(tokenizer):
        where = f"{source}: " if source is not None else ""
        raise ConfigError(f"{where}the tokenizer has no chat template; prompt.format chat needs one (use format raw, "
                          "or a model whose tokenizer carries a chat_template: chat_template.jinja or "
                          "tokenizer_config.json)")


# A loadable model folder's weights: one safetensors file, its shards' index, or a LoRA adapter on a base
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_config.json")
# A tokenizer's definition: tokenizer_config.json alone is not one (transformers builds an empty tokenizer from it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def _check_local_model(key: str, folder: Path, path: Path | str) -> None:
    """A local model folder that the stages could not load, named now: missing, without safetensors weights, or
    without tokenizer files (transformers would otherwise make up an empty tokenizer from the config alone)."""
    if not folder.is_dir():
        from pipeline.pretrained import known_folder

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


def check_models(prompt_cfg: PromptConfig, base: BaseModelConfig | None = None, teacher: TeacherConfig | None = None,
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

    from pipeline.models import is_gguf, load_tokenizer

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
