"""Temporal questions: function chains over the frames of a clip's data dynamics.

    rows = temporal_questions(random.Random(0), table, frame_values, frame_numbers, n=2, ...)

`frame_values[k][i][j]` is the value of mark (category i, series j) in the
listed frame `frame_numbers[k]` (1-based). Four chains, each step one
`Step k:` sentence whose value comes after its last separator (the style of
pipeline/data/cof/verbalize.py, read back by `pipeline.data.grading.step_value`):

- change: the value in frame b minus the value in frame a (number);
- first_exceeding: the first listed frame where mark A is above mark B (number);
- rises_throughout: is a mark strictly higher in every listed frame than in the one before (Yes/No);
- largest_change: the mark largest in the last frame, and its change since the first (number).

The rows have the reasoning-example columns (pipeline/core/io.py EXAMPLE_SCHEMA):
the prompt lists the values at the listed frames, so the text student can
answer, and `pipeline.data.grading.grade` grades them like any other question.
"""

from __future__ import annotations

import json
import random

from pipeline.data.cof.tables import MARK_NOUNS, Obj, fmt_num, fmt_obj, fmt_objs, spans_series
from pipeline.data.cof.verbalize import _operand
from pipeline.data.video.edits import mark_colour, mark_name

CHAINS = ("change", "first_exceeding", "rises_throughout", "largest_change")


def _marks(table: dict) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(table["categories"])) for j in range(len(table["series"]))]


def _obj(table: dict, values, i: int, j: int) -> Obj:
    """Mark (i, j) at one frame as a Chain-of-Functions object, for its "Jan (2024) 11.5" text. The value is
    already text: fmt_obj prints it as given, and a frame's float (13.0) must read as fmt_num writes it (13)."""
    return Obj(table["categories"][i], table["series"][j], fmt_num(values[i][j]), mark_colour(table, i, j), i)


def format_video_prompt(table: dict, frame_values: list, frame_numbers: list[int], n_frames: int, question: str) -> str:
    """Chart header, the values of every mark at each listed frame, the question."""
    head = f"Video: {table['chart_type'].replace('_', ' ')} chart, {n_frames} frames. " \
           f"Title: {table['title']} ({table['unit']})."
    if len(table["series"]) > 1:
        head += f" Series: {', '.join(table['series'])}."
    cells = []
    for number, values in zip(frame_numbers, frame_values):
        row = "; ".join(f"{c} {', '.join(fmt_num(v) for v in values[i])}" for i, c in enumerate(table["categories"]))
        cells.append(f"Frame {number}: {row}")
    return f"{head}\n{' | '.join(cells)}\nQuestion: {question}\n"


def _series_text(values: list[float]) -> str:
    return ", ".join(fmt_num(v) for v in values)


def _change(rng, table, fv, frames) -> tuple | None:
    i, j = rng.choice(_marks(table))
    a, b = sorted(rng.sample(range(len(frames)), 2))
    name, va, vb = mark_name(table, i, j), fv[a][i][j], fv[b][i][j]
    question = f"By how much does the value of {name} change from frame {frames[a]} to frame {frames[b]}?"
    d = round(vb - va, 2)
    steps = [
        ("frame_value", f"Select {name} in frame {frames[a]}: {fmt_num(va)}.", fmt_num(va)),
        ("frame_value", f"Select {name} in frame {frames[b]}: {fmt_num(vb)}.", fmt_num(vb)),
        ("A_minus_B", f"{fmt_num(vb)} - {_operand(va)} = {fmt_num(d)}.", fmt_num(d)),
    ]
    return question, steps, "number", "temporal_change"


