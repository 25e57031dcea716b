"""Batched sampling from a causal LM with a KV cache, the `Sampler` protocol, and padding of token batches.

Prompts are sorted by length before batching so that each batch pads little,
then results are put back in the caller's order. Rows leave a batch as soon as
they emit EOS (see `decode`). `pad` and `pad_id` also serve GRPO's rollouts
(pipeline/rl/grpo.py) and the PRM's batches (pipeline/prm/model.py, pipeline/training/trainer.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from tqdm.auto import tqdm

from pipeline.core import sharding
from pipeline.data.grading import PARAGRAPH_BREAK
from pipeline.modeling import chat


@dataclass(frozen=True)
class Generation:
    text: str  # the decoded completion, without the prompt and special tokens
    tokens: int  # generated tokens, the end-of-sequence token included when emitted


def generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    num_return_sequences: int = 1,
    seed: int = 0,
    progress: bool = True,
    top_k: int = 0,
    stop_ids: Sequence[int] = (),
    stop: "BlankLineStop | None" = None,
) -> list[list[Generation]]:
    """For each prompt, `num_return_sequences` completions (greedy unless do_sample).

    `batch_size` counts sequences: a batch holds batch_size // num_return_sequences prompts.
    A completion ends at EOS, at a token of `stop_ids`, or where `stop` says (a blank line after some
    text: one paragraph); the token that ends it stays in its text.
    """
    model.eval()
    tokenizer.padding_side = "left"
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[Generation]] = [[] for _ in prompts]
    per_batch = max(1, batch_size // num_return_sequences)
    batches = [order[i : i + per_batch] for i in range(0, len(order), per_batch)]
    rng = torch.Generator().manual_seed(seed)
    for batch in tqdm(batches, desc="generate", unit="batch", disable=not progress):
        enc = tokenizer([prompts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].repeat_interleave(num_return_sequences, dim=0)
        mask = enc["attention_mask"].repeat_interleave(num_return_sequences, dim=0)
        sample = (temperature, top_p, rng, top_k) if do_sample else None
        for row, tokens in enumerate(decode(model, ids.to(model.device), mask.to(model.device), max_new_tokens,
                                            tokenizer.eos_token_id, sample, stop_ids, stop)):
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            results[batch[row // num_return_sequences]].append(Generation(text=text, tokens=len(tokens)))
    return results


def token_texts(tokenizer) -> tuple[list[int], list[str]]:
    """(every token id, its text alone), in one batched decode of the whole vocabulary.

    In Rust for a fast tokenizer: several times faster than `batch_decode` on a vocabulary of 150k tokens.
    """
    ids = sorted(tokenizer.get_vocab().values())
    singles = [[i] for i in ids]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    texts = (backend.decode_batch(singles, skip_special_tokens=False) if backend is not None
             else tokenizer.batch_decode(singles))
    return ids, texts


class BlankLineStop:
    """Ends a row at the first blank line after some text: one paragraph (`task.step_split: paragraph`).

    Line breaks may be split over tokens ("\n" then "\n") or merged into one (".\n\n", "\n\n"), so each
    token's text is read once, up front, for the newlines in its leading and trailing whitespace; a row then
    carries how many newlines it has ended with since its last visible character. Whitespace before a
    row's first visible character (a paragraph that opens with a newline) does not count.
    """

    def __init__(self, tokenizer) -> None:
        ids, texts = token_texts(tokenizer)
        # One row past the largest id stands for ids the tokenizer does not know (a model's padded vocabulary):
        # like a token without text, it neither shows nor breaks a line.
        size = max(ids, default=0) + 2
        blank, newlines, lead, tail, inner = [True] * size, [0] * size, [0] * size, [0] * size, [False] * size
        for i, text in zip(ids, texts):
            body = text.strip()
            newlines[i] = text.count("\n")
            if body:  # visible text; a special token's decoded name counts (EOS ends a row anyway)
                blank[i] = False
                lead[i] = text[: len(text) - len(text.lstrip())].count("\n")
                tail[i] = text[len(text.rstrip()):].count("\n")
                inner[i] = PARAGRAPH_BREAK.search(body) is not None
        self.blank = torch.tensor(blank)  # whitespace only, or no text
        self.newlines = torch.tensor(newlines)  # all of a whitespace token's newlines
        self.lead = torch.tensor(lead)  # newlines before a token's first visible character
        self.tail = torch.tensor(tail)  # newlines after its last one
        self.inner = torch.tensor(inner)  # a blank line between two visible characters

    def tracker(self, rows: int, device) -> "_BlankLineTracker":
        return _BlankLineTracker(self, rows, device)


class _BlankLineTracker:
    """The newline runs of one batch's rows; `step` reads their next tokens, `keep` follows the rows left."""

    def __init__(self, rule: BlankLineStop, rows: int, device) -> None:
        self.tables = [t.to(device) for t in (rule.blank, rule.newlines, rule.lead, rule.tail, rule.inner)]
        self.run = torch.zeros(rows, dtype=torch.long, device=device)  # newlines since the last visible character
        self.started = torch.zeros(rows, dtype=torch.bool, device=device)  # a visible character seen

    def step(self, next_ids: torch.Tensor) -> torch.Tensor:
        """Which rows end with this token."""
        blank, newlines, lead, tail, inner = self.tables
        ids = next_ids.clamp(max=len(blank) - 1)  # the last row: ids the tokenizer does not know
        is_blank = blank[ids]
        spaced = torch.where(self.started, self.run + newlines[ids], 0)
        ends = torch.where(is_blank, spaced >= 2,
                           (self.started & (self.run + lead[ids] >= 2)) | inner[ids] | (tail[ids] >= 2))
        self.run = torch.where(is_blank, spaced, tail[ids])
        self.started = self.started | ~is_blank
        return ends

    def keep(self, rows: torch.Tensor) -> None:
        self.run, self.started = self.run[rows], self.started[rows]


