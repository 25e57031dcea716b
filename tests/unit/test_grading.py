"""The grader's edge cases: number parsing, the 5% rule, text matching, extraction."""

import pytest

from pipeline.data.grading import (
    extract_answer,
    extract_steps,
    grade,
    infer_answer_type,
    parse_number,
    step_accuracy,
    step_value,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,234", 1234.0),
        ("1234.0", 1234.0),
        ("50%", 50.0),
        ("-3.5", -3.5),
        (" 7 ", 7.0),
        ("$12", 12.0),
        ("9.", 9.0),
        ("2.5.", 2.5),
        ("1,234,567.5", 1234567.5),
        ("abc", None),
        ("", None),
        ("15, 11", None),  # a step's list of values is not a number
        ("1,2", None),  # commas only group thousands
        ("12 apples", None),
        (None, None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    "prediction, answer, correct",
    [
        ("1,234", "1234", True),
        ("1234.0", "1234", True),
        ("50%", "50", True),
        ("104.9", "100", True),  # 4.9% off
        ("95.1", "100", True),
        ("105.1", "100", False),  # 5.1% off
        ("94.9", "100", False),
        ("105", "100", True),  # exactly 5%: inclusive
        ("-3.6", "-3.5", True),
        ("3.5", "-3.5", False),  # the sign matters
        ("0", "0", True),
        ("-0.0", "0", True),
        ("0.01", "0", False),
        ("seven", "7", False),
        ("", "7", False),
        ("7", "seven", False),  # unparseable gold: never a silent pass
    ],
)
def test_grade_number(prediction, answer, correct):
    assert grade(prediction, answer, "number") is correct


@pytest.mark.parametrize(
    "prediction, answer, answer_type, correct",
    [
        ("yes", "Yes", "binary", True),
        ("  NO ", "No", "binary", True),
        ("Yes.", "Yes", "binary", True),
        ("No", "Yes", "binary", False),
        ("Y", "Yes", "binary", False),
        ("RED", "red", "text", True),
        ("red.", "red", "text", True),
        ("  Jan  (2024)  15 ", "Jan (2024) 15", "text", True),
        ("dark red", "red", "text", False),
        ("", "red", "text", False),
        ("", "", "text", False),  # an empty gold answer matches nothing
    ],
)
def test_grade_binary_and_text(prediction, answer, answer_type, correct):
    assert grade(prediction, answer, answer_type) is correct


@pytest.mark.parametrize("garbage", [None, 12, ["7"], b"7"])
def test_grade_never_raises_on_garbage(garbage):
    for answer_type in ("number", "binary", "text"):
        assert grade(garbage, "7", answer_type) is False
        assert grade("7", garbage, answer_type) is False


def test_extract_answer_takes_the_last_answer_line():
    completion = "Step 1: Answer: is not at the start.\nAnswer: 3\nStep 2: 3 * 2 = 6.\nAnswer:  6 \n"
    assert extract_answer(completion) == "6"


@pytest.mark.parametrize("completion", ["Step 1: 2 + 2 = 4.", "", None, "The answer: 4", "answer: 4"])
def test_extract_answer_none_without_an_answer_line(completion):
    assert extract_answer(completion) is None


@pytest.mark.parametrize(
    "line, value",
    [
        ("Step 1: Select the 2024 bars: Jan 15, Feb 11, Mar 14.", "Jan 15, Feb 11, Mar 14"),
        ("Step 2: The largest of them is Jan (2024) 15.", "Jan (2024) 15"),
        ("Step 3: The 2 largest of them are Jan 15, Mar 14.", "Jan 15, Mar 14"),
        ("Step 7: 15 - 6 = 9.", "9"),
        ("Step 4: (12 + 9 + 17) / 3 = 12.67.", "12.67"),
        ("Step 5: 5 / 2 = 2.5.", "2.5"),
        ("Step 6: 15 > 6 is Yes.", "Yes"),
        ("Step 8: Increasing from left to right: No.", "No"),
        ("Step 9: The median of 12, 9, 17 is 12.", "12"),  # the last separator wins
        ("Step 10: no separator here.", None),
        (None, None),
    ],
)
def test_step_value(line, value):
    assert step_value(line) == value


def test_extract_steps_reads_step_lines_only():
    completion = (
        "Step 1: Select all bars: A 5, B 9.\nnoise\nStep 2: The largest of them is B 9.\nStep 3: nothing\nAnswer: B"
    )
    assert extract_steps(completion) == ["A 5, B 9", "B 9", ""]


@pytest.mark.parametrize(
    "value, kind",
    [("12.5", "number"), ("1,234", "number"), ("yes", "binary"), ("No", "binary"), ("red", "text"),
     ("A 5, B 9", "text")],
)
def test_infer_answer_type(value, kind):
    assert infer_answer_type(value) == kind


def test_step_accuracy_counts_matches_and_missing_steps():
    gold = ["A 5, B 9", "9", "Yes"]
    right = "Step 1: Select all bars: A 5, B 9.\nStep 2: Its value is 9.2.\nStep 3: 9 > 4 is yes.\nAnswer: Yes"
    assert step_accuracy(right, gold) == (3, 3)
    # 9.5 is 5.6% off 9; the third step is missing.
    assert step_accuracy("Step 1: Select all bars: A 5, B 9.\nStep 2: Its value is 9.5.\nAnswer: Yes", gold) == (1, 3)
    assert step_accuracy(None, gold) == (0, 3)


# How SmolLM2-135M-Instruct writes its answers, zero-shot and after two worked examples (tests/e2e/test_smollm2.py
# runs the model itself): markdown emphasis around the answer line, a final sentence instead of one, numbered steps.
SMOLLM2_REPLIES = [
    ("Step 1: Select the Spain slice: Spain 6.\nStep 2: 10 * 6 = 60.\n**Answer:** 60", "60", "number", True, True),
    ("The value for Spain is 6, so 10 times it is 60.\nAnswer: **60**.", "60", "number", True, True),
    ("1. Spain's slice shows 6.\n2. Multiply by 10: 10 * 6 = 60.", "60", "number", False, True),
    ("10 times the number shown for Spain is 10 * 2 = 20.", "60", "number", False, False),
    ("The slice with the largest value is Fri, and its colour is **orange**.", "orange", "text", False, True),
    ("Answer: Yes, Fri is larger than Thu.", "yes", "binary", False, True),
    ("No. Fri (17) is not smaller than Thu (2).\nAnswer: No", "no", "binary", True, True),
]


@pytest.mark.parametrize("reply, gold, answer_type, strict, lenient", SMOLLM2_REPLIES)
def test_smollm2s_answer_styles_read_strictly_and_leniently(reply, gold, answer_type, strict, lenient):
    """The strict reader takes the task's `Answer:` line, emphasis or not; the lenient one any reply's last number,
    yes or no, or the gold word in its last line: a gain under the strict reading alone is the format learned."""
    from pipeline.data.grading import extract_answer, grade, lenient_correct

    read = extract_answer(reply)
    assert (read is not None and grade(read, gold, answer_type)) is strict
    assert lenient_correct(reply, gold, answer_type) is lenient