def _first_exceeding(rng, table, fv, frames) -> tuple | None:
    pairs = [(p, q) for p in _marks(table) for q in _marks(table) if p != q]
    rng.shuffle(pairs)

    def above(p, q):
        return [k for k in range(len(frames)) if fv[k][p[0]][p[1]] > fv[k][q[0]][q[1]]]

    # Prefer a crossing (B ahead at the start, A ahead later): the answer is not frame 1.
    good = [(p, q) for p, q in pairs if above(p, q) and above(p, q)[0] > 0] or [(p, q) for p, q in pairs if above(p, q)]
    if not good:
        return None
    p, q = good[0]
    ks = above(p, q)
    na, nb = mark_name(table, *p), mark_name(table, *q)
    listed = ", ".join(map(str, frames))
    question = f"In which listed frame is {na} first above {nb}?"
    va = [fv[k][p[0]][p[1]] for k in range(len(frames))]
    vb = [fv[k][q[0]][q[1]] for k in range(len(frames))]
    hits = ", ".join(str(frames[k]) for k in ks)
    steps = [
        ("frame_series", f"Select {na} in frames {listed}: {_series_text(va)}.", _series_text(va)),
        ("frame_series", f"Select {nb} in frames {listed}: {_series_text(vb)}.", _series_text(vb)),
        ("frames_where_greater", f"The frames where the first is larger are {hits}.", hits),
        ("first_frame", f"The first of them is {frames[ks[0]]}.", str(frames[ks[0]])),
    ]
    return question, steps, "number", "temporal_comparison"


def _rises_throughout(rng, table, fv, frames) -> tuple | None:
    i, j = rng.choice(_marks(table))
    name = mark_name(table, i, j)
    values = [fv[k][i][j] for k in range(len(frames))]
    rises = all(b > a for a, b in zip(values, values[1:]))
    answer = "Yes" if rises else "No"
    listed = ", ".join(map(str, frames))
    steps = [
        ("frame_series", f"Select {name} in frames {listed}: {_series_text(values)}.", _series_text(values)),
        ("rises_throughout", f"Rising in every listed frame: {answer}.", answer),
    ]
    return f"Does {name} rise in every listed frame?", steps, "binary", "temporal_trend"


def _largest_change(rng, table, fv, frames) -> tuple | None:
    last = fv[-1]
    marks = _marks(table)
    top = max(last[i][j] for i, j in marks)
    winners = [(i, j) for i, j in marks if last[i][j] == top]
    if len(winners) != 1 or len(marks) < 2:
        return None  # a tie has no single answer
    (i, j), noun = winners[0], MARK_NOUNS[table["chart_type"]]
    first_v, last_v = fv[0][i][j], last[i][j]
    objs = [_obj(table, last, a, b) for a, b in marks]
    listing = fmt_objs(objs)
    d = round(last_v - first_v, 2)
    question = (f"By how much does the {noun[0]} that is largest in frame {frames[-1]} change "
                f"from frame {frames[0]} to frame {frames[-1]}?")
    winner = fmt_obj(_obj(table, last, i, j), spans_series(objs))
    steps = [
        ("frame_objects", f"Select all {noun[1]} in frame {frames[-1]}: {listing}.", listing),
        ("max_one_object", f"The largest of them is {winner}.", winner),
        ("frame_value", f"Select {mark_name(table, i, j)} in frame {frames[0]}: {fmt_num(first_v)}.", fmt_num(first_v)),
        ("A_minus_B", f"{fmt_num(last_v)} - {_operand(first_v)} = {fmt_num(d)}.", fmt_num(d)),
    ]
    return question, steps, "number", "temporal_change"


BUILDERS = {"change": _change, "first_exceeding": _first_exceeding, "rises_throughout": _rises_throughout,
            "largest_change": _largest_change}


def temporal_questions(rng: random.Random, table: dict, frame_values: list, frame_numbers: list[int],
                       n: int, n_frames: int) -> list[dict]:
    """Up to `n` questions with distinct chains (a chain with no valid instance is skipped)."""
    rows = []
    for chain in rng.sample(CHAINS, len(CHAINS)):
        if len(rows) == n:
            break
        built = BUILDERS[chain](rng, table, frame_values, frame_numbers)
        if built is None:
            continue
        question, steps, answer_type, task = built
        answer = steps[-1][2]
        lines = [f"Step {k}: {text}" for k, (_, text, _) in enumerate(steps, start=1)]
        functions = [fn for fn, _, _ in steps]
        rows.append({
            "chart_type": table["chart_type"],
            "table": json.dumps({**table, "frames": frame_numbers, "frame_values": frame_values}, sort_keys=True),
            "question": question,
            "prompt": format_video_prompt(table, frame_values, frame_numbers, n_frames, question),
            "answer": answer,
            "answer_type": answer_type,
            "functions": functions,
            "groups": ["temporal"],
            "steps": [{"function": fn, "text": text, "value": v} for fn, text, v in steps],
            "rationale": "\n".join(lines) + f"\nAnswer: {answer}",
            "chain_length": len(steps),
            "task_type": task,
        })
    return rows
