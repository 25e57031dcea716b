"""Verbalizer <-> grader round trip, step sentences, questions and the prompt format."""

import random
from collections import Counter

import pytest

from pipeline.data.cof import tables
from pipeline.data.cof.core import FUNCTIONS, Reject
from pipeline.data.cof.explorer import Step, explore
from pipeline.data.cof.tables import TableContext, random_table
from pipeline.data.cof.verbalize import format_prompt, verbalize
from pipeline.data.grading import STEP_SEPARATORS, extract_answer, extract_steps, grade, step_accuracy, step_value
from pipeline.data.params import SynthesizeConfig
from tests.conftest import FULL_SYNTHESIS

SALES = {
    "chart_type": "grouped_bar", "title": "Monthly sales", "unit": "k$", "categories": ["Jan", "Feb", "Mar", "Apr"],
    "series": ["2023", "2024"], "values": [[12, 15], [9, 11], [17, 14], [6, 10]], "colours": ["red", "blue"],
    "colour_by": "series",
}


def build(ctx, plan):
    """Execute [(function, args, inputs)] into Steps, as the explorer would."""
    steps = []
    for fn, args, inputs in plan:
        values = [steps[i].value for i in inputs]
        sig = tuple(steps[i].out_type for i in inputs)
        steps.append(Step(fn, args, inputs, FUNCTIONS[fn].signature[sig], FUNCTIONS[fn].run(ctx, *values, **args)))
    return steps


@pytest.fixture(scope="module")
def examples():
    """(answer_type, Verbalized) for 500 random chains of every answer type and length."""
    rng, rejected, out = random.Random(7), Counter(), []
    cfg = SynthesizeConfig(**FULL_SYNTHESIS)
    while len(out) < 500:
        ctx = TableContext(random_table(rng, cfg))
        answer_type = rng.choice(["number", "binary", "text"])
        try:
            steps = explore(rng, ctx, answer_type, rng.randint(2, 8), 3, rejected)
        except Reject:
            continue
        out.append((answer_type, verbalize(rng, ctx, steps)))
    return out


def test_round_trip_answer_and_every_step(examples):
    for answer_type, text in examples:
        assert grade(extract_answer(text.rationale), text.answer, answer_type), text.rationale
        gold = [s["value"] for s in text.steps]
        assert extract_steps(text.rationale) == gold, text.rationale
        assert step_accuracy(text.rationale, gold) == (len(gold), len(gold))
        lines = text.rationale.splitlines()
        assert lines[-1] == f"Answer: {text.answer}"
        assert [ln.split(":")[0] for ln in lines[:-1]] == [f"Step {k}" for k in range(1, len(gold) + 1)]


def _corrupt(value: str) -> str:
    if value in ("Yes", "No"):
        return "No" if value == "Yes" else "Yes"
    try:
        return tables.fmt_num(float(value) * 1.5 + 1)
    except ValueError:
        return value + "x"


def test_a_corrupted_step_value_is_detected(examples):
    for _, text in examples[:100]:
        gold = [s["value"] for s in text.steps]
        k = len(gold) // 2
        lines = text.rationale.splitlines()
        lines[k] = lines[k][: -len(gold[k]) - 1] + _corrupt(gold[k]) + "."
        assert step_accuracy("\n".join(lines), gold) == (len(gold) - 1, len(gold)), lines[k]


def test_the_design_example_step_by_step():
    ctx = TableContext(SALES)
    steps = build(
        ctx,
        [
            ("series_selection", {"series": "2024"}, ()),
            ("max_one_object", {}, (0,)),
            ("value_of_objects", {}, (1,)),
            ("series_selection", {"series": "2023"}, ()),
            ("min_one_object", {}, (3,)),
            ("value_of_objects", {}, (4,)),
            ("A_minus_B", {}, (2, 5)),
        ],
    )
    text = verbalize(random.Random(0), ctx, steps)
    assert text.rationale == (
        "Step 1: Select the 2024 bars: Jan 15, Feb 11, Mar 14, Apr 10.\n"
        "Step 2: The largest of them is Jan 15.\n"
        "Step 3: Its value is 15.\n"
        "Step 4: Select the 2023 bars: Jan 12, Feb 9, Mar 17, Apr 6.\n"
        "Step 5: The smallest of them is Apr 6.\n"
        "Step 6: Its value is 6.\n"
        "Step 7: 15 - 6 = 9.\n"
        "Answer: 9"
    )
    assert [s["function"] for s in text.steps] == [s.fn for s in steps]
    assert text.answer == "9"


