"""pipeline/data/video: raster charts, edits and their masks, filters, temporal questions, MP4 files, the stage core."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from pipeline.core.io import ConfigError, InputError
from pipeline.core.params import parse_section
from pipeline.data.grading import extract_answer, extract_steps, grade
from pipeline.data.params import AnimateConfig, SynthesizeConfig
from pipeline.data.video import filters
from pipeline.data.video.backends import ProceduralBackend, check_backend
from pipeline.data.video.clips import read_mp4, write_mp4
from pipeline.data.video.edits import EDIT_OPS, choose_edit
from pipeline.data.video.questions import temporal_questions
from pipeline.data.video.render import Layout, Scene, changed_region, draw, nice_max
from pipeline.data.video.sample import make_plan, make_sample

SMALL = AnimateConfig(frames=6, width=96, height=72, samples=3, contact_sheet=1)
CHARTS = ("bar", "grouped_bar", "stacked_bar", "line", "pie")


def table(chart_type: str = "bar", series: int = 1) -> dict:
    names = ["2023", "2024"][:series] if series > 1 else ["Sales"]
    values = [[12, 7][:series], [9, 15][:series], [17, 4][:series]]
    by_category = series == 1 and chart_type in ("bar", "pie")
    return {"chart_type": chart_type, "title": "Monthly sales", "unit": "k$", "categories": ["Jan", "Feb", "Mar"],
            "series": names, "values": values, "colours": ["red", "blue", "green"] if by_category else
            ["red", "blue"][:series], "colour_by": "category" if by_category else "series"}


def tables() -> list[dict]:
    return [table(c, 2 if c in ("grouped_bar", "stacked_bar") else 1) for c in CHARTS] + [table("line", 2)]


# --- renderer ---------------------------------------------------------------------------------------------

def test_nice_max_by_hand():
    assert nice_max(18.7) == 20  # 18.7 / 4 ticks = 4.7 -> step 5
    assert nice_max(4.0) == 4  # step 1
    assert nice_max(41.0) == 50  # 10.25 -> step 12.5


def test_nice_max_covers_and_is_tight():
    for v in (0.3, 1, 7.5, 18.7, 41, 99, 260):
        top = nice_max(v)
        assert v <= top <= 1.34 * v  # the next round step is at most a third above


@pytest.mark.parametrize("t", tables(), ids=lambda t: f"{t['chart_type']}-{len(t['series'])}")
def test_draw_is_deterministic_and_reports_every_mark(t):
    layout = Layout(t, 160, 120)
    scene = Scene.of(t, t["values"])
    a, marks = draw(layout, scene)
    b, _ = draw(layout, scene)
    assert a.shape == (120, 160, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
    for i in range(3):
        for j in range(len(t["series"])):
            box = marks[(i, j)][0]
            assert 0 <= box[0] < box[2] <= 160 + 8 and 0 <= box[1] < box[3] <= 120 + 8
    assert (a != 255).any()


def test_bar_height_follows_value():
    t = table("bar")
    _, marks = draw(Layout(t, 160, 120), Scene.of(t, t["values"]))
    heights = [marks[(i, 0)][0][3] - marks[(i, 0)][0][1] for i in range(3)]
    assert heights[2] > heights[0] > heights[1]  # 17 > 12 > 9


# --- edits ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", EDIT_OPS)
@pytest.mark.parametrize("t", tables(), ids=lambda t: f"{t['chart_type']}-{len(t['series'])}")
def test_edit_changes_only_its_region(op, t):
    layout = Layout(t, 160, 120)
    edit = choose_edit(random.Random(1), t, {op: 1.0}, layout.vmax, [np.asarray(t["values"], float)])
    scene = Scene.of(t, t["values"])
    src, src_marks = draw(layout, scene)
    tgt, tgt_marks = draw(layout, edit.apply(scene))
    from pipeline.data.video.render import region_mask

    mask = np.asarray(region_mask(changed_region(src_marks, tgt_marks), 160, 120, margin=1)) > 0
    assert edit.op == op and edit.instruction.endswith(".")
    assert not np.array_equal(src, tgt), "the edit shows"
    assert mask.any() and mask.mean() < 0.75
    assert np.array_equal(src[~mask], tgt[~mask]), "pixels outside the edited marks are untouched"


def test_instructions_name_the_mark():
    """The instruction names the mark (or series) the edit acts on, and no other."""
    cats = ("Jan", "Feb", "Mar")
    for t in (table("bar"), table("grouped_bar", 2)):
        layout = Layout(t, 160, 120)
        frames = [np.asarray(t["values"], float)]
        for seed in range(8):
            for op in EDIT_OPS:
                edit = choose_edit(random.Random(seed), t, {op: 1.0}, layout.vmax, frames)
                text = edit.instruction
                if edit.series is not None:  # grouped bars colour by series: a whole-series edit
                    assert len(edit.marks) == 3 and {j for _, j in edit.marks} == {edit.series}
                    assert f"the {t['series'][edit.series]} series" in text
                    assert t["series"][1 - edit.series] not in text and not any(c in text for c in cats)
                    continue
                (i, j), = edit.marks
                named = f"the {cats[i]} bar" if len(t["series"]) == 1 else f"the {t['series'][j]} bar of {cats[i]}"
                assert named in text, (op, text)
                assert not any(c in text for c in cats if c != cats[i])
                if len(t["series"]) > 1:
                    assert t["series"][1 - j] not in text


def _note_box(t: dict, i: int) -> tuple:
    from pipeline.data.video.edits import Edit

    layout = Layout(t, 320, 240)
    scene = Edit("annotate", ((i, 0),), "", text="Peak").apply(Scene.of(t, t["values"]))
    _, marks = draw(layout, scene)
    return layout, marks[("note", 0)][0]


@pytest.mark.parametrize("i", range(3))
def test_note_sits_above_its_bar_and_line_point(i):
    for chart in ("bar", "line"):
        t = table(chart)
        layout, (x0, y0, x1, y1) = _note_box(t, i)
        slot = (320 - 8 - 30) / 3  # plot left 30, right 320 - 8: three category slots
        x = 30 + (i + 0.5) * slot  # the bar's and the point's centre
        top = 222 - 200 * t["values"][i][0] / layout.vmax  # plot from y 22 down to 240 - 18
        assert abs((x0 + x1) / 2 - x) <= 2, chart
        assert 0 <= top - y1 <= 10, (chart, top, y1)  # just above the bar top / the point


@pytest.mark.parametrize("i", range(3))
def test_note_sits_at_its_pie_slice(i):
    t = table("pie")  # Jan 12, Feb 9, Mar 17 of 38, clockwise from 12 o'clock
    _, (x0, y0, x1, y1) = _note_box(t, i)
    cx, cy = (30 + 312) / 2, (22 + 222) / 2  # the plot box's centre
    values = [12, 9, 17]
    mid = -90 + 360 * (sum(values[:i]) + values[i] / 2) / sum(values)  # degrees clockwise from 3 o'clock
    angle = math.degrees(math.atan2((y0 + y1) / 2 - cy, (x0 + x1) / 2 - cx))
    assert abs((angle - mid + 180) % 360 - 180) < 30, (angle, mid)
    assert math.hypot((x0 + x1) / 2 - cx, (y0 + y1) / 2 - cy) > 60  # out by the rim (radius 88), not on the centre


def test_change_value_fits_the_axis_in_every_frame():
    t = table("bar")  # Jan 12, Feb 9, Mar 17
    vmax = 20.0  # one step = round(20 / 8) = 2
    falls = [np.array([[12.0 - 5 * k], [9.0], [17.0]]) for k in range(3)]  # Jan 12 -> 2: no decrease fits frame 3
    rises = [np.array([[12.0 + 3.5 * k], [9.0], [17.0]]) for k in range(3)]  # Jan 12 -> 19: no increase fits
    stuck = [np.array([[1.0 + 18.5 * k / 2], [9.0], [17.0]]) for k in range(3)]  # 1 -> 19.5: no step fits
    seen = {}
    for seed in range(40):
        for name, frames in (("falls", falls), ("rises", rises), ("stuck", stuck)):
            edit = choose_edit(random.Random(seed), t, {"change_value": 1.0, "highlight": 1.0}, vmax, frames)
            if edit.op == "change_value" and edit.marks == ((0, 0),):
                seen.setdefault(name, set()).add(edit.delta)
                for f in frames:
                    assert 0 < f[0, 0] + edit.delta <= vmax
    assert seen["falls"] == {2.0, 4.0} and seen["rises"] == {-2.0, -4.0} and "stuck" not in seen
    # nothing fits and no other op is weighted: the last resort, which always applies
    all_stuck = [np.full((3, 1), 1.0 + 18.5 * k / 2) for k in range(3)]  # every bar 1 -> 19.5
    assert choose_edit(random.Random(0), t, {"change_value": 1.0}, vmax, all_stuck).op == "highlight"


def test_recolour_with_every_colour_in_use_falls_back_to_another_op():
    from pipeline.data.cof.tables import COLOURS

    t = {**table("pie"), "categories": [f"C{k}" for k in range(len(COLOURS))],
         "values": [[k + 1] for k in range(len(COLOURS))], "colours": list(COLOURS)}
    frames = [np.asarray(t["values"], float)]
    for seed in range(5):
        edit = choose_edit(random.Random(seed), t, {"recolour": 1.0, "remove": 1.0}, 40.0, frames)
        assert edit.op == "remove"


# --- filters on hand-made frames --------------------------------------------------------------------------

def test_ssim_by_hand():
    a = np.full((20, 20), 100, np.uint8)
    b = np.full((20, 20), 120, np.uint8)
    c1 = (0.01 * 255) ** 2
    # constant frames: no variance, so SSIM is the luminance term alone
    assert filters.ssim(a, a) == pytest.approx(1.0)
    assert filters.ssim(a, b) == pytest.approx((2 * 100 * 120 + c1) / (100**2 + 120**2 + c1), rel=1e-5)
    noise = np.random.default_rng(0).integers(0, 256, (32, 32)).astype(np.uint8)
    assert filters.ssim(noise, 255 - noise) < 0  # anti-correlated structure


def test_masked_ssim_and_psnr_ignore_the_mask():
    a = np.zeros((24, 24, 3), np.uint8)
    b = a.copy()
    b[2:6, 2:6] = 200  # the "edit"
    mask = np.zeros((24, 24), bool)
    mask[:8, :8] = True
    assert filters.psnr(a, b, ~mask) == filters.PSNR_CAP
    assert filters.ssim(a, b, ~mask) == pytest.approx(1.0)
    assert filters.ssim(a, b) < 1
    one = a.copy()
    one[0, 0, 0] = 10  # one channel of one pixel off by 10: mse = 100 / (24 * 24 * 3)
    assert filters.psnr(a, one) == pytest.approx(10 * math.log10(255**2 * 24 * 24 * 3 / 100))


def test_temporal_and_motion_filters():
    still = [np.full((32, 32, 3), 128, np.uint8)] * 4
    ramp = [np.full((32, 32, 3), 100 + 2 * k, np.uint8) for k in range(4)]
    rng = np.random.default_rng(0)
    flicker = [rng.integers(0, 256, (32, 32, 3)).astype(np.uint8) for _ in range(4)]
    assert filters.motion(still) == 0 and filters.motion(ramp) == pytest.approx(2.0, abs=1e-4)
    assert filters.temporal_ssim(still) == pytest.approx(1.0) and filters.temporal_ssim(flicker) < 0.1
    masks = [np.zeros((32, 32), bool)] * 4
    cfg = AnimateConfig()
    assert filters.failures(filters.score(still, still, masks), cfg) == ["motion"]
    assert filters.failures(filters.score(flicker, flicker, masks), cfg) == ["temporal"]
    leaked = [f.copy() for f in ramp]
    for f in leaked:
        f[:, :16] = 0  # an edit that also blacked out half of every frame, outside its (empty) mask
    assert filters.failures(filters.score(ramp, leaked, masks), cfg) == ["preservation"]
    assert filters.failures(filters.score(ramp, ramp, masks), cfg.model_copy(update={"min_motion": 1.0})) == []


def test_motion_and_temporal_ssim_are_what_score_reports():
    rng = np.random.default_rng(1)
    clip = [rng.integers(0, 256, (30, 34, 3)).astype(np.uint8) for _ in range(3)]
    scores = filters.score(clip, clip, [np.zeros((30, 34), bool)] * 3)
    assert scores["motion"] == round(filters.motion(clip), 3)
    assert scores["temporal_ssim"] == round(filters.temporal_ssim(clip), 4)
    # measured on 2x2 block means: a one-pixel checkerboard turning over is no motion there
    board = (np.indices((32, 32)).sum(0) % 2 * 200).astype(np.uint8)
    flips = [board, 200 - board, board]
    assert filters.motion(flips, scale=1) == pytest.approx(200.0) and filters.motion(flips) == 0
    assert filters.score(flips, flips, [np.zeros((32, 32), bool)] * 3)["motion"] == 0


# --- temporal questions -----------------------------------------------------------------------------------

FRAMES = [1, 4, 8]
VALUES = [[[10.0], [12.0], [5.0]], [[11.5], [11.0], [6.0]], [[13.0], [9.5], [4.0]]]  # [frame][category][series]


NOUNS = {"bar": "bar", "grouped_bar": "bar", "stacked_bar": "segment", "line": "point", "pie": "slice"}


def expected_answer(row: dict) -> str:
    """The answer to a temporal question worked out from its question text and the frame values in its table
    (not from its rationale): what a grader should accept."""
    t = json.loads(row["table"])
    frames, fv, q = t["frames"], t["frame_values"], row["question"]
    noun = NOUNS[t["chart_type"]]
    names = {(f"the {c} {noun}" if len(t["series"]) == 1 else f"the {s} {noun} of {c}"): (i, j)
             for i, c in enumerate(t["categories"]) for j, s in enumerate(t["series"])}

    def mark(text: str) -> tuple[int, int]:
        return names[max((n for n in names if text.startswith(n)), key=len)]

    def value(k: int, ij: tuple[int, int]) -> float:
        return fv[k][ij[0]][ij[1]]

    if q.startswith("By how much does the value of "):
        rest = q.removeprefix("By how much does the value of ")
        a, b = (frames.index(int(x)) for x in rest.rstrip("?").split(" from frame ")[1].split(" to frame "))
        return str(round(value(b, mark(rest)) - value(a, mark(rest)), 2))
    if q.startswith("In which listed frame is "):
        first, second = q.removeprefix("In which listed frame is ").rstrip("?").split(" first above ")
        return str(next(f for k, f in enumerate(frames) if value(k, mark(first)) > value(k, mark(second))))
    if q.startswith("Does "):
        ij = mark(q.removeprefix("Does "))
        return "Yes" if all(value(k + 1, ij) > value(k, ij) for k in range(len(frames) - 1)) else "No"
    assert q.startswith(f"By how much does the {noun} that is largest in frame {frames[-1]} change"), q
    top = max(names.values(), key=lambda ij: value(-1, ij))
    return str(round(value(-1, top) - value(0, top), 2))


def test_temporal_chains_by_hand_and_graded():
    t = table("bar")
    rows = temporal_questions(random.Random(0), t, VALUES, FRAMES, n=4, n_frames=8)
    by_task = {}
    for row in rows:
        assert grade(extract_answer(row["rationale"]), expected_answer(row), row["answer_type"]), row["question"]
        assert not grade("Maybe" if row["answer_type"] == "binary" else "-99", expected_answer(row), row["answer_type"])
        assert extract_steps(row["rationale"]) == [s["value"] for s in row["steps"]]
        assert row["prompt"].startswith("Video: bar chart, 8 frames.") \
            and "Frame 4: Jan 11.5; Feb 11; Mar 6" in row["prompt"]
        by_task.setdefault(row["functions"][-1], row)
    assert len(rows) == 4
    # Jan goes 10 -> 11.5 -> 13 and Feb 12 -> 11 -> 9.5: the only crossing, Jan first above Feb in frame 4
    first = by_task["first_frame"]
    assert first["answer"] == "4" \
        and first["question"].startswith("In which listed frame is the Jan bar first above the Feb")
    # the largest in frame 8 is Jan (13), which started at 10: a change of 3
    largest = next(r for r in rows if r["functions"][0] == "frame_objects")
    assert largest["answer"] == "3" and "The largest of them is Jan 13." in largest["rationale"]
    # the change chain by hand, from VALUES: e.g. Feb 12 -> 9.5 from frame 1 to frame 8 is -2.5
    change = next(r for r in rows if r["functions"][0] == "frame_value")
    words = change["question"].rstrip("?").split()  # By how much does the value of the Feb bar change from frame 1 ...
    by_hand = {("Jan", 1, 4): "1.5", ("Jan", 1, 8): "3", ("Jan", 4, 8): "1.5", ("Feb", 1, 4): "-1",
               ("Feb", 1, 8): "-2.5", ("Feb", 4, 8): "-1.5", ("Mar", 1, 4): "1", ("Mar", 1, 8): "-1",
               ("Mar", 4, 8): "-2"}
    assert change["answer"] == by_hand[(words[8], int(words[-4]), int(words[-1]))]
    rises = by_task["rises_throughout"]
    assert rises["answer"] == {"Jan": "Yes", "Feb": "No", "Mar": "No"}[rises["question"].split()[2]]
    assert not grade("No" if rises["answer"] == "Yes" else "Yes", rises["answer"], "binary")


def test_first_exceeding_prefers_a_crossing():
    t = table("bar")
    values = [[[1.0], [5.0], [9.0]], [[6.0], [5.0], [9.0]], [[7.0], [5.0], [9.0]]]
    for seed in range(5):
        rows = [r for r in temporal_questions(random.Random(seed), t, values, FRAMES, 4, 8)
                if r["functions"][-1] == "first_frame"]
        assert rows and rows[0]["answer"] == "4"  # Jan crosses Feb in frame 4; Mar leads all along


# --- clips, seeds, bad input -------------------------------------------------------------------------------

def _row(seed: int = 0, image_path: str | None = None) -> dict:
    from pipeline.data.cof.tables import random_table

    t = random_table(random.Random(seed), SynthesizeConfig(chart_types=["bar", "line", "grouped_bar"], max_series=2))
    return {"id": f"train-{seed:06d}", "table": json.dumps(t), "image_path": image_path}


def test_mp4_round_trip(tmp_path):
    sample = make_sample(_row(), SMALL, ProceduralBackend(SMALL))
    path = tmp_path / "clip.mp4"
    write_mp4(path, sample.clips.source, fps=SMALL.fps)
    frames, fps = read_mp4(path)
    assert len(frames) == SMALL.frames and frames[0].shape == (SMALL.height, SMALL.width, 3)
    assert fps == Fraction(SMALL.fps)
    assert filters.psnr(frames[0], sample.clips.source[0]) > 30  # H.264 at crf 18 keeps the chart


def test_target_equals_source_outside_the_edit_after_encoding(tmp_path):
    cfg = AnimateConfig(frames=6, width=160, height=120)
    for seed in range(3):
        sample = make_sample(_row(seed), cfg, ProceduralBackend(cfg))
        assert sample.scores["preserved_psnr"] == filters.PSNR_CAP  # the rendered frames: exact
        write_mp4(tmp_path / "s.mp4", sample.clips.source, cfg.fps)
        write_mp4(tmp_path / "t.mp4", sample.clips.target, cfg.fps)
        (src, _), (tgt, _) = read_mp4(tmp_path / "s.mp4"), read_mp4(tmp_path / "t.mp4")
        for s, t, m in zip(src, tgt, sample.clips.masks):
            assert filters.psnr(s, t, ~m) >= cfg.min_preserved_psnr  # decoded: within the filter threshold


def test_same_seed_gives_byte_identical_clips(tmp_path):
    def clip_bytes(cfg: AnimateConfig, name: str) -> bytes:
        sample = make_sample(_row(3), cfg, ProceduralBackend(cfg))
        write_mp4(tmp_path / name, sample.clips.target, cfg.fps)
        return (tmp_path / name).read_bytes()

    assert clip_bytes(SMALL, "a.mp4") == clip_bytes(SMALL, "b.mp4")
    assert clip_bytes(SMALL, "a.mp4") != clip_bytes(SMALL.model_copy(update={"seed": 1}), "c.mp4")


def test_plan_depends_on_seed_not_on_other_rows():
    t = json.loads(_row(5)["table"])
    a, b = make_plan(t, SMALL, 7), make_plan(t, SMALL, 7)
    assert a.camera == b.camera and a.edit == b.edit
    assert all(np.array_equal(x, y) for x, y in zip(a.frame_values, b.frame_values))
    assert not np.array_equal(a.frame_values[0], a.frame_values[-1])  # the data moves


def test_corrupted_source_image_is_skipped_and_counted(tmp_path, monkeypatch):
    from stages.animate import run

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    good = tmp_path / "good.png"
    from PIL import Image

    Image.new("RGB", (8, 8), "white").save(good)
    rows = [_row(0, str(good)), _row(1, str(bad)), _row(2)]
    out = tmp_path / "out"
    out.mkdir()
    keep_all = {"min_motion": 0.0, "min_temporal_ssim": -1.0, "max_edited_area": 1.0}  # this test is about input
    result = run(SMALL.model_copy(update=keep_all), rows, out, ProceduralBackend(SMALL))
    assert result["skipped"] == [str(bad)] and result["metrics"]["skipped_images"] == 1
    assert [m["source_id"] for m in result["manifest"]] == ["train-000000", "train-000002"]
    assert result["manifest"][0]["source_image"] == str(good)
    assert (out / "images" / "animate-train-000002.png").exists()  # no chart: the first frame is the image
    assert len(list((out / "clips").glob("*.mp4"))) == 4


def _non_finite_table() -> str:
    t = table("bar")
    t["values"] = [[float("nan")] + list(row[1:]) for row in t["values"]]
    return json.dumps(t)  # json writes and reads NaN


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"chart_type": "bar"}), None,
                                  json.dumps({**table("bar"), "values": [[1], [2]]}), _non_finite_table()])
def test_malformed_table_is_skipped_and_counted(tmp_path, monkeypatch, text):
    from stages.animate import run

    monkeypatch.chdir(tmp_path)
    rows = [_row(0), {**_row(1), "table": text}, _row(2)]
    out = tmp_path / "out"
    out.mkdir()
    keep_all = {"min_motion": 0.0, "min_temporal_ssim": -1.0, "max_edited_area": 1.0}
    result = run(SMALL.model_copy(update=keep_all), rows, out, ProceduralBackend(SMALL))
    assert result["skipped_tables"] == ["train-000001"] and result["metrics"]["skipped_tables"] == 1
    assert result["metrics"]["skipped_images"] == 0 and result["metrics"]["rows"] == 3
    assert [m["source_id"] for m in result["manifest"]] == ["train-000000", "train-000002"]


# --- config and the diffusers backend's checks ------------------------------------------------------------

def test_config_rejects_bad_shapes_and_a_diffusers_run_without_a_model():
    with pytest.raises(ConfigError, match="even"):
        parse_section("animate", AnimateConfig, {"width": 321})
    with pytest.raises(ConfigError, match="model_path"):
        parse_section("animate", AnimateConfig, {"backend": "diffusers"})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_section("animate", AnimateConfig, {"frame": 8})


def test_diffusers_backend_fails_before_work(tmp_path, monkeypatch):
    import importlib.util

    cfg = AnimateConfig(backend="diffusers", model_path=str(tmp_path / "svd"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "diffusers" else real(name, *a))
    with pytest.raises(InputError, match="diffusers package"):
        check_backend(cfg)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(InputError, match="svd"):
        check_backend(cfg)  # the folder has no model_index.json
    check_backend(AnimateConfig())  # procedural: nothing to check


def test_cogvideox_needs_4k_plus_1_frames_before_work(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "CogVideoXImageToVideoPipeline"}))
    cfg = AnimateConfig(backend="diffusers", model_path=str(tmp_path), device="cpu", frames=16)
    with pytest.raises(InputError, match=r"frames=16: CogVideoXImageToVideoPipeline makes 4k \+ 1 .*make 13"):
        check_backend(cfg)
    check_backend(cfg.model_copy(update={"frames": 49}))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableVideoDiffusionPipeline"}))
    check_backend(cfg)  # SVD makes the frames it is asked for
    (tmp_path / "model_index.json").write_text("{broken")
    with pytest.raises(InputError, match="model_index.json"):
        check_backend(cfg)


def test_diffusers_backend_checks_the_frame_count_it_gets():
    """The model's output is checked, not trimmed: a pipeline that makes fewer frames than asked stops the run."""
    from types import SimpleNamespace

    from PIL import Image

    from pipeline.data.video.backends import DiffusersBackend

    class Pipe:  # a stand-in for a diffusers pipeline that makes `made` frames whatever it is asked
        def __init__(self, made: int) -> None:
            self.made = made

        def __call__(self, image, num_frames, height, width, num_inference_steps, generator):
            return SimpleNamespace(frames=[[image] * self.made])

    backend = DiffusersBackend.__new__(DiffusersBackend)  # no torch, no weights: only _animate's checks
    backend.cfg = AnimateConfig(frames=16, width=96, height=72)
    backend.torch = SimpleNamespace(Generator=lambda device: SimpleNamespace(manual_seed=lambda seed: seed))
    backend.pipe = Pipe(13)
    backend.accepts = {"image", "num_frames", "height", "width", "num_inference_steps", "generator"}
    image = Image.new("RGB", (96, 72), "white")
    with pytest.raises(InputError, match="frames=16: Pipe made 13 frames"):
        backend._animate(image, "a chart", seed=0)
    backend.pipe = Pipe(16)
    frames = backend._animate(image, "a chart", seed=0)
    assert len(frames) == 16 and frames[0].shape == (72, 96, 3)
