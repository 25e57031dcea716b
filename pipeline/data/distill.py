"""Rejection sampling of teacher traces: verify, grade difficulty, dedup, decontaminate.

Pure functions over rows and sampled texts (no model here), so every rule is
unit-tested on hand-written completions:

- a trace is *verified* when its final answer is right and, where it writes
  ``Step k:`` lines, at least `min_step_accuracy` of the gold step values match;
- a question's pass rate is verified / K: its difficulty for this teacher;
- per question, up to M verified traces are kept, skipping exact and near
  duplicates (word-trigram Jaccard) of traces already kept;
- a question, or a trace, sharing a word n-gram with any val/test/ood question
  is removed (open-r1 uses 8-grams);
- a question with a verified and a failed trace gives a preference pair.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from pipeline.data import task as tasks
from pipeline.data.grading import extract_steps, step_accuracy
from pipeline.core.io import EXAMPLE_SCHEMA


class Sample(Protocol):
    """What selection reads of a teacher's sample (`pipeline.inference.generation.Generation`): its text. Sampling
    is the caller's: data sits below inference."""

    text: str


_WORD = re.compile(r"\w+|[^\w\s]")

DISTILLED_SCHEMA = EXAMPLE_SCHEMA.append(pa.field("pass_rate", pa.float64()))
PAIR_SCHEMA = pa.schema(
    [("id", pa.string()), ("prompt", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()),
     ("source", pa.string())]
)
PASS_RATE_SCHEMA = pa.schema(
    [("id", pa.string()), ("task_type", pa.string()), ("chain_length", pa.int64()), ("k", pa.int64()),
     ("correct", pa.int64()), ("pass_rate", pa.float64())]
)


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks: the unit of n-grams."""
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def eval_ngrams(rows: Iterable[dict], n: int) -> set[tuple[str, ...]]:
    """Every word n-gram of the evaluation questions (val, test, ood)."""
    out: set[tuple[str, ...]] = set()
    for row in rows:
        out |= ngrams(row["question"], n)
    return out


def contaminated(text: str, index: set[tuple[str, ...]], n: int) -> bool:
    return not index.isdisjoint(ngrams(text, n))


def jaccard(a: str, b: str, n: int = 3) -> float:
    """Similarity of two texts as sets of word n-grams (1.0 for identical texts)."""
    sa, sb = ngrams(a, n) or {tuple(words(a))}, ngrams(b, n) or {tuple(words(b))}
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def is_verified(row: dict, text: str, min_step_accuracy: float) -> bool:
    """Right final answer and, if the trace writes steps, enough right step values."""
    if not tasks.active().is_correct(text, row["answer"], row["answer_type"]):
        return False
    gold = [step["value"] for step in row["steps"] or [] if step["value"]]  # a dataset's steps have no values
    if not extract_steps(text) or not gold:
        return True  # no step lines to check (e.g. a free-form API teacher): the answer decides
    matched, total = step_accuracy(text, gold)
    return matched / total >= min_step_accuracy


@dataclass
class QuestionResult:
    """One question's samples after verification and selection."""

    row: dict
    pass_rate: float
    correct: int
    kept: list[str]  # verified, deduplicated, at most M
    failed: list[str]  # unverified traces
    removed: Counter = field(default_factory=Counter)  # trace removals by reason


def select(
    row: dict,
    samples: Sequence[Sample],
    *,
    max_traces: int,
    min_step_accuracy: float,
    near_duplicate_threshold: float,
    contamination: set[tuple[str, ...]] | None = None,
    n: int = 8,
) -> QuestionResult:
    """Verify the K samples of one question and keep up to `max_traces` distinct correct ones."""
    removed: Counter = Counter()
    kept: list[str] = []
    failed: list[str] = []
    correct = 0
    for sample in samples:
        text = sample.text.strip()
        if not is_verified(row, text, min_step_accuracy):
            failed.append(text)
            removed["incorrect"] += 1
            continue
        correct += 1
        if any(" ".join(text.split()) == " ".join(k.split()) for k in kept):
            removed["exact_duplicate"] += 1
        elif any(jaccard(text, k) >= near_duplicate_threshold for k in kept):
            removed["near_duplicate"] += 1
        elif contamination is not None and contaminated(text, contamination, n):
            removed["contaminated_trace"] += 1
        elif len(kept) >= max_traces:
            removed["over_max_traces"] += 1
        else:
            kept.append(text)
    return QuestionResult(row, correct / len(samples) if samples else 0.0, correct, kept, failed, removed)


def in_window(pass_rate: float, low: float, high: float) -> bool:
    return low - 1e-9 <= pass_rate <= high + 1e-9


def histogram(results: Sequence[QuestionResult], k: int) -> dict[str, int]:
    """Questions per pass rate (correct/K), every bucket present, keys like "0.25"."""
    counts = Counter(r.correct for r in results)
    return {f"{c / k:.3g}": counts.get(c, 0) for c in range(k + 1)}


def outputs(results: Sequence[QuestionResult], k: int, window: tuple[float, float]):
    """(verified rows, hard rows, preference pairs, pass-rate rows) from the selected results."""
    verified, hard, pairs, rates = [], [], [], []
    for res in results:
        traces = [{**res.row, "rationale": t, "pass_rate": res.pass_rate} for t in res.kept]
        verified += traces
        if in_window(res.pass_rate, *window):
            hard += traces
        if res.kept and res.failed:
            pairs.append({"id": res.row["id"], "prompt": res.row["prompt"], "chosen": res.kept[0],
                          "rejected": res.failed[0], "source": "teacher"})
        rates.append({"id": res.row["id"], "task_type": res.row["task_type"],
                      "chain_length": int(res.row.get("chain_length") or 0), "k": k, "correct": res.correct,
                      "pass_rate": res.pass_rate})
    return verified, hard, pairs, rates
