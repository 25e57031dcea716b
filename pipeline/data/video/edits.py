"""Edit operations: one instruction, applied the same way to every frame's scene.

    edit = choose_edit(random.Random(0), table, {"highlight": 1.0}, layout.vmax, frames)   # frames: values per frame
    target_scene = edit.apply(source_scene)         # per frame, so the target keeps the source's motion
    edit.instruction                                 # "Highlight the Feb bar with a gold outline."

An edit changes the scene (values, colours, visibility, outlines, notes), never
the layout, so the y scale and every unedited mark stay where they were; the
edited region is then the boxes of the marks that `draw` reports as changed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np

from pipeline.data.cof.tables import COLOURS, MARK_NOUNS
from pipeline.data.video.render import Scene, rgb

EDIT_OPS = ("highlight", "recolour", "remove", "annotate", "change_value")
NOTE_TEXTS = ("Peak", "Note", "Goal", "Key", "Check")


@dataclass(frozen=True)
class Edit:
    op: str
    marks: tuple[tuple[int, int], ...]  # the (category, series) marks it acts on
    instruction: str
    series: int | None = None  # a whole-series edit (legend entry included)
    colour: str | None = None  # recolour: the new colour's name
    delta: float = 0.0  # change_value: added to the value in every frame
    text: str = ""  # annotate: the note's text

    def apply(self, scene: Scene) -> Scene:
        """The edited copy of one frame's scene."""
        marks = frozenset(self.marks)
        if self.op == "highlight":
            return replace(scene, outlined=scene.outlined | marks)
        if self.op == "remove":
            hidden_series = scene.hidden_series | ({self.series} if self.series is not None else set())
            return replace(scene, hidden=scene.hidden | marks, hidden_series=frozenset(hidden_series))
        if self.op == "annotate":
            (i, j), = self.marks
            return replace(scene, notes=scene.notes + ((i, j, self.text),))
        if self.op == "recolour":
            colours = [row[:] for row in scene.colours]
            for i, j in self.marks:
                colours[i][j] = rgb(self.colour)
            series_colours = list(scene.series_colours)
            if self.series is not None:
                series_colours[self.series] = rgb(self.colour)
            return replace(scene, colours=colours, series_colours=series_colours)
        if self.op == "change_value":
            values = scene.values.copy()
            for i, j in self.marks:
                values[i, j] = max(values[i, j] + self.delta, 0.0)
            return replace(scene, values=values)
        raise ValueError(f"unknown edit op {self.op!r}")


def mark_name(table: dict, i: int, j: int) -> str:
    """"the Feb bar", or "the 2024 bar of Feb" in a multi-series chart."""
    noun = MARK_NOUNS[table["chart_type"]][0]
    if len(table["series"]) > 1:
        return f"the {table['series'][j]} {noun} of {table['categories'][i]}"
    return f"the {table['categories'][i]} {noun}"


def mark_colour(table: dict, i: int, j: int) -> str:
    """The colour of mark (category i, series j): per category or per series, as the table colours its marks."""
    return table["colours"][i if table["colour_by"] == "category" else j]


def choose_edit(rng: random.Random, table: dict, weights: dict[str, float], vmax: float,
                frames: list[np.ndarray]) -> Edit:
    """A random edit of `table` drawn by op weight; series-level where the chart colours by series.

    `frames` are the values[category][series] of every frame (the data dynamics): a value change must fit the
    axis in all of them. An op that has no valid instance on the drawn mark (no unused colour left to recolour
    with, no value step that fits) is dropped and the op drawn again from the rest; `highlight`, which always
    applies, is the last resort.
    """
    ops = [op for op in EDIT_OPS if weights.get(op, 0) > 0]
    op = rng.choices(ops, weights=[weights[o] for o in ops])[0]
    n_cat, n_ser = len(table["categories"]), len(table["series"])
    i, j = rng.randrange(n_cat), rng.randrange(n_ser)
    while True:
        edit = _edit(rng, op, table, i, j, vmax, frames)
        if edit is not None:
            return edit
        ops.remove(op)
        op = rng.choices(ops, weights=[weights[o] for o in ops])[0] if ops else "highlight"


def _edit(rng: random.Random, op: str, table: dict, i: int, j: int, vmax: float,
          frames: list[np.ndarray]) -> Edit | None:
    """Edit `op` of mark (i, j), or None where the op has no valid instance there."""
    n_cat, n_ser = len(table["categories"]), len(table["series"])
    by_series = table["colour_by"] == "series" and n_ser > 1
    column = tuple((k, j) for k in range(n_cat))
    if op == "highlight":
        return Edit(op, ((i, j),), f"Highlight {mark_name(table, i, j)} with a gold outline.")
    if op == "annotate":
        text = rng.choice(NOTE_TEXTS)
        return Edit(op, ((i, j),), f'Add the label "{text}" above {mark_name(table, i, j)}.', text=text)
    if op == "recolour":
        unused = [c for c in COLOURS if c not in table["colours"]]
        if not unused:  # a chart that already shows every colour: a new one would repeat another mark's
            return None
        old, new = mark_colour(table, i, j), rng.choice(unused)
        if by_series or table["chart_type"] == "line":
            what = f"the {table['series'][j]} series" if n_ser > 1 else "the line"
            return Edit(op, column, f"Recolour {what} from {old} to {new}.", series=j, colour=new)
        return Edit(op, ((i, j),), f"Recolour {mark_name(table, i, j)} from {old} to {new}.", colour=new)
    if op == "remove":
        if by_series:
            return Edit(op, column, f"Remove the {table['series'][j]} series.", series=j)
        return Edit(op, ((i, j),), f"Remove {mark_name(table, i, j)}.")
    delta = _value_step(rng, table, i, j, vmax, frames)
    if delta is None:
        return None
    verb = "Increase" if delta > 0 else "Decrease"
    return Edit(op, ((i, j),), f"{verb} the value of {mark_name(table, i, j)} by {abs(delta):g} in every frame.",
                delta=delta)


def _value_step(rng: random.Random, table: dict, i: int, j: int, vmax: float,
                frames: list[np.ndarray]) -> float | None:
    """change_value's delta: one or two steps of the y axis (an eighth of it, rounded), up or down, such that
    0 < value + delta in every frame and the mark's top stays on the axis (at most vmax; a stacked segment's
    top is its category's total). None when no step fits every frame: the edited value would be clamped at
    zero or drawn clipped at the axis top in some frame, and the instruction would not hold there."""
    stacked = table["chart_type"] == "stacked_bar"
    values = np.array([np.asarray(f, dtype=float)[i, j] for f in frames])
    tops = np.array([np.asarray(f, dtype=float)[i].sum() for f in frames]) if stacked else values
    step = max(1, round(vmax / 8))
    fits = [d for d in (-2 * step, -step, step, 2 * step) if (values + d > 0).all() and (tops + d <= vmax).all()]
    return float(rng.choice(fits)) if fits else None
