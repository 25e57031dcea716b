"""The value layer: numbers -> number | bool (statistics, arithmetic, comparison).

    FUNCTIONS["A_div_B"].run(ctx, 6, 4) == 1.5

Every result goes through `as_num`, so a chain computes on exactly the rounded
numbers that its step sentences show.
"""

from __future__ import annotations

import statistics

from pipeline.data.cof.core import BOOL, NUM, NUMS, Reject, as_num, at_least, atomic
from pipeline.data.cof.tables import TableContext

MULTIPLIERS = (2, 3, 4, 5, 10)


# Named sum_ so as not to shadow the builtin here; registered as "sum".
@atomic("statistics", {(NUMS,): NUM}, name="sum")
def sum_(ctx: TableContext, nums: list[float]) -> int | float:
    at_least(nums, 2)
    return as_num(sum(nums))


@atomic("statistics", {(NUMS,): NUM})
def mean(ctx: TableContext, nums: list[float]) -> int | float:
    at_least(nums, 2)
    return as_num(sum(nums) / len(nums))


@atomic("statistics", {(NUMS,): NUM})
def median(ctx: TableContext, nums: list[float]) -> int | float:
    at_least(nums, 2)
    return as_num(statistics.median(nums))


@atomic("min_max_diff", {(NUMS,): NUM})
def range_of_values(ctx: TableContext, nums: list[float]) -> int | float:
    at_least(nums, 2)
    return as_num(max(nums) - min(nums))


@atomic("arithmetic", {(NUM,): NUM}, lambda rng, ctx, x: {"constant": rng.choice(MULTIPLIERS)})
def multiply_by_constant(ctx: TableContext, x: float, constant: int) -> int | float:
    return as_num(x * constant)


@atomic("arithmetic", {(NUM, NUM): NUM})
def A_minus_B(ctx: TableContext, a: float, b: float) -> int | float:
    return as_num(a - b)


@atomic("arithmetic", {(NUM, NUM): NUM})
def abs_A_minus_B(ctx: TableContext, a: float, b: float) -> int | float:
    return as_num(abs(a - b))


@atomic("arithmetic", {(NUM, NUM): NUM})
def A_times_B(ctx: TableContext, a: float, b: float) -> int | float:
    return as_num(a * b)


@atomic("arithmetic", {(NUM, NUM): NUM})
def A_div_B(ctx: TableContext, a: float, b: float) -> int | float:
    if b == 0:
        raise Reject("division_by_zero")
    return as_num(a / b)


def _compare(a: float, b: float, greater: bool) -> bool:
    if a == b:
        raise Reject("tie")  # "is A greater than B" with A == B is a trick, not a comparison
    return a > b if greater else a < b


@atomic("compare", {(NUM, NUM): BOOL})
def A_greater_B(ctx: TableContext, a: float, b: float) -> bool:
    return _compare(a, b, greater=True)


@atomic("compare", {(NUM, NUM): BOOL})
def A_less_B(ctx: TableContext, a: float, b: float) -> bool:
    return _compare(a, b, greater=False)

