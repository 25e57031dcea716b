"""Step labels by Monte-Carlo rollouts, for tasks without gold step values (Math-Shepherd, PROPA).

A step's label is the share of completions, sampled from the policy after the path up to and
including that step, whose final answer is right: an estimate of the probability that the step
still leads to the right answer. The last step of a path is labelled by the path itself (it holds
the answer), so it costs no rollouts. Rollouts for every step of every path go to the sampler
together, which batches them.

    sample = policy_sampler(model, tokenizer, max_new_tokens=128, temperature=0.8)
    labels = monte_carlo_labels(prompts, paths, sample, reward, rollouts=4)
    # labels[i][k]: share of 4 rollouts after paths[i][: k + 1] that reach the right answer

`reward(i, completion)` grades a whole completion of prompt i (1.0 right, 0.0 wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipeline.generation import generate

Sample = Callable[[Sequence[str], int], list[list[str]]]  # (prefixes, n) -> n continuations of each
Reward = Callable[[int, str], float]


def step_prefix(prompt: str, steps: Sequence[str], k: int) -> str:
    """The prompt and steps 0..k, each step on its own line, ready for the next step."""
    return prompt + "".join(step + "\n" for step in steps[: k + 1])


def monte_carlo_labels(prompts: Sequence[str], paths: Sequence[Sequence[str]], sample: Sample, reward: Reward,
                       rollouts: int) -> list[list[float]]:
    """Per path, per step: the share of `rollouts` completions from that step on that `reward` scores 1."""
    if rollouts < 1:
        raise ValueError(f"rollouts must be >= 1, got {rollouts}")
    jobs = [(i, k) for i, steps in enumerate(paths) for k in range(len(steps) - 1)]
    continuations = sample([step_prefix(prompts[i], paths[i], k) for i, k in jobs], rollouts) if jobs else []
    labels = [[0.0] * len(steps) for steps in paths]
    for (i, k), rests in zip(jobs, continuations):
        done = "".join(step + "\n" for step in paths[i][: k + 1])
        labels[i][k] = sum(reward(i, done + rest) >= 1.0 for rest in rests) / len(rests)
    for i, steps in enumerate(paths):
        if steps:
            labels[i][-1] = float(reward(i, "\n".join(steps)) >= 1.0)
    return labels


def policy_sampler(model, tokenizer, *, max_new_tokens: int, temperature: float = 0.8, top_p: float = 1.0,
                   batch_size: int = 512, seed: int = 0) -> Sample:
    """A `Sample` from a local causal LM: sampled completions of each prefix, to EOS or the token limit."""
    calls = 0

    def sample(prefixes: Sequence[str], n: int) -> list[list[str]]:
        nonlocal calls
        calls += 1
        gens = generate(model, tokenizer, list(prefixes), max_new_tokens=max_new_tokens, batch_size=batch_size,
                        do_sample=True, temperature=temperature, top_p=top_p, num_return_sequences=n,
                        seed=seed * 1_000_003 + calls, progress=False)
        return [[g.text for g in per_prefix] for per_prefix in gens]

    return sample
