"""The selection and object layers of the Chain-of-Functions atomic functions.

    objs = FUNCTIONS["series_selection"].run(ctx, series="2024")
    FUNCTIONS["max_one_object"].run(ctx, objs)          # -> Obj, or Reject("tie")

Selections read the table (-> OBJS | OBJ); object functions map objects to
objects, a number, a text or a bool. Filters keep the table order of their input.
See `core.py` for the types and the Reject rules.
"""

from __future__ import annotations

import random

from pipeline.data.cof.core import BOOL, NUM, NUMS, OBJ, OBJS, TEXT, Reject, at_least, atomic, value_key
from pipeline.data.cof.tables import Obj, TableContext


def _need_multi(ctx: TableContext) -> None:
    if not ctx.multi:
        raise Reject("not_applicable")  # legends and groups need several series


def _nonempty(objs: list[Obj]) -> list[Obj]:
    if not objs:
        raise Reject("empty")
    return objs


def _kept(kept: list[Obj], before: list[Obj]) -> list[Obj]:
    """A filter's result: neither empty nor everything it was given."""
    if len(_nonempty(kept)) == len(before):
        raise Reject("no_op")
    return kept


def _left_to_right(ctx: TableContext, objs: list[Obj]) -> None:
    # Left/right order and trends are only defined along one series, and a pie
    # has no left and right.
    if ctx.table["chart_type"] == "pie" or len({o.position for o in objs}) != len(objs):
        raise Reject("not_applicable")


# ---- selection: table -> objects ----------------------------------------------


@atomic("selection", {(): OBJS})
def select_all(ctx: TableContext) -> list[Obj]:
    return list(ctx.objects)


@atomic("selection", {(): OBJS}, lambda rng, ctx: {"series": rng.choice(ctx.series)})
def series_selection(ctx: TableContext, series: str) -> list[Obj]:
    _need_multi(ctx)
    return _nonempty([o for o in ctx.objects if o.series == series])


@atomic("selection", {(): OBJS}, lambda rng, ctx: {"category": rng.choice(ctx.categories)})
def category_selection(ctx: TableContext, category: str) -> list[Obj]:
    _need_multi(ctx)  # one series: a "group" is a single object, which is one_object
    return _nonempty([o for o in ctx.objects if o.category == category])


@atomic("selection", {(): OBJS}, lambda rng, ctx: {"colour": rng.choice(ctx.colours)})
def colour_selection(ctx: TableContext, colour: str) -> list[Obj]:
    objs = _kept([o for o in ctx.objects if o.colour == colour], ctx.objects)
    at_least(objs, 2)  # a pie's colours are distinct: one slice is one_object's job
    return objs


def _sample_one(rng: random.Random, ctx: TableContext) -> dict:
    return {"category": rng.choice(ctx.categories), "series": rng.choice(ctx.series) if ctx.multi else None}


@atomic("selection", {(): OBJ}, _sample_one)
def one_object(ctx: TableContext, category: str, series: str | None) -> Obj:
    if ctx.multi and series is None:
        raise Reject("not_applicable")
    for o in ctx.objects:
        if o.category == category and (series is None or o.series == series):
            return o
    raise Reject("empty")


# ---- object functions: objects -> objects | number | text | bool -------------


def _ranked(objs: list[Obj], rank: int, largest: bool) -> Obj:
    """The object at `rank` (0 = extreme) by value; its neighbours must differ."""
    at_least(objs, rank + 2)
    ranked = sorted(objs, key=value_key, reverse=largest)
    v = ranked[rank].value
    if ranked[rank + 1].value == v or (rank and ranked[rank - 1].value == v):
        raise Reject("tie")
    return ranked[rank]


@atomic("min_max", {(OBJS,): OBJ})
def max_one_object(ctx: TableContext, objs: list[Obj]) -> Obj:
    return _ranked(objs, 0, largest=True)


@atomic("min_max", {(OBJS,): OBJ})
def min_one_object(ctx: TableContext, objs: list[Obj]) -> Obj:
    return _ranked(objs, 0, largest=False)


@atomic("min_max", {(OBJS,): OBJ})
def second_max(ctx: TableContext, objs: list[Obj]) -> Obj:
    return _ranked(objs, 1, largest=True)


@atomic("min_max", {(OBJS,): OBJ})
def second_min(ctx: TableContext, objs: list[Obj]) -> Obj:
    return _ranked(objs, 1, largest=False)


def _sample_k(rng: random.Random, ctx: TableContext, objs: list[Obj]) -> dict:
    at_least(objs, 3)  # k in [2, n-1]: one object is not a list, all of them is a no-op
    return {"k": rng.randint(2, len(objs) - 1)}


def _check_k(objs: list[Obj], k: int) -> None:
    at_least(objs, 3)
    if not 2 <= k < len(objs):
        raise Reject("no_op")


def _extreme_k(objs: list[Obj], k: int, largest: bool) -> list[Obj]:
    _check_k(objs, k)
    ranked = sorted(objs, key=value_key, reverse=largest)
    if ranked[k - 1].value == ranked[k].value:
        raise Reject("tie")
    chosen = set(ranked[:k])
    return [o for o in objs if o in chosen]


