"""Grade generations against the gold chain and summarise them into metrics.

Pure functions over rows: `score` turns (example, completion) pairs into
graded records, `summarize` turns records into the metrics every model
reports (accuracy overall and by answer type, task type and chain length; step
accuracy; tokens per question).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from pipeline.data import task as tasks
from pipeline.data.grading import lenient_correct, parse_number, step_accuracy


def score(row: dict, completion: str, tokens: int) -> dict:
    """One graded generation: final-answer correctness and matched gold steps."""
    task = tasks.active()
    predicted = task.extract(completion)
    # Gold step values exist for the chart task only; a dataset's steps are prose ("" values: nothing to match).
    gold_steps = [step["value"] for step in row["steps"] or [] if step["value"]]
    matched, total = step_accuracy(completion, gold_steps) if gold_steps else (0, 0)
    return {
        "id": row["id"],
        "split": row["split"],
        "answer_type": row["answer_type"],
        "task_type": row.get("task_type") or "all",
        "chain_length": int(row.get("chain_length") or 0),
        "answer": row["answer"],
        "prediction": predicted,
        "correct": predicted is not None and task.grade(predicted, row["answer"], row["answer_type"]),
        # the answer however it is written (the last number, yes or no, the gold word in the last line)
        "lenient": lenient_correct(completion, row["answer"], row["answer_type"]),
        "steps_matched": matched,
        "steps_total": total,
        "completion": completion,
        "tokens": tokens,
    }


def accuracy_of(records: Sequence[dict]) -> float:
    return round(sum(r["correct"] for r in records) / len(records), 4) if records else 0.0


def accuracy_by(records: Iterable[dict], key: str) -> dict[str, float]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r[key])].append(r)
    return {k: accuracy_of(v) for k, v in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))}


def summarize(records: Sequence[dict]) -> dict:
    """Accuracy overall and by answer type, task type and chain length; step accuracy; cost."""
    steps_total = sum(r["steps_total"] for r in records)
    return {
        "n": len(records),
        "accuracy": accuracy_of(records),
        "lenient_accuracy": round(sum(r.get("lenient", False) for r in records) / len(records), 4) if records else 0.0,
        # None without gold step values (a dataset task): nothing to match, not a score of zero
        "step_accuracy": round(sum(r["steps_matched"] for r in records) / steps_total, 4) if steps_total else None,
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
    grade = tasks.active().grade
    hits = sum(
        row["answer_type"] in majority and grade(majority[row["answer_type"]], row["answer"], row["answer_type"])
        for row in rows
    )
    return round(hits / len(rows), 4) if rows else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n (got k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def vote_key(answer: str, answer_type: str) -> str:
    """What majority voting counts as one answer: the number's value, or the normalised text."""
    if answer_type == "number":
        value = parse_number(answer)
        if value is not None:
            return f"{value:.6g}"
    return " ".join(answer.split()).lower().rstrip(".")


def majority_vote(predictions: Sequence[str | None], answer_type: str) -> str | None:
    """The most frequent answer among `predictions` (None: no answer line, not a vote); ties go to the first seen."""
    picked = weighted_majority(predictions, [1.0] * len(predictions), answer_type)
    return None if picked is None else predictions[picked]


def weighted_majority(answers: Sequence[str | None], weights: Sequence[float], answer_type: str) -> int | None:
    """The index of the heaviest answer's heaviest sample: each answer (compared by `vote_key`) weighs the sum of
    its samples' weights. Equal weights: the majority vote; PRM scores: the PRM-weighted vote.

    A sample without an answer (None) does not vote (None when none has one); ties go to the answer seen first,
    and within it to the first of its heaviest samples.
    """
    totals: dict[str, list] = {}  # answer key -> [summed weight, index of its heaviest sample]
    for i, (answer, w) in enumerate(zip(answers, weights, strict=True)):
        if answer is None:
            continue
        entry = totals.setdefault(vote_key(answer, answer_type), [0.0, i])
        entry[0] += w
        if w > weights[entry[1]]:
            entry[1] = i
    if not totals:
        return None
    return max(totals.values(), key=lambda e: e[0])[1]  # max keeps the first of equal totals


def sampled_metrics(rows: Sequence[dict], samples: Sequence[Sequence[str]], k: int) -> dict:
    """pass@k (unbiased, from all n >= k samples), maj@k (the first k) and the mean sampled accuracy."""
    passes, majority, mean = [], [], []
    task = tasks.active()
    extract, grade = task.extract, task.grade
    for row, texts in zip(rows, samples):
        predictions = [extract(t) for t in texts]
        correct = [p is not None and grade(p, row["answer"], row["answer_type"]) for p in predictions]
        passes.append(pass_at_k(len(correct), sum(correct), k))
        voted = majority_vote(predictions[:k], row["answer_type"])
        majority.append(voted is not None and grade(voted, row["answer"], row["answer_type"]))
        mean.append(sum(correct) / max(len(correct), 1))
    n = max(len(rows), 1)
    return {
        "k": k,
        "questions": len(rows),
        f"pass_at_{k}": round(sum(passes) / n, 4),
        f"maj_at_{k}": round(sum(majority) / n, 4),
        "sampled_accuracy": round(sum(mean) / n, 4),
    }