def test_series_are_named_when_objects_span_several():
    ctx = TableContext(SALES)
    plan = [("category_selection", {"category": "Mar"}, ()), ("max_one_object", {}, (0,)), ("legend_of", {}, (1,))]
    steps = build(ctx, plan)
    text = verbalize(random.Random(0), ctx, steps)
    assert text.rationale.splitlines()[:3] == [
        "Step 1: Select the Mar bars: Mar (2023) 17, Mar (2024) 14.",
        "Step 2: The largest of them is Mar (2023) 17.",
        "Step 3: Its series is 2023.",
    ]


def test_negative_operands_and_decimals_read_back():
    ctx = TableContext(SALES)
    steps = build(
        ctx,
        [
            ("one_object", {"category": "Feb", "series": "2023"}, ()),
            ("value_of_objects", {}, (0,)),
            ("one_object", {"category": "Jan", "series": "2023"}, ()),
            ("value_of_objects", {}, (2,)),
            ("A_minus_B", {}, (1, 3)),
            ("multiply_by_constant", {"constant": 3}, (4,)),
        ],
    )
    text = verbalize(random.Random(1), ctx, steps)
    assert text.rationale.splitlines()[4:] == ["Step 5: 9 - 12 = -3.", "Step 6: 3 * (-3) = -9.", "Answer: -9"]
    assert "(" in text.question  # the bracketed operand: "3 times (A minus B)"
    assert step_value("Step 3: (12 + 9 + 17) / 3 = 12.67.") == "12.67"


def test_question_phrasings_vary_and_compose():
    ctx = TableContext(SALES)
    steps = build(ctx, [("one_object", {"category": "Jan", "series": "2024"}, ()), ("value_of_objects", {}, (0,))])
    heads, objects = ("the value of", "the number shown for"), ("the 2024 bar of Jan", "the bar for Jan in 2024")
    nps = [f"{head} {obj}" for head in heads for obj in objects]
    allowed = {q.format(x=np) for q in ("What is {x}?", "Compute {x}.", "Find {x}.") for np in nps}
    questions = {verbalize(random.Random(seed), ctx, steps).question for seed in range(60)}
    assert questions <= allowed
    assert len(questions) >= 6


def test_bool_questions_are_asked_directly():
    ctx = TableContext(SALES)
    steps = build(ctx, [("series_selection", {"series": "2024"}, ()), ("consistently_decreasing", {}, (0,))])
    text = verbalize(random.Random(0), ctx, steps)
    assert text.question in {
        f"{verb} {bars} {how} from left to right?"
        for bars in ("the 2024 bars", "the bars of 2024")
        for verb, how in (("Do", "consistently decrease"), ("Are", "strictly decreasing"))
    }
    assert text.answer == "No"  # 15, 11, 14, 10


def test_table_vocabulary_never_contains_a_separator():
    names = [*tables.COLOURS]
    for theme in tables.THEMES:
        names += [*theme.categories, *theme.series, theme.measure]
    for name in names:
        assert "," not in name and not name.endswith(".") and not any(sep in name for sep in STEP_SEPARATORS), name
        assert step_value(f"Step 1: Its label is {name}.") == name


def test_format_prompt_grouped_and_single_series():
    assert format_prompt(SALES, "What is 1?") == (
        "Chart: grouped bar. Title: Monthly sales (k$). Series: 2023, 2024. Colours: 2023 red, 2024 blue.\n"
        "Jan: 12, 15 | Feb: 9, 11 | Mar: 17, 14 | Apr: 6, 10\n"
        "Question: What is 1?\n"
    )
    bar = {"chart_type": "bar", "title": "Fruit harvest", "unit": "t", "categories": ["Apple", "Kiwi"],
           "series": ["Harvest"], "values": [[3], [8]], "colours": ["red", "blue"], "colour_by": "category"}
    assert format_prompt(bar, "Q?") == "Chart: bar. Title: Fruit harvest (t).\nApple: 3 red | Kiwi: 8 blue\n" \
                                       "Question: Q?\n"
