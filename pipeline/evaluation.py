"""Grade generations against the gold chain and summarise them into metrics.

Pure functions over rows: `score` turns (example, completion) pairs into
graded records, `summarize` turns records into the metrics every model
reports (DESIGN.md, "Metrics that every version reports").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from pipeline.grading import extract_answer, grade, step_accuracy


def score(row: dict, completion: str, tokens: int) -> dict:
    """One graded generation: final-answer correctness and matched gold steps."""
    predicted = extract_answer(completion)
    gold_steps = [step["value"] for step in row["steps"]]
    matched, total = step_accuracy(completion, gold_steps)
    return {
        "id": row["id"],
        "split": row["split"],
        "answer_type": row["answer_type"],
        "task_type": row["task_type"],
        "chain_length": int(row["chain_length"]),
        "answer": row["answer"],
        "prediction": predicted,
        "correct": predicted is not None and grade(predicted, row["answer"], row["answer_type"]),
        "steps_matched": matched,
        "steps_total": total,
        "completion": completion,
        "tokens": tokens,
    }


def _accuracy(records: Sequence[dict]) -> float:
    return round(sum(r["correct"] for r in records) / len(records), 4) if records else 0.0


def accuracy_by(records: Iterable[dict], key: str) -> dict[str, float]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r[key])].append(r)
    return {k: _accuracy(v) for k, v in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))}


def summarize(records: Sequence[dict]) -> dict:
    """Accuracy overall and by answer type, task type and chain length; step accuracy; cost."""
    steps_total = sum(r["steps_total"] for r in records)
    return {
        "n": len(records),
        "accuracy": _accuracy(records),
        "step_accuracy": round(sum(r["steps_matched"] for r in records) / steps_total, 4) if steps_total else 0.0,
        "answer_line_rate": round(sum(r["prediction"] is not None for r in records) / max(len(records), 1), 4),
        "by_answer_type": accuracy_by(records, "answer_type"),
        "by_task_type": accuracy_by(records, "task_type"),
        "by_chain_length": accuracy_by(records, "chain_length"),
        "tokens_per_question": round(sum(r["tokens"] for r in records) / max(len(records), 1), 1),
    }


def majority_answers(train_rows: Iterable[dict]) -> dict[str, str]:
    """The most frequent training answer per answer type (ties: the smallest string, for determinism)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for row in train_rows:
        counts[row["answer_type"]][row["answer"].strip().lower()] += 1
    return {t: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for t, c in counts.items()}


def majority_baseline(train_rows: Iterable[dict], rows: Sequence[dict]) -> float:
    """Accuracy of answering every question with its answer type's majority training answer.

    The trivial baseline the student must beat; it even knows the answer type.
    """
    majority = majority_answers(train_rows)
    hits = sum(
        row["answer_type"] in majority and grade(majority[row["answer_type"]], row["answer"], row["answer_type"])
        for row in rows
    )
    return round(hits / len(rows), 4) if rows else 0.0
