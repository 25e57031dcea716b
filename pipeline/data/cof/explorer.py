"""Typed random walks over the function graph: Chain-of-Functions chains.

    rejected = Counter()
    steps = explore(rng, ctx, "number", length=5, max_subchains=3, rejected=rejected)

A chain is 1..max_subchains sub-chains, each a walk that starts with a selection
and whose every step takes the previous step's output type; several sub-chains
each end in NUM and are joined left to right by binary value functions
((a op b) op c), and a unary value function may follow. The length is the number
of function applications, joiners included. Which functions may come next is
decided by a reachability table over (last function, type, steps left), so a
walk never enters a state from which its target type is out of reach. A failed
application (`Reject`) is counted by reason and the step retries another
function; a step with no working function abandons the chain.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pipeline.data.cof.core import BOOL, FUNCTIONS, NUM, TEXT, Reject
from pipeline.data.cof.tables import TableContext

TABLE = "TABLE"  # the type before a selection: the walk's start state
ANSWER_TYPES = {"number": NUM, "binary": BOOL, "text": TEXT}
# Functions tried per step before the chain is abandoned: enough to get past an
# inapplicable pick (e.g. a legend function on a one-series chart) cheaply.
STEP_TRIES = 3
# g right after f is trivial or redundant: its result is known from the question
# (the number of legends among one series' bars is 1; the 2 largest counted is 2),
# or g empties what f left (excluding the only category of a group).
BANNED_PAIRS = frozenset(
    [
        ("series_selection", "number_of_legends"),
        ("series_selection", "exclude_by_legend"),
        ("series_selection", "number_of_colours"),
        ("colour_selection", "number_of_colours"),
        ("colour_selection", "number_of_legends"),
        ("colour_selection", "exclude_by_legend"),
        ("category_selection", "exclude_object"),
        ("one_object", "label_of"),
        ("one_object", "legend_of"),
        ("top_k", "max_one_object"),
        ("bottom_k", "min_one_object"),
    ]
    + [(f, "count_objects") for f in ("top_k", "bottom_k", "leftmost_k", "rightmost_k")]
)


# Relative chance of a function among the type-correct options (default 1). The
# fillers that fit almost anywhere (x constant, counts) would otherwise crowd out
# the list statistics, which need a value list first.
WEIGHTS = {
    "multiply_by_constant": 0.4,
    "count_objects": 0.5,
    "number_of_colours": 0.5,
    "number_of_legends": 0.5,
    "value_of_objects": 2.5,
}


@dataclass
class Step:
    """One function application: what ran, on which earlier steps, and its result."""

    fn: str
    args: dict[str, Any]
    inputs: tuple[int, ...]  # indices of the steps whose outputs this one consumes
    out_type: str
    value: Any


def _names(arity: int, out: str | None = None) -> tuple[str, ...]:
    return tuple(
        name
        for name, fn in FUNCTIONS.items()
        if any(len(sig) == arity and (out is None or o == out) for sig, o in fn.signature.items())
    )


SELECTIONS = _names(0)
UNARY = _names(1)
NUM_JOINERS = _names(2, NUM)
BOOL_JOINERS = _names(2, BOOL)
POST_UNARY = tuple(n for n in UNARY if FUNCTIONS[n].signature.get((NUM,)) == NUM)


@lru_cache(maxsize=None)
def successors(last: str | None, cur: str) -> tuple[tuple[str, str], ...]:
    """(function, output type) pairs that may follow `last`, whose output has type `cur`."""
    if last is None:
        return tuple((n, FUNCTIONS[n].signature[()]) for n in SELECTIONS)
    out = []
    for name in UNARY:
        typ = FUNCTIONS[name].signature.get((cur,))
        if typ and name != last and (last, name) not in BANNED_PAIRS:
            out.append((name, typ))
    return tuple(out)


@lru_cache(maxsize=None)
def can_finish(last: str | None, cur: str, remaining: int, end: str) -> bool:
    """Can exactly `remaining` more unary steps turn type `cur` into `end`?"""
    if remaining == 0:
        return cur == end
    return any(can_finish(n, t, remaining - 1, end) for n, t in successors(last, cur))


@lru_cache(maxsize=None)
def _options(last: str | None, cur: str, remaining: int, end: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, t) for n, t in successors(last, cur) if can_finish(n, t, remaining, end))


def _apply(
    rng: random.Random,
    ctx: TableContext,
    options: tuple[tuple[str, str], ...],
    inputs: tuple[int, ...],
    steps: list[Step],
    rejected: Counter,
) -> int:
    """Run the first of up to STEP_TRIES weighted random options that works; append it; return its index."""
    values = [steps[i].value for i in inputs]
    # Weighted sampling without replacement (Efraimidis-Spirakis): the largest u^(1/w) win.
    keyed = sorted(((rng.random() ** (1.0 / WEIGHTS.get(n, 1.0)), n, t) for n, t in options), reverse=True)
    for _, name, out in keyed[:STEP_TRIES]:
        fn = FUNCTIONS[name]
        try:
            args = fn.sample(rng, ctx, *values)
            value = fn.run(ctx, *values, **args)
        except Reject as r:
            rejected[r.reason] += 1
            continue
        steps.append(Step(name, args, inputs, out, value))
        return len(steps) - 1
    raise Reject("dead_end")


def _walk(rng: random.Random, ctx: TableContext, length: int, end: str, steps: list[Step], rejected: Counter) -> int:
    """Append one sub-chain of exactly `length` steps ending in type `end`; return its last index."""
    last, cur, inputs = None, TABLE, ()
    for i in range(length):
        options = _options(last, cur, length - i - 1, end)
        if not options:
            raise Reject("no_path")
        index = _apply(rng, ctx, options, inputs, steps, rejected)
        last, cur, inputs = steps[index].fn, steps[index].out_type, (index,)
    return inputs[0]


def _plan(rng: random.Random, end: str, length: int, max_subchains: int) -> tuple[list[int], int]:
    """Sub-chain lengths and the number of trailing unary steps for a chain of `length`."""
    options = []
    if can_finish(None, TABLE, length, end):
        options.append((1, 0))
    if end != TEXT:  # only an object yields text, and joiners take numbers
        for m in range(2, max_subchains + 1):
            for post in (0, 1) if end == NUM else (0,):
                if length - (m - 1) - post >= 2 * m:  # a numeric sub-chain takes >= 2 steps
                    options.append((m, post))
    if not options:
        raise Reject("no_plan")
    m, post = rng.choice(options)
    if m == 1:
        return [length], 0
    parts = [2] * m
    for _ in range(length - (m - 1) - post - 2 * m):
        parts[rng.randrange(m)] += 1
    return parts, post


def _signature(steps: list[Step]) -> tuple:
    return tuple((s.fn, tuple(sorted(s.args.items()))) for s in steps)


def explore(
    rng: random.Random, ctx: TableContext, answer_type: str, length: int, max_subchains: int, rejected: Counter
) -> list[Step]:
    """One chain of exactly `length` applications whose answer has `answer_type`; raises Reject."""
    end = ANSWER_TYPES[answer_type]
    parts, post = _plan(rng, end, length, max_subchains)
    steps: list[Step] = []
    ends, spans = [], set()
    for part in parts:
        start = len(steps)
        ends.append(_walk(rng, ctx, part, end if len(parts) == 1 else NUM, steps, rejected))
        span = _signature(steps[start:])
        if span in spans:
            raise Reject("identical_operands")  # "A minus A" asks nothing
        spans.add(span)
    acc = ends[0]
    for i, other in enumerate(ends[1:], start=2):
        joiners = BOOL_JOINERS if end == BOOL and i == len(parts) else NUM_JOINERS
        out = BOOL if joiners is BOOL_JOINERS else NUM
        acc = _apply(rng, ctx, tuple((n, out) for n in joiners), (acc, other), steps, rejected)
    for _ in range(post):
        acc = _apply(rng, ctx, tuple((n, NUM) for n in POST_UNARY), (acc,), steps, rejected)
    return steps
