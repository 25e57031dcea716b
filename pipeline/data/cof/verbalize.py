"""Chains into words: the question, one step sentence per function, the prompt.

    text = verbalize(rng, ctx, steps)      # .question .steps .answer .rationale
    prompt = format_prompt(ctx.table, text.question)

The question composes one noun phrase per function recursively ("the largest of
the 2024 bars" -> "the value of the largest of the 2024 bars"), with a phrasing
drawn by the rng; an operand computed by arithmetic is bracketed, so that
"(A minus B) times 3" keeps one reading. Each step sentence ends with its value
after the last separator (": ", " is ", " are ", " = "), which is what
`pipeline.data.grading.step_value` reads back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pipeline.data.cof.core import BOOL, FUNCTIONS, NUM, NUMS, OBJ, OBJS, TEXT
from pipeline.data.cof.explorer import Step
from pipeline.data.cof.tables import TableContext, fmt_num, fmt_obj, fmt_objs, spans_series

# Noun phrases; {x} is the input's phrase, {a}/{b} the operands', {noun}/{nouns}
# the chart's mark ("bar", "slices"...), other fields are the function's arguments.
PHRASES = {
    "select_all": ["all {nouns}", "all the {nouns}"],
    "series_selection": ["the {series} {nouns}", "the {nouns} of {series}"],
    "category_selection": ["the {category} {nouns}", "the {nouns} for {category}"],
    "colour_selection": ["the {colour} {nouns}", "the {nouns} coloured {colour}"],
    "one_object": ["the {category} {noun}", "the {noun} for {category}"],
    "one_object+series": ["the {series} {noun} of {category}", "the {noun} for {category} in {series}"],
    "max_one_object": ["the largest of {x}", "the highest of {x}", "the {noun} with the largest value among {x}"],
    "min_one_object": ["the smallest of {x}", "the lowest of {x}", "the {noun} with the smallest value among {x}"],
    "second_max": ["the second largest of {x}", "the second highest of {x}"],
    "second_min": ["the second smallest of {x}", "the second lowest of {x}"],
    "top_k": ["the {k} largest of {x}", "the top {k} of {x}"],
    "bottom_k": ["the {k} smallest of {x}", "the bottom {k} of {x}"],
    "larger_than": ["{x} above {threshold}", "{x} with values greater than {threshold}"],
    "smaller_than": ["{x} below {threshold}", "{x} with values less than {threshold}"],
    "leftmost_k": ["the {k} leftmost of {x}", "the first {k} of {x}"],
    "rightmost_k": ["the {k} rightmost of {x}", "the last {k} of {x}"],
    "exclude_by_legend": ["{x} excluding {series}", "{x} other than those of {series}"],
    "exclude_object": ["{x} except {category}", "{x} excluding {category}"],
    "value_of_objects": ["the value of {x}", "the number shown for {x}"],
    "value_of_objects+list": ["the values of {x}", "the numbers shown for {x}"],
    "count_objects": ["the number of {x}", "the count of {x}"],
    "number_of_colours": ["the number of colours among {x}", "the number of distinct colours of {x}"],
    "number_of_legends": ["the number of series among {x}", "the number of legend entries of {x}"],
    "colour_of": ["the colour of {x}"],
    "legend_of": ["the series of {x}", "the legend entry of {x}"],
    "label_of": ["the label of {x}", "the category of {x}"],
    "sum": ["the sum of {x}", "the total of {x}"],
    "mean": ["the mean of {x}", "the average of {x}"],
    "median": ["the median of {x}"],
    "range_of_values": ["the range of {x}", "the gap between the largest and smallest of {x}"],
    "multiply_by_constant": ["{constant} times {x}", "{x} multiplied by {constant}"],
    "A_minus_B": ["{a} minus {b}", "the result of subtracting {b} from {a}"],
    "abs_A_minus_B": ["the absolute difference between {a} and {b}", "the gap between {a} and {b}"],
    "A_times_B": ["the product of {a} and {b}", "{a} times {b}"],
    "A_div_B": ["the ratio of {a} to {b}", "{a} divided by {b}"],
}
# A chain that ends in a bool is asked by its last function directly.
BOOL_QUESTIONS = {
    "consistently_increasing": [
        "Do {x} consistently increase from left to right?",
        "Are {x} strictly increasing from left to right?",
    ],
    "consistently_decreasing": [
        "Do {x} consistently decrease from left to right?",
        "Are {x} strictly decreasing from left to right?",
    ],
    "all_same_value": ["Do {x} all have the same value?", "Are {x} all equal in value?"],
    "A_greater_B": ["Is {a} greater than {b}?", "Is {a} larger than {b}?"],
    "A_less_B": ["Is {a} less than {b}?", "Is {a} smaller than {b}?"],
}
QUESTIONS = {NUM: ["What is {x}?", "Compute {x}.", "Find {x}."], TEXT: ["What is {x}?", "Name {x}."]}
# One sentence per function; {v} is the step's value and always comes last.
STEPS = {
    "select_all": "Select all {nouns}: {v}.",
    "series_selection": "Select the {series} {nouns}: {v}.",
    "category_selection": "Select the {category} {nouns}: {v}.",
    "colour_selection": "Select the {colour} {nouns}: {v}.",
    "one_object": "Select the {category} {noun}: {v}.",
    "one_object+series": "Select the {series} {noun} of {category}: {v}.",
    "max_one_object": "The largest of them is {v}.",
    "min_one_object": "The smallest of them is {v}.",
    "second_max": "The second largest of them is {v}.",
    "second_min": "The second smallest of them is {v}.",
    "top_k": "The {k} largest of them are {v}.",
    "bottom_k": "The {k} smallest of them are {v}.",
    "larger_than": "Those above {threshold} are {v}.",
    "smaller_than": "Those below {threshold} are {v}.",
    "leftmost_k": "The {k} leftmost of them are {v}.",
    "rightmost_k": "The {k} rightmost of them are {v}.",
    "exclude_by_legend": "Without {series} they are {v}.",
    "exclude_object": "Without {category} they are {v}.",
    "value_of_objects": "Its value is {v}.",
    "value_of_objects+list": "Their values are {v}.",
    "count_objects": "The number of them is {v}.",
    "number_of_colours": "The number of colours among them is {v}.",
    "number_of_legends": "The number of series among them is {v}.",
    "colour_of": "Its colour is {v}.",
    "legend_of": "Its series is {v}.",
    "label_of": "Its label is {v}.",
    "consistently_increasing": "Increasing from left to right: {v}.",
    "consistently_decreasing": "Decreasing from left to right: {v}.",
    "all_same_value": "All of them have the same value: {v}.",
    "sum": "{terms} = {v}.",
    "mean": "({terms}) / {n} = {v}.",
    "median": "The median of {nums} is {v}.",
    "range_of_values": "{hi} - {lo} = {v}.",
    "multiply_by_constant": "{constant} * {a} = {v}.",
    "A_minus_B": "{a} - {b} = {v}.",
    "abs_A_minus_B": "|{a} - {b}| = {v}.",
    "A_times_B": "{a} * {b} = {v}.",
    "A_div_B": "{a} / {b} = {v}.",
    "A_greater_B": "{a} > {b} is {v}.",
    "A_less_B": "{a} < {b} is {v}.",
}


@dataclass
class Verbalized:
    question: str
    steps: list[dict[str, str]]  # {function, text, value}, all strings
    answer: str
    rationale: str  # the gold completion: "Step k: ..." lines, then "Answer: ..."


def value_text(step: Step, steps: list[Step]) -> str:
    """A step's value as its sentence writes it."""
    v = step.value
    if step.out_type == OBJS:
        return fmt_objs(v)
    if step.out_type == OBJ:
        # Name the series when the object was picked among several series' objects.
        parent = steps[step.inputs[0]].value if step.inputs else None
        with_series = step.args.get("series") is not None if parent is None else spans_series(parent)
        return fmt_obj(v, with_series)
    if step.out_type == NUMS:
        return ", ".join(fmt_num(x) for x in v)
    if step.out_type == BOOL:
        return "Yes" if v else "No"
    return fmt_num(v) if isinstance(v, (int, float)) else str(v)


