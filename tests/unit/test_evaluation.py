"""Evaluation summaries on hand-computed cases."""

from pipeline.evaluation.metrics import majority_answers, majority_baseline, score, summarize


def row(i, answer, answer_type, task_type="extreme_value", chain_length=2, steps=("A 5", "5")):
    return {
        "id": f"test-{i}", "split": "test", "answer": answer, "answer_type": answer_type,
        "task_type": task_type, "chain_length": chain_length,
        "steps": [{"function": "f", "text": "t", "value": v} for v in steps],
    }


def test_score_and_summarize_hand_computed():
    rows = [
        row(0, "5", "number", steps=("A 5", "5")),
        row(1, "Yes", "binary", task_type="comparison", chain_length=3, steps=("9", "4", "Yes")),
        row(2, "red", "text", task_type="text_information", steps=("B 2", "red")),
        row(3, "10", "number", chain_length=3, steps=("A 5", "5")),
    ]
    completions = [
        "Step 1: Select the bars: A 5.\nStep 2: The value is 5.\nAnswer: 5",  # right, 2/2 steps
        "Step 1: The value is 9.\nStep 2: The value is 7.\nStep 3: 9 > 7 is Yes.\nAnswer: yes",  # right, 2/3
        "Step 1: The bar is B 2.\nAnswer: Blue",  # wrong, 1/2
        "garbage without an answer line",  # wrong, 0/2
    ]
    records = [score(r, c, tokens=10 * (i + 1)) for i, (r, c) in enumerate(zip(rows, completions))]
    assert [r["correct"] for r in records] == [True, True, False, False]
    assert [(r["steps_matched"], r["steps_total"]) for r in records] == [(2, 2), (2, 3), (1, 2), (0, 2)]
    m = summarize(records)
    assert m["accuracy"] == 0.5
    assert m["step_accuracy"] == round(5 / 9, 4)
    assert m["answer_line_rate"] == 0.75
    assert m["by_answer_type"] == {"text": 0.0, "binary": 1.0, "number": 0.5}
    assert m["by_chain_length"] == {"2": 0.5, "3": 0.5}
    assert m["by_task_type"]["comparison"] == 1.0
    assert m["tokens_per_question"] == 25.0


def test_majority_baseline_hand_computed():
    train = [
        {"answer": "3", "answer_type": "number"}, {"answer": "3", "answer_type": "number"},
        {"answer": "7", "answer_type": "number"}, {"answer": "No", "answer_type": "binary"},
        {"answer": "Yes", "answer_type": "binary"}, {"answer": "no", "answer_type": "binary"},
    ]
    assert majority_answers(train) == {"number": "3", "binary": "no"}
    test = [row(0, "3", "number"), row(1, "3.1", "number"), row(2, "8", "number"), row(3, "No", "binary"),
            row(4, "red", "text")]
    # "3" hits 3 and 3.1 (within 5%), "no" hits No; text has no training answer
    assert majority_baseline(train, test) == 0.6
