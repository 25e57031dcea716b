"""Answer formats and graders (pipeline/data/answers.py) on hand-written cases."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.data import answers
from pipeline.data.answers import extract, grade_with, last_boxed


@pytest.mark.parametrize(
    "completion, fmt, expected",
    [
        ("Step 1: x is 3.\nAnswer: 3", "answer_line", "3"),
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "gsm8k", "72"),
        ("#### 1,234\n", "gsm8k", "1,234"),
        ("no mark here 5", "gsm8k", None),
        ("So the answer is $\\boxed{\\frac{1}{2}}$.", "boxed", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b^{2}}}}", "boxed", "\\sqrt{\\frac{a}{b^{2}}}"),
        ("\\fbox{7}", "boxed", "7"),
        ("\\boxed{unbalanced", "boxed", None),
        ("she has 12 apples, then -3.5 and finally 1,200.", "last_number", "1,200"),
        ("no digits", "last_number", None),
        # reasoning is dropped first: a number thought aloud is not the answer
        ("<think>maybe 41\n#### 41</think>\n#### 42", "gsm8k", "42"),
        ("<think>the answer is 41", "last_number", None),
        ("<THINK>x</THINK> Answer: yes", "answer_line", "yes"),  # the answer line starts after the tag
        ("<think>x</think>\nAnswer: yes", "answer_line", "yes"),
        (None, "gsm8k", None),
    ],
)
def test_extract(completion, fmt, expected):
    assert extract(completion, fmt) == expected


def test_a_regex_takes_its_first_group_of_the_last_match():
    assert extract("final: 3 ... final: 4", "answer_line", pattern=r"final: (\d+)") == "4"
    assert extract("final 9", "answer_line", pattern=r"\d+") == "9"
    assert extract("nothing", "answer_line", pattern=r"final: (\d+)") is None


def test_an_unknown_format_or_grader_names_the_choices():
    with pytest.raises(ValueError, match="boxed"):
        extract("x", "latex")
    with pytest.raises(ValueError, match="math_verify"):
        grade_with("fuzzy", "1", "1", "number")


def test_last_boxed_keeps_nested_braces():
    assert last_boxed("\\boxed{{a}{b}}") == "{a}{b}"
    assert last_boxed("\\boxed {x}") == "x"


@pytest.mark.parametrize(
    "prediction, answer, expected",
    [
        ("72", "72", True),
        ("72.0", "72", True),
        ("72,000", "72000", True),
        ("$5", "5", True),
        ("71", "72", False),
        ("75", "72", False),  # within 5%: right for relaxed, wrong here
        ("Paris", " paris ", True),
        ("Paris.", "paris", True),
        ("", "", False),
        (None, "1", False),
    ],
)
def test_exact(prediction, answer, expected):
    assert grade_with("exact", prediction, answer, "number") is expected


def test_relaxed_is_the_chart_tasks_5_percent():
    assert grade_with("relaxed", "75", "72", "number") is True  # |75 - 72| / 72 = 4.2%
    assert grade_with("relaxed", "76", "72", "number") is False  # 5.6%


@pytest.mark.parametrize(
    "prediction, answer, expected",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("0.5", "\\frac12", True),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\frac{2}{4}", "\\frac{1}{2}", True),
        ("x^2", "x^3", False),
        ("1,234", "1234", True),  # plain numbers: compared without math-verify
        ("garbage }{", "\\frac12", False),
        ("", "1", False),
    ],
)
def test_math_verify(prediction, answer, expected):
    assert grade_with("math_verify", prediction, answer, "number") is expected


def test_math_verify_is_bounded_in_length_and_time(monkeypatch):
    assert grade_with("math_verify", "1" * (answers.MATH_VERIFY_MAX_CHARS + 1), "1", "number") is False
    # A comparison math-verify gives up on after its own 3 s: cut at 0.5 s, worker replaced.
    monkeypatch.setattr(answers, "MATH_VERIFY_SECONDS", 0.5)
    hostile = "9" * 900 + "^" + "9" * 90
    start = time.monotonic()
    assert grade_with("math_verify", hostile, "\\frac12", "number") is False
    assert time.monotonic() - start < 2.5
    monkeypatch.setattr(answers, "MATH_VERIFY_SECONDS", 10.0)
    assert grade_with("math_verify", "\\frac{3}{6}", "0.5", "number") is True  # a fresh worker


def test_math_verify_works_off_the_main_thread():
    results = []
    thread = threading.Thread(target=lambda: results.append(grade_with("math_verify", "\\frac{1}{4}", "0.25",
                                                                       "number")))
    thread.start()
    thread.join(30)
    assert results == [True]
