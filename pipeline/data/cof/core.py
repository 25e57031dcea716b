"""Types, the registry and the guards that every atomic function shares.

    from pipeline.data.cof.core import FUNCTIONS, Reject
    FUNCTIONS["top_k"].run(ctx, objs, k=2)   # raises Reject("tie") on a tied boundary

Each atomic function has a name, a group (its kind: selection, min_max, filter,
arithmetic, ...; with the answer type they give a question's task type), a
signature (input types -> output type; a selection takes no input, it reads the
table), `run(ctx, *inputs, **args)` and `sample(rng, ctx, *inputs) -> args`. A
degenerate application raises `Reject(reason)`; the explorer counts the reasons.
Types: OBJS (a list of >= 1 objects, in table order), OBJ (one object), NUM (an
int, or a float rounded to 2 decimals), NUMS, TEXT, BOOL. The functions register
themselves from `functions.py` (selection and object layers) and `values.py`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.core.io import ConfigError
from pipeline.data.cof.tables import Obj, TableContext

OBJS, OBJ, NUM, NUMS, TEXT, BOOL = "OBJS", "OBJ", "NUM", "NUMS", "TEXT", "BOOL"
# Results are written with 2 decimals: below 0.1 that rounding alone could be a
# >5% error, and beyond a million the numbers stop looking like chart data.
MIN_ABS, MAX_ABS = 0.1, 1e6


class Reject(Exception):
    """A degenerate or inapplicable function application; `reason` names the rule."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Atomic:
    name: str
    group: str
    signature: dict[tuple[str, ...], str]  # input types -> output type; () for a selection
    run: Callable[..., Any]
    sample: Callable[..., dict]


FUNCTIONS: dict[str, Atomic] = {}


def no_args(rng: random.Random, ctx: TableContext, *inputs: Any) -> dict:
    return {}


def atomic(
    group: str, signature: dict[tuple[str, ...], str], sample: Callable[..., dict] = no_args, name: str = ""
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated `run` function under `name` (default: its own name)."""

    def register(run: Callable[..., Any]) -> Callable[..., Any]:
        key = name or run.__name__
        FUNCTIONS[key] = Atomic(key, group, signature, run, sample)
        return run

    return register


def at_least(items: list, n: int) -> None:
    if len(items) < n:
        raise Reject("too_few")


def as_num(x: float) -> int | float:
    """A computed number as the steps write it: rounded to 2 decimals, int when whole."""
    if not math.isfinite(x):
        raise Reject("not_finite")
    if abs(x) > MAX_ABS:
        raise Reject("too_large")
    if x != 0 and abs(x) < MIN_ABS:
        raise Reject("too_small")
    r = round(x, 2)
    return int(r) if r == int(r) else r


def value_key(o: Obj) -> int:
    return o.value


def parse_held_out(pairs: list[str], path: Path | str = "params.yaml") -> set[tuple[str, str]]:
    """{("f", "g")} from ["f>g"]; an unknown function name is bad params (synthesize.ood_held_out_pairs)."""
    out = set()
    for pair in pairs:
        f, sep, g = pair.partition(">")
        if not sep or f not in FUNCTIONS or g not in FUNCTIONS:
            raise ConfigError(f"{path}: synthesize.ood_held_out_pairs: {pair!r} is not 'f>g' with known functions")
        out.add((f, g))
    return out
