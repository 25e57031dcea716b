"""Every atomic function on small hand-made tables, and its Reject rules."""

import random

import pytest

from pipeline.data.cof.core import FUNCTIONS, Reject, as_num
from pipeline.data.cof.tables import TableContext

GROUPS = {
    "selection", "value", "min_max", "filter", "count", "position", "text_information",
    "condition", "exclude", "min_max_diff", "statistics", "arithmetic", "compare",
}


def _ctx(chart_type, categories, series, values, colours, colour_by):
    return TableContext(
        {"chart_type": chart_type, "title": "T", "unit": "u", "categories": categories, "series": series,
         "values": values, "colours": colours, "colour_by": colour_by}
    )


# grouped bar: A 5/7, B 9/3, C 2/8, D 6/6; S1 red, S2 blue
MULTI = _ctx(
    "grouped_bar", ["A", "B", "C", "D"], ["S1", "S2"], [[5, 7], [9, 3], [2, 8], [6, 6]], ["red", "blue"], "series"
)
# bar: A 5 red, B 9 blue, C 2 red, D 7 green, E 4 blue
BAR = _ctx(
    "bar", ["A", "B", "C", "D", "E"], ["V"], [[5], [9], [2], [7], [4]],
    ["red", "blue", "red", "green", "blue"], "category",
)
# line: P 1, Q 4, R 8, one grey series
LINE = _ctx("line", ["P", "Q", "R"], ["V"], [[1], [4], [8]], ["grey"], "series")
PIE = _ctx("pie", ["A", "B", "C"], ["V"], [[3], [2], [1]], ["red", "blue", "green"], "category")


def run(name, ctx, *inputs, **args):
    return FUNCTIONS[name].run(ctx, *inputs, **args)


def cells(objs):
    return [(o.category, o.series, o.value) for o in objs]


def rejects(reason, name, ctx, *inputs, **args):
    with pytest.raises(Reject) as info:
        run(name, ctx, *inputs, **args)
    assert info.value.reason == reason


def obj(ctx, category, series=None):
    return next(o for o in ctx.objects if o.category == category and series in (None, o.series))


def test_registry_is_typed_and_large_enough():
    assert len(FUNCTIONS) >= 30
    for fn in FUNCTIONS.values():
        assert fn.group in GROUPS, fn.name
        assert fn.signature and all(isinstance(k, tuple) for k in fn.signature)
    assert {fn.group for fn in FUNCTIONS.values()} == GROUPS


def test_every_function_has_a_case_here():
    tested = {name[len("test_"):] for name in globals() if name.startswith("test_")}
    assert set(FUNCTIONS) <= tested


# ---- selection -----------------------------------------------------------------


def test_select_all():
    assert cells(run("select_all", BAR)) == [("A", "V", 5), ("B", "V", 9), ("C", "V", 2), ("D", "V", 7), ("E", "V", 4)]
    assert len(run("select_all", MULTI)) == 8


def test_series_selection():
    assert [o.value for o in run("series_selection", MULTI, series="S2")] == [7, 3, 8, 6]
    rejects("not_applicable", "series_selection", BAR, series="V")


def test_category_selection():
    assert cells(run("category_selection", MULTI, category="B")) == [("B", "S1", 9), ("B", "S2", 3)]
    rejects("not_applicable", "category_selection", BAR, category="B")


def test_colour_selection():
    assert cells(run("colour_selection", BAR, colour="red")) == [("A", "V", 5), ("C", "V", 2)]
    assert [o.value for o in run("colour_selection", MULTI, colour="blue")] == [7, 3, 8, 6]
    rejects("too_few", "colour_selection", BAR, colour="green")  # one bar: that is one_object
    rejects("no_op", "colour_selection", LINE, colour="grey")  # the only colour selects everything
    rejects("empty", "colour_selection", BAR, colour="pink")


def test_one_object():
    assert run("one_object", MULTI, category="C", series="S2").value == 8
    assert run("one_object", BAR, category="B", series=None).value == 9
    rejects("not_applicable", "one_object", MULTI, category="C", series=None)


# ---- object functions ----------------------------------------------------------------


def test_max_one_object():
    assert run("max_one_object", BAR, BAR.objects) == obj(BAR, "B")
    assert run("max_one_object", MULTI, run("series_selection", MULTI, series="S2")) == obj(MULTI, "C", "S2")
    rejects("tie", "max_one_object", MULTI, run("category_selection", MULTI, category="D"))
    rejects("too_few", "max_one_object", BAR, BAR.objects[:1])


def test_min_one_object():
    assert run("min_one_object", BAR, BAR.objects) == obj(BAR, "C")
    rejects("tie", "min_one_object", MULTI, [obj(MULTI, "D", "S1"), obj(MULTI, "D", "S2"), obj(MULTI, "B", "S1")])


