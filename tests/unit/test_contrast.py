"""Contrast paths on hand-written chains: which steps are choices, which wrong choices are allowed, the rows."""

from __future__ import annotations

import random

from pipeline.prm.contrast import contrast_rows, listed, step_kind, wrong_choices

SELECT = "Step 1: Select all bars: Norway 4, Egypt 13, Japan 14, Peru 13."


def test_step_kind_reads_the_template():
    assert step_kind("Step 2: The largest of them is Japan 14.") == "max_one_object"
    assert step_kind("Step 2: The 2 largest of them are Japan 14, Egypt 13.") == "top_k"
    assert step_kind("Step 3: Increasing from left to right: No.") == "consistently_increasing"
    assert step_kind("Step 3: 14 - 4 = 10.") == "arithmetic/other"
    assert step_kind("Answer: 10") == "answer"


def test_listed_objects():
    assert listed(SELECT) == ["Norway 4", "Egypt 13", "Japan 14", "Peru 13"]
    assert listed("Step 2: Its value is 14.") == []  # a value, not a list of objects


def test_one_object_wrong_choices_differ_in_value():
    # Second largest is Egypt 13 or Peru 13 (a tie): neither may be the wrong choice.
    wrong = wrong_choices(SELECT, "Step 2: The second largest of them is Egypt 13.", random.Random(0), 5)
    assert sorted(wrong) == ["Japan 14", "Norway 4"]
    assert len(wrong_choices(SELECT, "Step 2: The largest of them is Japan 14.", random.Random(0), 2)) == 2


def test_subset_yes_no_and_count():
    rng = random.Random(0)
    subsets = wrong_choices(SELECT, "Step 2: Those above 10 are Egypt 13, Japan 14, Peru 13.", rng, 50)
    assert subsets and all(s != "Egypt 13, Japan 14, Peru 13" for s in subsets)
    assert {len(s.split(", ")) for s in subsets} == {2, 3, 4}  # the right size and one either side
    assert "Egypt 13, Japan 14, Norway 4" not in subsets  # not in the list's order: never drawn
    assert wrong_choices(SELECT, "Step 2: All of them have the same value: No.", rng, 3) == ["Yes"]
    assert sorted(wrong_choices(SELECT, "Step 2: The number of them is 4.", rng, 3)) == ["3", "5"]
    assert wrong_choices(SELECT, "Step 2: The number of them is 0.", rng, 3) == ["1"]
    assert wrong_choices(SELECT, "Step 2: Its value is 14.", rng, 3) == []  # a lookup: not a choice


def test_contrast_rows_cut_at_each_choice():
    chain = {"id": "q1", "prompt": "P", "task_type": "extreme_value",
             "steps": [SELECT, "Step 2: The smallest of them is Norway 4.", "Step 3: Its value is 4.", "Answer: 4"]}
    rows = contrast_rows([chain], per_step=2, rng=random.Random(1))
    assert len(rows) == 3 and {r["source"] for r in rows} == {"contrast"}
    right, *wrong = rows
    assert right["steps"] == chain["steps"][:2] and right["labels"] == [1.0, 1.0]
    for row in wrong:
        assert row["steps"][0] == SELECT and row["labels"] == [1.0, 0.0]
        assert row["steps"][1].startswith("Step 2: The smallest of them is ") and row["steps"][1].endswith(".")
        assert row["steps"][1] != chain["steps"][1]
    assert contrast_rows([chain], per_step=0, rng=random.Random(1)) == []