def pad_id(tokenizer) -> int:
    """The id that pads a batch: the pad token, or EOS for a tokenizer without one (masked out either way)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def pad(sequences: Sequence[Sequence[int]], fill: int, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of token sequences padded to the longest, on the right or on the left."""
    width = max((len(seq) for seq in sequences), default=0)
    ids = torch.full((len(sequences), width), fill, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            span = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[row, span], mask[row, span] = torch.tensor(list(seq)), 1
    return ids, mask


def decode(
    model, input_ids, attention_mask, max_new_tokens: int, eos_id: int, sample=None, stop_ids: Sequence[int] = (),
    stop: BlankLineStop | None = None,
) -> list[list[int]]:
    """Token ids generated for each row (up to and including EOS or a stop token), with a KV cache.

    Unlike `model.generate`, a row that has emitted EOS leaves the batch (its cache
    rows are dropped), so a batch does not keep paying for finished sequences
    while its longest one runs on (the gain in tokens/s: bench/teacher_sampling.py,
    BENCHMARKS.md). `sample` is (temperature, top_p, torch.Generator, top_k)
    (top_k 0: no top-k cut), or None for greedy decoding.
    `stop_ids` end a row like EOS does (the newline token: one reasoning step at a time); so does
    `stop` at a blank line (one paragraph at a time). With FSDP over several ranks (`sharding.lockstep`) the
    loop runs until every rank's rows are done, a rank whose rows are done feeding one stand-in row.
    """
    with sharding.inference(model):
        return _decode(model, input_ids, attention_mask, max_new_tokens, eos_id, sample, stop_ids, stop)


def _decode(model, input_ids, attention_mask, max_new_tokens, eos_id, sample, stop_ids, stop) -> list[list[int]]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    # transformers 5.x renames `past_key_values` to `cache` (the old name warns, then goes in 5.40)
    cache_kw = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=True, logits_to_keep=1, **cache_kw).logits[:, -1, :]
    alive = torch.arange(input_ids.shape[0])
    finish = torch.tensor([eos_id, *stop_ids], device=input_ids.device)
    blank_lines = stop.tracker(input_ids.shape[0], input_ids.device) if stop is not None else None
    synced = sharding.lockstep(model)  # FSDP over several ranks: every forward pass is a collective
    out: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    for step in range(max_new_tokens):
        next_ids = _pick(logits, sample)
        for row, token in zip(alive.tolist(), next_ids.tolist()):
            if row >= 0:  # not a stand-in (below)
                out[row].append(token)
        if step == max_new_tokens - 1:
            break
        running = ~torch.isin(next_ids, finish)
        if blank_lines is not None:
            running &= ~blank_lines.step(next_ids)
        if synced:
            running &= (alive >= 0).to(running.device)
            if not sharding.any_rank(bool(running.any()), running.device):
                break  # every rank's rows are done
        if not running.all():
            keep = running.nonzero().squeeze(1)
            stand_in = keep.numel() == 0
            if stand_in and not synced:
                break
            if stand_in:  # this rank's rows are done, another's are not: one row's forward passes keep pace
                keep = keep.new_zeros(1)
            alive, next_ids, attention_mask = alive[keep.cpu()], next_ids[keep], attention_mask[keep]
            if stand_in:
                alive = torch.full_like(alive, -1)
            cache.batch_select_indices(keep)
            if blank_lines is not None:
                blank_lines.keep(keep)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(alive), 1)], dim=1)
        position_ids = attention_mask.sum(-1, keepdim=True) - 1
        logits = model(input_ids=next_ids[:, None], attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=True, **cache_kw).logits[:, -1, :]
    return out


def _pick(logits: torch.Tensor, sample) -> torch.Tensor:
    """Greedy argmax, or temperature + top-k + nucleus (top-p) sampling from the given generator."""
    if sample is None:
        return logits.argmax(-1)
    temperature, top_p, rng, top_k = sample
    logits = logits.float()
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens ranked above it already cover top_p
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, sorted_ids, sorted_probs)
    return torch.multinomial(probs.cpu(), 1, generator=rng).squeeze(1).to(logits.device)


class Sampler(Protocol):
    """A sampling backend: the local model, an OpenAI-compatible endpoint, ...

    `sample` returns, for each prompt and in the caller's order, `n` completions;
    temperature 0 means greedy decoding (then n must be 1). `local`: the weights are in this process, as
    `.model` and `.tokenizer` (step-level search samples them one step at a time; the PRM's tokenizer is
    checked against that one).
    """

    name: str
    local: bool

    def sample(
        self, prompts: Sequence[str], *, n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int
    ) -> list[list[Generation]]: ...


class LocalSampler:
    """A transformers causal LM in this process, sampled in length-sorted batches."""

    local = True

    def __init__(self, model, tokenizer, batch_size: int = 64, name: str = "local") -> None:
        self.model, self.tokenizer, self.batch_size, self.name = model, tokenizer, batch_size, name

    def sample(
        self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
        max_new_tokens: int = 192, seed: int = 0,
    ) -> list[list[Generation]]:
        return generate(
            self.model, self.tokenizer, [chat.render(self.tokenizer, p) for p in prompts],
            max_new_tokens=max_new_tokens, batch_size=self.batch_size, do_sample=temperature > 0,
            temperature=temperature, top_p=top_p, num_return_sequences=n, seed=seed,
        )