def test_second_max():
    assert run("second_max", BAR, BAR.objects) == obj(BAR, "D")  # 9 > 7 > 5
    rejects("tie", "second_max", MULTI, [obj(MULTI, "B", "S1"), obj(MULTI, "D", "S1"), obj(MULTI, "D", "S2")])
    rejects("too_few", "second_max", BAR, BAR.objects[:2])


def test_second_min():
    assert run("second_min", BAR, BAR.objects) == obj(BAR, "E")  # 2 < 4 < 5
    rejects("tie", "second_min", MULTI, [obj(MULTI, "C", "S1"), obj(MULTI, "D", "S1"), obj(MULTI, "D", "S2")])


def test_top_k():
    assert cells(run("top_k", BAR, BAR.objects, k=2)) == [("B", "V", 9), ("D", "V", 7)]  # table order
    assert cells(run("top_k", MULTI, MULTI.objects, k=3)) == [("A", "S2", 7), ("B", "S1", 9), ("C", "S2", 8)]
    rejects("tie", "top_k", MULTI, MULTI.objects, k=4)  # 9 8 7 6 | 6: the boundary is tied
    rejects("no_op", "top_k", BAR, BAR.objects, k=5)
    rejects("no_op", "top_k", BAR, BAR.objects, k=1)


def test_bottom_k():
    assert cells(run("bottom_k", BAR, BAR.objects, k=2)) == [("C", "V", 2), ("E", "V", 4)]
    rejects("tie", "bottom_k", MULTI, MULTI.objects, k=4)  # 2 3 5 6 | 6


def test_larger_than():
    assert cells(run("larger_than", BAR, BAR.objects, threshold=5)) == [("B", "V", 9), ("D", "V", 7)]  # strict
    rejects("empty", "larger_than", BAR, BAR.objects, threshold=9)
    rejects("no_op", "larger_than", BAR, BAR.objects, threshold=1)


def test_smaller_than():
    assert cells(run("smaller_than", BAR, BAR.objects, threshold=5)) == [("C", "V", 2), ("E", "V", 4)]
    rejects("empty", "smaller_than", BAR, BAR.objects, threshold=2)
    rejects("no_op", "smaller_than", BAR, BAR.objects, threshold=10)


def test_leftmost_k():
    assert cells(run("leftmost_k", BAR, BAR.objects, k=2)) == [("A", "V", 5), ("B", "V", 9)]
    rejects("not_applicable", "leftmost_k", MULTI, MULTI.objects, k=2)  # two objects per category
    rejects("not_applicable", "leftmost_k", PIE, PIE.objects, k=2)


def test_rightmost_k():
    assert cells(run("rightmost_k", BAR, BAR.objects, k=2)) == [("D", "V", 7), ("E", "V", 4)]
    s2 = run("series_selection", MULTI, series="S2")
    assert [o.category for o in run("rightmost_k", MULTI, s2, k=3)] == ["B", "C", "D"]


def test_exclude_by_legend():
    assert [o.series for o in run("exclude_by_legend", MULTI, MULTI.objects, series="S1")] == ["S2"] * 4
    s2 = run("series_selection", MULTI, series="S2")
    rejects("no_op", "exclude_by_legend", MULTI, s2, series="S1")
    rejects("empty", "exclude_by_legend", MULTI, s2, series="S2")
    rejects("not_applicable", "exclude_by_legend", BAR, BAR.objects, series="V")


def test_exclude_object():
    assert [o.category for o in run("exclude_object", BAR, BAR.objects, category="B")] == ["A", "C", "D", "E"]
    assert len(run("exclude_object", MULTI, MULTI.objects, category="B")) == 6
    rejects("no_op", "exclude_object", BAR, BAR.objects, category="Z")
    rejects("empty", "exclude_object", BAR, [obj(BAR, "B")], category="B")


def test_value_of_objects():
    assert run("value_of_objects", BAR, obj(BAR, "B")) == 9
    assert run("value_of_objects", BAR, BAR.objects) == [5, 9, 2, 7, 4]
    assert FUNCTIONS["value_of_objects"].signature == {("OBJ",): "NUM", ("OBJS",): "NUMS"}


def test_count_objects():
    assert run("count_objects", BAR, BAR.objects) == 5
    assert run("count_objects", MULTI, MULTI.objects) == 8


def test_number_of_colours():
    assert run("number_of_colours", BAR, BAR.objects) == 3
    assert run("number_of_colours", BAR, BAR.objects[:3]) == 2
    assert run("number_of_colours", MULTI, MULTI.objects) == 2
    rejects("not_applicable", "number_of_colours", LINE, LINE.objects)


