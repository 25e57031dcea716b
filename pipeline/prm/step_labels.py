"""Step labels by Monte-Carlo rollouts, for tasks without gold step values (Math-Shepherd, PROPA).

A step's label is the share of completions, sampled from the policy after the path up to and
including that step, whose final answer is right: an estimate of the probability that the step
still leads to the right answer. The last step of a path is labelled by the path itself (it holds
the answer), so it costs no rollouts. Rollouts for every step of every path go to the sampler
together, which batches them.

    policy = StepPolicy(model, tokenizer, completion_tokens=128, temperature=0.8)
    labels = monte_carlo_labels(prompts, paths, policy.sample, reward, rollouts=4)
    # labels[i][k]: share of 4 rollouts after paths[i][: k + 1] that reach the right answer

`reward(i, completion)` grades a whole completion of prompt i (1.0 right, 0.0 wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Sample = Callable[[Sequence[str], int], list[list[str]]]  # (prefixes, n) -> n continuations of each
Reward = Callable[[int, str], float]


def step_prefix(prompt: str, steps: Sequence[str], k: int, step_break: str = "\n") -> str:
    """The prompt and steps 0..k, each ended by `step_break` (a line's newline, a paragraph's blank line)."""
    return prompt + "".join(step + step_break for step in steps[: k + 1])


def monte_carlo_labels(prompts: Sequence[str], paths: Sequence[Sequence[str]], sample: Sample, reward: Reward,
                       rollouts: int, step_break: str = "\n") -> list[list[float]]:
    """Per path, per step: the share of `rollouts` completions from that step on that `reward` scores 1."""
    if rollouts < 1:
        raise ValueError(f"rollouts must be >= 1, got {rollouts}")
    jobs = [(i, k) for i, steps in enumerate(paths) for k in range(len(steps) - 1)]
    continuations = (sample([step_prefix(prompts[i], paths[i], k, step_break) for i, k in jobs], rollouts)
                     if jobs else [])
    labels = [[0.0] * len(steps) for steps in paths]
    for (i, k), rests in zip(jobs, continuations):
        done = "".join(step + step_break for step in paths[i][: k + 1])
        labels[i][k] = sum(reward(i, done + rest) >= 1.0 for rest in rests) / len(rests)
    for i, steps in enumerate(paths):
        if steps:
            labels[i][-1] = float(reward(i, step_break.join(steps)) >= 1.0)
    return labels
