"""An example custom reward; enable it with

    rewards:
      custom:
        brevity: {function: "rewards.example:brevity", weight: 0.1}

A reward takes TRL's arguments (the prompts, the completions, and the dataset's columns such as
`answer` and `answer_type` as lists, one entry per completion) and returns one float per
completion, or None where it cannot judge (left out of the weighted sum).
"""

from __future__ import annotations

from pipeline.rl.rewards import completion_text

# Completions longer than this many words get no brevity credit.
BREVITY_WORDS = 60


def brevity(prompts=None, completions=None, **columns) -> list[float]:
    """1 for an empty completion, falling linearly to 0 at BREVITY_WORDS words and beyond."""
    return [max(0.0, 1.0 - len(completion_text(c).split()) / BREVITY_WORDS) for c in completions or []]