def _key(step: Step) -> str:
    if step.fn == "one_object" and step.args.get("series") is not None:
        return "one_object+series"
    if step.fn == "value_of_objects" and step.out_type == NUMS:
        return "value_of_objects+list"
    return step.fn


def _operand(x: float) -> str:
    return f"({fmt_num(x)})" if x < 0 else fmt_num(x)


def _fields(step: Step, steps: list[Step], ctx: TableContext) -> dict[str, str]:
    """Fields for a step sentence: the arguments and the numbers it computes on."""
    fields = {"noun": ctx.noun, "nouns": ctx.nouns}
    fields.update((k, str(v)) for k, v in step.args.items() if v is not None)
    values = [steps[i].value for i in step.inputs]
    if step.out_type == NUM and values and isinstance(values[0], list) and FUNCTIONS[step.fn].group != "count":
        nums = values[0]  # a statistic over a list of numbers
        fields.update(terms=" + ".join(map(_operand, nums)), n=str(len(nums)), nums=", ".join(map(fmt_num, nums)))
        fields.update(hi=_operand(max(nums)), lo=_operand(min(nums)))
    elif values and all(isinstance(v, (int, float)) for v in values):
        fields.update(zip("ab", map(_operand, values)))  # operands of arithmetic or a comparison
    return fields


