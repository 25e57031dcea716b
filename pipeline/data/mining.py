"""Hard-case mining (HCM-GRPO): which prompts the RL stage should see, and how often.

The SFT policy samples G rollouts per prompt of the RL pool; a prompt's pass
rate is its share of correct final answers. Prompts fall in four buckets:

- ``unsolved``: no rollout right. GRPO gets no signal from such a group unless
  guided replay puts the gold rationale into it;
- ``hard``: pass rate inside the configured window: mixed groups, the most
  informative for GRPO, oversampled;
- ``easy``: above the window, not always solved;
- ``solved``: every rollout right: zero advantage for every sample, excluded by default.

Each bucket has a repeat count in params (0 excludes it). Prompts with a right
and a wrong rollout also give an on-policy preference pair for DPO.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pyarrow as pa

from pipeline.data.params import MineConfig
from pipeline.data.distill import QuestionResult, in_window

BUCKETS = ("unsolved", "hard", "easy", "solved")

# The GRPO dataset: the prompt, the gold the rewards check, and why the prompt is there.
RL_SCHEMA = pa.schema(
    [("id", pa.string()), ("prompt", pa.string()), ("answer", pa.string()), ("answer_type", pa.string()),
     ("step_values", pa.list_(pa.string())), ("rationale", pa.string()), ("task_type", pa.string()),
     ("chain_length", pa.int64()), ("pass_rate", pa.float64()), ("bucket", pa.string())]
)


def bucket(pass_rate: float, cfg: MineConfig) -> str:
    if pass_rate <= 0.0:
        return "unsolved"
    if pass_rate >= 1.0:
        return "solved"
    return "hard" if in_window(pass_rate, cfg.hard_min_pass_rate, cfg.hard_max_pass_rate) else "easy"


def repeats(name: str, cfg: MineConfig) -> int:
    return {"unsolved": cfg.repeat_unsolved, "hard": cfg.repeat_hard, "easy": cfg.repeat_easy,
            "solved": cfg.repeat_solved}[name]


def rl_row(res: QuestionResult, name: str) -> dict:
    row = res.row
    return {
        "id": row["id"], "prompt": row["prompt"], "answer": row["answer"], "answer_type": row["answer_type"],
        # A dataset's steps are prose without values: no step_values, so the step rewards leave its rows out.
        "step_values": [step["value"] for step in row["steps"] or [] if step["value"]], "rationale": row["rationale"],
        "task_type": row.get("task_type"), "chain_length": int(row.get("chain_length") or 0),
        "pass_rate": res.pass_rate, "bucket": name,
    }


def rl_set(results: Sequence[QuestionResult], cfg: MineConfig) -> tuple[list[dict], Counter, list[dict]]:
    """(the oversampled, shuffled RL rows; prompts per bucket; one row per pool prompt with its bucket)."""
    rows, pool, counts = [], [], Counter({name: 0 for name in BUCKETS})
    for res in results:
        name = bucket(res.pass_rate, cfg)
        counts[name] += 1
        row = rl_row(res, name)
        pool.append(row)
        rows += [row] * repeats(name, cfg)
    random.Random(cfg.seed).shuffle(rows)  # copies of one prompt should not sit in one batch
    return rows, counts, pool


def policy_pairs(results: Sequence[QuestionResult], max_pairs: int) -> list[dict]:
    """Correct vs incorrect rollout of one prompt (distinct texts), up to `max_pairs` per prompt."""
    pairs = []
    for res in results:
        rejected = list(dict.fromkeys(res.failed))  # distinct, in sampling order
        for chosen, wrong in list(zip(res.kept, rejected))[:max_pairs]:
            pairs.append({"id": res.row["id"], "prompt": res.row["prompt"], "chosen": chosen, "rejected": wrong,
                          "source": "policy"})
    return pairs
