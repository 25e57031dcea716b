"""Rejection sampling rules on hand-written completions, with hand-checked pass rates."""

from __future__ import annotations

import pytest

from pipeline.data.distill import (
    contaminated,
    eval_ngrams,
    histogram,
    in_window,
    is_verified,
    jaccard,
    ngrams,
    outputs,
    select,
)
from pipeline.inference.generation import Generation

ROW = {
    "id": "q1", "prompt": "Chart: bar.\nJan: 15 | Apr: 6\nQuestion: How much larger is Jan than Apr?\n",
    "question": "How much larger is Jan than Apr?", "answer": "9", "answer_type": "number",
    "task_type": "arithmetic", "chain_length": 3,
    "steps": [{"function": "f", "text": "", "value": "15"}, {"function": "g", "text": "", "value": "6"},
              {"function": "h", "text": "", "value": "9"}],
}
GOOD = "Step 1: The value of Jan is 15.\nStep 2: The value of Apr is 6.\nStep 3: 15 - 6 = 9.\nAnswer: 9"
GOOD_SPACED = "Step 1: The value of Jan is 15.\n\nStep 2: The value of Apr  is 6.\nStep 3: 15 - 6 = 9.\nAnswer: 9"
WRONG_STEP = "Step 1: The value of Jan is 15.\nStep 2: The value of Apr is 7.\nStep 3: 15 - 6 = 9.\nAnswer: 9"
NO_STEPS = "Jan minus Apr gives nine.\nAnswer: 9"
WRONG = "Step 1: The value of Jan is 15.\nStep 2: The value of Apr is 5.\nStep 3: 15 - 5 = 10.\nAnswer: 10"


def gens(*texts: str) -> list[Generation]:
    return [Generation(text=t, tokens=len(t.split())) for t in texts]


@pytest.mark.parametrize(
    ("text", "min_steps", "expected"),
    [
        (GOOD, 1.0, True),
        (WRONG_STEP, 1.0, False),  # right answer, 2 of 3 steps: rejected at the default bar
        (WRONG_STEP, 0.6, True),  # ... accepted when 2/3 is enough
        (NO_STEPS, 1.0, True),  # no Step lines: the final answer decides
        (WRONG, 1.0, False),
        ("", 1.0, False),
        ("Step 1: garbage\n" * 50, 0.0, False),  # no answer line
        ("Answer: 9.0", 1.0, True),  # numbers within tolerance
    ],
)
def test_is_verified(text, min_steps, expected):
    assert is_verified(ROW, text, min_steps) is expected


def test_select_pass_rate_dedup_and_cap():
    samples = gens(GOOD, GOOD_SPACED, WRONG_STEP, NO_STEPS, WRONG, "")
    res = select(ROW, samples, max_traces=2, min_step_accuracy=1.0, near_duplicate_threshold=0.9)
    # verified: GOOD, GOOD_SPACED (same text up to whitespace), NO_STEPS -> 3 of 6
    assert res.correct == 3 and res.pass_rate == pytest.approx(0.5)
    assert res.kept == [GOOD, NO_STEPS]
    assert res.removed == {"incorrect": 3, "exact_duplicate": 1}
    assert len(res.failed) == 3

    capped = select(ROW, samples, max_traces=1, min_step_accuracy=1.0, near_duplicate_threshold=0.9)
    assert capped.kept == [GOOD] and capped.removed["over_max_traces"] == 1


def test_near_duplicates_are_dropped_by_threshold():
    # WRONG_STEP differs from GOOD in one value: 2 of 3 steps is enough here, so both verify.
    sim = jaccard(GOOD, WRONG_STEP)
    assert 0.5 < sim < 1.0
    loose = select(ROW, gens(GOOD, WRONG_STEP), max_traces=2, min_step_accuracy=0.6,
                   near_duplicate_threshold=sim - 0.01)
    assert loose.kept == [GOOD] and loose.removed == {"near_duplicate": 1}
    strict = select(ROW, gens(GOOD, WRONG_STEP), max_traces=2, min_step_accuracy=0.6,
                    near_duplicate_threshold=sim + 0.01)
    assert strict.kept == [GOOD, WRONG_STEP]


def test_jaccard_hand_computed():
    assert jaccard("a b c d", "a b c d") == 1.0
    # trigrams {abc, bcd} vs {abc, bce}: 1 shared of 3
    assert jaccard("a b c d", "a b c e") == pytest.approx(1 / 3)
    assert jaccard("", "") == 1.0


def test_ngram_decontamination():
    evals = [{"question": "What is the total of the values of Jan and Feb in the chart?"}]
    index = eval_ngrams(evals, 8)
    assert ("the", "total", "of", "the", "values", "of", "jan", "and") in index
    # shares "the total of the values of jan and" (8 words)
    assert contaminated("Tell me the total of the values of Jan and Mar.", index, 8)
    assert not contaminated("Tell me the total of the values of Mar and Jan.", index, 8)
    assert not contaminated("short", index, 8)
    assert ngrams("a b", 8) == set()
    # a trace that quotes an eval question is removed even when its answer is right
    quoting = "Step 1: What is the total of the values of Jan and Feb in the chart? 15.\nAnswer: 9"
    res = select(ROW, gens(quoting), max_traces=2, min_step_accuracy=0.0, near_duplicate_threshold=0.9,
                 contamination=index, n=8)
    assert res.kept == [] and res.removed == {"contaminated_trace": 1} and res.correct == 1


def test_histogram_window_and_outputs():
    rows = [dict(ROW, id=f"q{i}", prompt=f"p{i}") for i in range(4)]
    samples = [gens(WRONG, WRONG, WRONG, WRONG), gens(GOOD, WRONG, NO_STEPS, WRONG),
               gens(GOOD, WRONG, WRONG, WRONG), gens(GOOD, GOOD, NO_STEPS, NO_STEPS)]
    results = [select(r, s, max_traces=2, min_step_accuracy=1.0, near_duplicate_threshold=0.9)
               for r, s in zip(rows, samples)]
    assert [r.pass_rate for r in results] == [0.0, 0.5, 0.25, 1.0]
    assert histogram(results, 4) == {"0": 1, "0.25": 1, "0.5": 1, "0.75": 0, "1": 1}
    verified, hard, pairs, rates = outputs(results, 4, (0.2, 0.625))
    assert [v["id"] for v in verified] == ["q1", "q1", "q2", "q3", "q3"]
    assert {h["id"] for h in hard} == {"q1", "q2"}  # pass rates 0.5 and 0.25 are inside the window
    assert [(p["id"], p["chosen"], p["rejected"], p["source"]) for p in pairs] == [
        ("q1", GOOD, WRONG, "teacher"), ("q2", GOOD, WRONG, "teacher"),
    ]
    assert [r["correct"] for r in rates] == [0, 2, 1, 4]
    assert verified[0]["rationale"] == GOOD and verified[0]["pass_rate"] == 0.5
    assert in_window(0.625, 0.2, 0.625) and not in_window(0.75, 0.2, 0.625)
