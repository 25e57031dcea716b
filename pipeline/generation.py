"""Batched sampling with transformers' `generate`.

Prompts are sorted by length before batching so that each batch pads little,
then results are put back in the caller's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from tqdm.auto import tqdm


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
) -> list[list[Generation]]:
    """For each prompt, `num_return_sequences` completions (greedy unless do_sample)."""
    model.eval()
    tokenizer.padding_side = "left"
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[Generation]] = [[] for _ in prompts]
    eos_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="generate", unit="batch", disable=not progress):
        enc = tokenizer([prompts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                temperature=temperature if do_sample else None,
                top_p=top_p if do_sample else None,
                top_k=None,
                num_return_sequences=num_return_sequences,
                eos_token_id=eos_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        for row, ids in enumerate(new.tolist()):
            n = len(ids)
            if eos_id in ids:
                n = ids.index(eos_id) + 1
            text = tokenizer.decode(ids[:n], skip_special_tokens=True)
            results[batch[row // num_return_sequences]].append(Generation(text=text, tokens=n))
    return results


class Sampler(Protocol):
    """A sampling backend: the local model, an OpenAI-compatible endpoint, ...

    `sample` returns, for each prompt and in the caller's order, `n` completions;
    temperature 0 means greedy decoding (then n must be 1).
    """

    name: str

    def sample(
        self, prompts: Sequence[str], *, n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int
    ) -> list[list[Generation]]: ...


class LocalSampler:
    """A transformers causal LM in this process, sampled in length-sorted batches."""

    def __init__(self, model, tokenizer, batch_size: int = 64, name: str = "local") -> None:
        self.model, self.tokenizer, self.batch_size, self.name = model, tokenizer, batch_size, name

    def sample(
        self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
        max_new_tokens: int = 192, seed: int = 0,
    ) -> list[list[Generation]]:
        # batch_size counts sequences, so K samples per prompt means batch_size // K prompts per batch
        return generate(
            self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens,
            batch_size=max(1, self.batch_size // n), do_sample=temperature > 0, temperature=temperature,
            top_p=top_p, num_return_sequences=n, seed=seed,
        )