@atomic("min_max", {(OBJS,): OBJS}, _sample_k)
def top_k(ctx: TableContext, objs: list[Obj], k: int) -> list[Obj]:
    return _extreme_k(objs, k, largest=True)


@atomic("min_max", {(OBJS,): OBJS}, _sample_k)
def bottom_k(ctx: TableContext, objs: list[Obj], k: int) -> list[Obj]:
    return _extreme_k(objs, k, largest=False)


def _sample_threshold(rng: random.Random, ctx: TableContext, objs: list[Obj], above: bool) -> dict:
    lo, hi = min(map(value_key, objs)), max(map(value_key, objs))
    if lo == hi:
        raise Reject("no_op")
    # Strictly between the extremes: the filter keeps some objects and drops some.
    return {"threshold": rng.randint(lo, hi - 1) if above else rng.randint(lo + 1, hi)}


@atomic("filter", {(OBJS,): OBJS}, lambda rng, ctx, objs: _sample_threshold(rng, ctx, objs, True))
def larger_than(ctx: TableContext, objs: list[Obj], threshold: int) -> list[Obj]:
    return _kept([o for o in objs if o.value > threshold], objs)


@atomic("filter", {(OBJS,): OBJS}, lambda rng, ctx, objs: _sample_threshold(rng, ctx, objs, False))
def smaller_than(ctx: TableContext, objs: list[Obj], threshold: int) -> list[Obj]:
    return _kept([o for o in objs if o.value < threshold], objs)


@atomic("position", {(OBJS,): OBJS}, _sample_k)
def leftmost_k(ctx: TableContext, objs: list[Obj], k: int) -> list[Obj]:
    _left_to_right(ctx, objs)
    _check_k(objs, k)
    return sorted(objs, key=lambda o: o.position)[:k]


@atomic("position", {(OBJS,): OBJS}, _sample_k)
def rightmost_k(ctx: TableContext, objs: list[Obj], k: int) -> list[Obj]:
    _left_to_right(ctx, objs)
    _check_k(objs, k)
    return sorted(objs, key=lambda o: o.position)[-k:]


def _present(objs: list[Obj], field: str) -> list[str]:
    return list(dict.fromkeys(getattr(o, field) for o in objs))


@atomic("exclude", {(OBJS,): OBJS}, lambda rng, ctx, objs: {"series": rng.choice(_present(objs, "series"))})
def exclude_by_legend(ctx: TableContext, objs: list[Obj], series: str) -> list[Obj]:
    _need_multi(ctx)
    return _kept([o for o in objs if o.series != series], objs)


@atomic("exclude", {(OBJS,): OBJS}, lambda rng, ctx, objs: {"category": rng.choice(_present(objs, "category"))})
def exclude_object(ctx: TableContext, objs: list[Obj], category: str) -> list[Obj]:
    return _kept([o for o in objs if o.category != category], objs)


@atomic("value", {(OBJ,): NUM, (OBJS,): NUMS})
def value_of_objects(ctx: TableContext, x: Obj | list[Obj]) -> int | list[int]:
    return x.value if isinstance(x, Obj) else [o.value for o in x]


@atomic("count", {(OBJS,): NUM})
def count_objects(ctx: TableContext, objs: list[Obj]) -> int:
    return len(objs)


@atomic("count", {(OBJS,): NUM})
def number_of_colours(ctx: TableContext, objs: list[Obj]) -> int:
    if len(ctx.colours) < 2:
        raise Reject("not_applicable")  # a one-colour chart: the answer is always 1
    return len(_present(objs, "colour"))


@atomic("count", {(OBJS,): NUM})
def number_of_legends(ctx: TableContext, objs: list[Obj]) -> int:
    _need_multi(ctx)
    return len(_present(objs, "series"))


@atomic("text_information", {(OBJ,): TEXT})
def colour_of(ctx: TableContext, o: Obj) -> str:
    return o.colour


@atomic("text_information", {(OBJ,): TEXT})
def legend_of(ctx: TableContext, o: Obj) -> str:
    _need_multi(ctx)
    return o.series


@atomic("text_information", {(OBJ,): TEXT})
def label_of(ctx: TableContext, o: Obj) -> str:
    return o.category


def _trend(ctx: TableContext, objs: list[Obj], rising: bool) -> bool:
    _left_to_right(ctx, objs)
    at_least(objs, 3)
    v = [o.value for o in sorted(objs, key=lambda o: o.position)]
    pairs = zip(v, v[1:])
    return all(a < b for a, b in pairs) if rising else all(a > b for a, b in pairs)


@atomic("condition", {(OBJS,): BOOL})
def consistently_increasing(ctx: TableContext, objs: list[Obj]) -> bool:
    return _trend(ctx, objs, rising=True)


@atomic("condition", {(OBJS,): BOOL})
def consistently_decreasing(ctx: TableContext, objs: list[Obj]) -> bool:
    return _trend(ctx, objs, rising=False)


@atomic("condition", {(OBJS,): BOOL})
def all_same_value(ctx: TableContext, objs: list[Obj]) -> bool:
    at_least(objs, 2)
    return all(o.value == objs[0].value for o in objs)
