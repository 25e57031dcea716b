"""One video sample from one synthesized table: plan, clips, filter scores, temporal questions.

    plan = make_plan(table, cfg, seed)             # data dynamics, camera, edit; seeded by (cfg.seed, row id)
    sample = make_sample(row, cfg, backend)         # .clips .scores .reasons .questions; ValueError: a bad table

Data dynamics: the table moves from its own values (state A) to a second state
B, each value shifted by up to `value_drift` times the table's largest value
(rounded to integers, as a table is); frame k shows A + (B - A) * ease(k / (F - 1))
rounded to one decimal, the same numbers the temporal questions read.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np

from pipeline.data.cof.tables import MARK_NOUNS
from pipeline.data.video.backends import Clips, Plan
from pipeline.data.video.edits import choose_edit
from pipeline.data.video.filters import failures, score
from pipeline.data.video.questions import temporal_questions
from pipeline.data.video.render import Camera, Layout, ease, nice_max


def table_states(rng: random.Random, table: dict, drift: float) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(table["values"], dtype=float)
    shift = np.array([[rng.uniform(-drift, drift) for _ in row] for row in a]) * a.max()
    b = np.maximum(np.round(a + shift), 1.0)
    if np.array_equal(a, b):  # a clip whose data never moves has no data dynamics to ask about
        b[0, 0] += 1
    return a, b


def frame_values(a: np.ndarray, b: np.ndarray, frames: int) -> list[np.ndarray]:
    return [np.round(a + (b - a) * ease(k / max(frames - 1, 1)), 1) for k in range(frames)]


def choose_camera(rng: random.Random, cfg) -> Camera:
    return Camera(
        zoom=1 + rng.uniform(-cfg.max_zoom / 2, cfg.max_zoom),
        pan_x=rng.uniform(-cfg.max_pan, cfg.max_pan) * cfg.width,
        pan_y=rng.uniform(-cfg.max_pan, cfg.max_pan) * cfg.height,
        rotation=rng.uniform(-cfg.max_rotation, cfg.max_rotation),
    )


def make_plan(table: dict, cfg, seed: int) -> Plan:
    """Everything random about a sample, drawn from one seeded generator in a fixed order."""
    rng = random.Random(seed)
    a, b = table_states(rng, table, cfg.value_drift)
    stacked = table["chart_type"] == "stacked_bar"
    top = max((a.sum(1) if stacked else a).max(), (b.sum(1) if stacked else b).max())
    layout = Layout(table, cfg.width, cfg.height, vmax=nice_max(float(top) * 1.1))
    frames = frame_values(a, b, cfg.frames)
    edit = choose_edit(rng, table, cfg.edit_ops, layout.vmax, frames)  # a value change must fit every frame
    camera = choose_camera(rng, cfg)
    return Plan(table, layout, frames, camera, edit, seed)


def listed_frames(frames: int, k: int) -> list[int]:
    """`k` evenly spaced frame indices (0-based), first and last included."""
    return sorted({round(x) for x in np.linspace(0, frames - 1, min(k, frames))})


@dataclass
class Sample:
    row_id: str
    plan: Plan
    clips: Clips
    scores: dict
    reasons: list[str]
    questions: list[dict] = field(default_factory=list)


def sample_seed(seed: int, row_id: str) -> int:
    """A per-sample seed that does not depend on which other rows are in the run."""
    return random.Random(f"{seed}:{row_id}").getrandbits(32)


TABLE_KEYS = ("chart_type", "title", "unit", "categories", "series", "values", "colours", "colour_by")


def parse_table(text) -> dict:
    """A row's `table` JSON as a dict; ValueError saying what is wrong when it is not a chart table."""
    try:
        table = json.loads(text)
    except (TypeError, ValueError) as exc:  # not a string, or not JSON
        raise ValueError(f"table is not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(table, dict):
        raise ValueError(f"table is a JSON {type(table).__name__}, not an object")
    missing = [k for k in TABLE_KEYS if k not in table]
    if missing:
        raise ValueError(f"table lacks {', '.join(missing)}")
    if table["chart_type"] not in MARK_NOUNS:
        raise ValueError(f"table chart_type {table['chart_type']!r} is not one of {', '.join(MARK_NOUNS)}")
    if not all(isinstance(table[k], list) for k in ("categories", "series", "colours")):
        raise ValueError("table categories, series and colours must be lists")
    try:
        values = np.asarray(table["values"], dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"table values are not numbers ({exc})") from None
    if values.shape != (len(table["categories"]), len(table["series"])) or values.size == 0:
        raise ValueError(f"table values have shape {values.shape}, not (categories, series)")
    if not np.isfinite(values).all():
        raise ValueError("table values include NaN or infinity")
    if len(table["colours"]) < values.shape[0 if table["colour_by"] == "category" else 1]:
        raise ValueError(f"table has {len(table['colours'])} colours, fewer than its marks' {table['colour_by']}s")
    return table


def make_sample(row: dict, cfg, backend, table: dict | None = None) -> Sample:
    """One row's clips, scores, filter verdicts and questions; `table` is the row's parsed table when the caller
    has it."""
    table = parse_table(row["table"]) if table is None else table
    seed = sample_seed(cfg.seed, row["id"])
    plan = make_plan(table, cfg, seed)
    clips = backend.clips(plan)
    scores = score(clips.source, clips.target, clips.masks)
    questions = []
    if backend.name == "procedural":  # the data dynamics are known only where they were drawn
        ks = listed_frames(cfg.frames, cfg.question_frames)
        values = [plan.frame_values[k].tolist() for k in ks]
        questions = temporal_questions(random.Random(seed + 1), table, values, [k + 1 for k in ks],
                                       cfg.questions_per_sample, cfg.frames)
    return Sample(row["id"], plan, clips, scores, failures(scores, cfg), questions)