def _phrase_fields(step: Step, phrases: list[str], steps: list[Step], ctx: TableContext) -> dict[str, str]:
    """Fields for a question template: the arguments and the inputs' phrases."""
    fields = {"noun": ctx.noun, "nouns": ctx.nouns}
    fields.update((k, str(v)) for k, v in step.args.items() if v is not None)
    operands = [
        # Bracket an arithmetic result used as an operand: "(A minus B) times 3".
        f"({phrases[i]})" if FUNCTIONS[steps[i].fn].group == "arithmetic" else phrases[i]
        for i in step.inputs
    ]
    fields.update(zip("ab", operands))
    if operands:
        fields["x"] = operands[0]
    return fields


def verbalize(rng: random.Random, ctx: TableContext, steps: list[Step]) -> Verbalized:
    """The question, the gold steps and the completion for an executed chain."""
    phrases: list[str] = []
    lines, gold = [], []
    for n, step in enumerate(steps, start=1):
        key = _key(step)
        fields = _phrase_fields(step, phrases, steps, ctx)
        templates = PHRASES.get(key) or BOOL_QUESTIONS[key]
        phrases.append(rng.choice(templates).format(**fields))
        v = value_text(step, steps)
        text = STEPS[key].format(v=v, **_fields(step, steps, ctx))
        lines.append(f"Step {n}: {text}")
        gold.append({"function": step.fn, "text": text, "value": v})
    last = steps[-1]
    if last.out_type == BOOL:
        question = phrases[-1]  # a bool template is already the whole question
    else:
        question = rng.choice(QUESTIONS[last.out_type]).format(x=phrases[-1])
    answer = gold[-1]["value"]
    return Verbalized(question, gold, answer, "\n".join(lines) + f"\nAnswer: {answer}")


def format_prompt(table: dict, question: str) -> str:
    """The compact text the student reads: chart header, one row of values, question."""
    head = f"Chart: {table['chart_type'].replace('_', ' ')}. Title: {table['title']} ({table['unit']})."
    by_category = table["colour_by"] == "category"
    if not by_category:
        pairs = ", ".join(f"{s} {c}" for s, c in zip(table["series"], table["colours"]))
        head += f" Series: {', '.join(table['series'])}. Colours: {pairs}."
    cells = []
    for i, category in enumerate(table["categories"]):
        values = ", ".join(map(str, table["values"][i]))
        # Single-series bars and slices carry their own colour after the value.
        cells.append(f"{category}: {values} {table['colours'][i]}" if by_category else f"{category}: {values}")
    return f"{head}\n{' | '.join(cells)}\nQuestion: {question}\n"