def test_number_of_legends():
    assert run("number_of_legends", MULTI, MULTI.objects) == 2
    assert run("number_of_legends", MULTI, run("series_selection", MULTI, series="S1")) == 1
    rejects("not_applicable", "number_of_legends", BAR, BAR.objects)


def test_colour_of():
    assert run("colour_of", BAR, obj(BAR, "B")) == "blue"
    assert run("colour_of", MULTI, obj(MULTI, "A", "S1")) == "red"


def test_legend_of():
    assert run("legend_of", MULTI, obj(MULTI, "C", "S2")) == "S2"
    rejects("not_applicable", "legend_of", BAR, obj(BAR, "B"))


def test_label_of():
    assert run("label_of", BAR, obj(BAR, "D")) == "D"


def test_consistently_increasing():
    assert run("consistently_increasing", LINE, LINE.objects) is True
    assert run("consistently_increasing", BAR, BAR.objects) is False
    # Order is by position, not by list order.
    assert run("consistently_increasing", LINE, LINE.objects[::-1]) is True
    rejects("not_applicable", "consistently_increasing", MULTI, MULTI.objects)
    rejects("not_applicable", "consistently_increasing", PIE, PIE.objects)
    rejects("too_few", "consistently_increasing", LINE, LINE.objects[:2])


def test_consistently_decreasing():
    assert run("consistently_decreasing", LINE, LINE.objects) is False
    assert run("consistently_decreasing", BAR, [obj(BAR, "B"), obj(BAR, "D"), obj(BAR, "E")]) is True  # 9 7 4


def test_all_same_value():
    assert run("all_same_value", MULTI, run("category_selection", MULTI, category="D")) is True
    assert run("all_same_value", MULTI, run("category_selection", MULTI, category="A")) is False
    rejects("too_few", "all_same_value", BAR, BAR.objects[:1])


# ---- value functions --------------------------------------------------------------------


def test_sum():
    assert run("sum", BAR, [5, 9, 2]) == 16
    rejects("too_few", "sum", BAR, [5])


def test_mean():
    assert run("mean", BAR, [5, 9, 2, 7]) == 5.75
    assert run("mean", BAR, [1, 1, 2]) == 1.33  # rounded to 2 decimals, as the step writes it
    assert run("mean", BAR, [4, 8]) == 6 and isinstance(run("mean", BAR, [4, 8]), int)


def test_median():
    assert run("median", BAR, [5, 9, 2]) == 5
    assert run("median", BAR, [5, 9, 2, 7]) == 6


def test_range_of_values():
    assert run("range_of_values", BAR, [5, 9, 2, 7]) == 7


def test_multiply_by_constant():
    assert run("multiply_by_constant", BAR, 7, constant=3) == 21
    assert run("multiply_by_constant", BAR, 2.5, constant=2) == 5


def test_A_minus_B():
    assert run("A_minus_B", BAR, 6, 9) == -3


def test_abs_A_minus_B():
    assert run("abs_A_minus_B", BAR, 6, 9) == 3


def test_A_times_B():
    assert run("A_times_B", BAR, 2.5, 4) == 10


def test_A_div_B():
    assert run("A_div_B", BAR, 7, 2) == 3.5
    assert run("A_div_B", BAR, 1, 3) == 0.33
    rejects("division_by_zero", "A_div_B", BAR, 7, 0)
    rejects("too_small", "A_div_B", BAR, 1, 60)  # 0.0167 would print as 0.02: a 20% error


def test_A_greater_B():
    assert run("A_greater_B", BAR, 9, 6) is True
    assert run("A_greater_B", BAR, 6, 9) is False
    rejects("tie", "A_greater_B", BAR, 6, 6)


def test_A_less_B():
    assert run("A_less_B", BAR, 6, 9) is True
    rejects("tie", "A_less_B", BAR, 2.5, 2.5)


def test_as_num_guards():
    assert as_num(2.0) == 2 and isinstance(as_num(2.0), int)
    cases = ((float("inf"), "not_finite"), (float("nan"), "not_finite"), (2e6, "too_large"), (0.04, "too_small"))
    for bad, reason in cases:
        with pytest.raises(Reject) as info:
            as_num(bad)
        assert info.value.reason == reason


@pytest.mark.parametrize("seed", range(20))
def test_samplers_give_arguments_that_change_something(seed):
    rng = random.Random(seed)
    for name in ("larger_than", "smaller_than", "top_k", "bottom_k", "leftmost_k", "rightmost_k"):
        args = FUNCTIONS[name].sample(rng, BAR, BAR.objects)
        kept = run(name, BAR, BAR.objects, **args)
        assert 0 < len(kept) < len(BAR.objects), (name, args)
