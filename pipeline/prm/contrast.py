"""Contrast paths for the PRM: a gold chain cut at a choice step, once with its own choice and once with a wrong one.

    rows = contrast_rows(chains, per_step=3, rng=random.Random(0))  # chains: data/prm_data/chains.parquet rows

Why: among one question's samples the policy's wrong paths mostly differ from
its right ones in a single choice made over the list the step before wrote
("Select all bars: Norway 4, Egypt 13, Japan 14." then "The largest of them is
Egypt 13."), and the PRM trained on the policy's own samples scored both
choices alike (docs/experiments/prm-contrast-paths.md). Those choices are few in the samples
and their labels are blurred by earlier errors; here every choice step of
every gold chain gives a clean pair that differs in that choice alone, as
perturbed-step negatives do in verifier training. The wrong choice is always
one the list allows (another listed object with its own value, another subset,
the other Yes/No, a count one off), so the PRM must compare, not spot a
misread value.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from itertools import combinations

from pipeline.data import task as tasks
from pipeline.data.cof.verbalize import STEPS
from pipeline.data.grading import step_value

# One object of the list a step wrote, "Norway 4" (a key of one or more words, then its value).
ITEM = re.compile(r"^(?P<key>.+?) (?P<value>-?\d+(?:\.\d+)?)$")
ONE = ("max_one_object", "min_one_object", "second_max", "second_min")
SUBSET = ("top_k", "bottom_k", "larger_than", "smaller_than", "leftmost_k", "rightmost_k", "exclude_by_legend",
          "exclude_object")
YES_NO = ("consistently_increasing", "consistently_decreasing", "all_same_value")
COUNT = ("count_objects", "number_of_colours", "number_of_legends")
CHOICES = ONE + SUBSET + YES_NO + COUNT


def _pattern(text: str) -> re.Pattern:
    """A template as a regex, every slot matched loosely."""
    return re.compile("^" + "".join(".+?" if p.startswith("{") else re.escape(p)
                                    for p in re.split(r"(\{[^}]*\})", text)) + "$")


# Templates that open with a slot ("{a} - {b} = {v}.") match almost any line: they count as arithmetic.
TEMPLATES = {kind: _pattern(text) for kind, text in STEPS.items() if not text.startswith("{")}


def step_kind(line: str) -> str:
    """The rationale template a line was written from ("The largest of them is {v}." -> max_one_object),
    "answer" for the `Answer:` line, "arithmetic/other" for the rest."""
    if tasks.active().is_terminal(line):
        return "answer"
    body = re.sub(r"^Step \d+:\s*", "", line.strip())
    return next((kind for kind, pattern in TEMPLATES.items() if pattern.match(body)), "arithmetic/other")


def listed(line: str) -> list[str]:
    """The objects a step's value lists ("Select all bars: Norway 4, Egypt 13." -> ["Norway 4", "Egypt 13"]);
    empty when its value is not such a list."""
    items = [item.strip() for item in (step_value(line) or "").split(",")]
    return items if all(ITEM.match(item) for item in items) else []


def _numbers(items: Sequence[str]) -> list[float]:
    return sorted(float(ITEM.match(item).group("value")) for item in items)


def wrong_choices(previous: str, line: str, rng: random.Random, limit: int) -> list[str]:
    """Up to `limit` values the step could have chosen and did not, each surely wrong.

    A choice among listed objects must differ in value, not only in name: with two
    objects of equal value either is right. Subsets are drawn at the right size and one
    larger or smaller.
    """
    return _wrong(step_kind(line), step_value(line), previous, rng, limit)


def _wrong(kind: str, value: str | None, previous: str, rng: random.Random, limit: int) -> list[str]:
    if kind not in CHOICES or not value:
        return []
    if kind in YES_NO:
        return {"Yes": ["No"], "No": ["Yes"]}.get(value, [])[:limit]
    if kind in COUNT:
        if not value.isdigit():
            return []
        wrong = [str(int(value) + d) for d in (-1, 1) if int(value) + d >= 0]
        return rng.sample(wrong, min(limit, len(wrong)))
    pool = listed(previous)
    if kind in ONE:
        if not ITEM.match(value):
            return []
        right = _numbers([value])
        wrong = [item for item in pool if _numbers([item]) != right]
        return rng.sample(wrong, min(limit, len(wrong)))
    chosen = [item.strip() for item in value.split(",")]
    if not pool or not all(ITEM.match(item) for item in chosen):
        return []
    subsets = [list(c) for size in {len(chosen) - 1, len(chosen), len(chosen) + 1} if 0 < size <= len(pool)
               for c in combinations(pool, size)]
    wrong = [", ".join(s) for s in subsets if _numbers(s) != _numbers(chosen)]
    return rng.sample(wrong, min(limit, len(wrong)))


def contrast_rows(chains: Sequence[dict], per_step: int, rng: random.Random) -> list[dict]:
    """Step-label rows (source `contrast`) from gold chains: for each choice step k of a chain, the chain cut
    after step k (every line 1) and up to `per_step` copies whose step k makes a wrong choice (that line 0)."""
    rows = []
    for chain in chains:
        steps = list(chain["steps"])
        for k in range(1, len(steps)):
            line = steps[k].strip()
            value = step_value(line)  # the line ends with it, and a "." after it
            wrong = _wrong(step_kind(line), value, steps[k - 1], rng, per_step)
            if not wrong:
                continue
            head, tail = line[: line.rstrip(".").rfind(value)], line[len(line.rstrip(".")):]
            base = {"id": chain["id"], "prompt": chain["prompt"], "source": "contrast",
                    "task_type": chain.get("task_type")}
            rows.append({**base, "steps": steps[: k + 1], "labels": [1.0] * (k + 1)})
            rows += [{**base, "steps": steps[:k] + [head + w + tail], "labels": [1.0] * k + [0.0]} for w in wrong]
    return rows
