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

A model the DAG builds gets `pipeline.modeling.models.BUILT_TEMPLATE` when its tokenizer is trained: role headers in
plain text (the vocabulary is the corpus's own; nothing is added to it) and the end-of-sequence token ending
each assistant turn, so generation stops where a turn ends. A loaded model brings its own template;
one without a template cannot take `format: chat` (`check_models`, at params validation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.core.io import ConfigError
from pipeline.core.params import given
from pipeline.modeling.params import PromptConfig

_override: PromptConfig | None = None
_shots: tuple[tuple[str, str], ...] = ()  # worked examples shown before every question (`with_shots`)


def active() -> PromptConfig:
    """The prompt format of this run: set by `use`, else params.yaml's `prompt` section, else raw."""
    return _override if _override is not None else given(PromptConfig)


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


def save_tokenizer(tokenizer, folder: Path, positions: int | None = None) -> None:
    """The tokenizer as other tools load it (`AutoTokenizer`, servers, evaluation harnesses): padding on the left,
    as decoder-only batches need, and the model's own length limit where the tokenizer states none (a trained
    tokenizer says 1e30)."""
    tokenizer.padding_side = tokenizer.init_kwargs["padding_side"] = "left"
    if positions and (tokenizer.model_max_length or 0) > 1e9:
        tokenizer.model_max_length = tokenizer.init_kwargs["model_max_length"] = positions
    tokenizer.save_pretrained(folder)
