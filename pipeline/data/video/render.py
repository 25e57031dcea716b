"""Raster charts drawn with PIL, fast enough to redraw every frame of a clip.

    layout = Layout(table, width=320, height=240)
    frame, marks = draw(layout, Scene.of(table, values))      # values[category][series] at this frame
    moved = warp(frame, camera_at(camera, 0.5))               # the camera half-way through its motion

A chart is a `Layout` (the axis range and geometry, fixed for a whole clip so
that the source and target clips share one y scale) and a `Scene` (the values
and the style of each mark at one frame). `draw` returns the pixels and each
mark's box with a style signature: a mark whose box or signature differs
between two scenes is an edited mark (`changed_region`), which is how an edit
gets its mask without looking at pixels. A data mark also has an anchor, the
point a note about it sits above (the top of a bar, a line's point, a slice's
label), which its mask box is not: a point's box spans its segments to its
neighbours, and every slice's box is the whole disc. The camera is one affine warp per
frame (zoom, pan, rotation about the centre) with smoothstep easing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageColor, ImageDraw, ImageFont

BACKGROUND = (255, 255, 255)
INK = (40, 40, 40)
GRID = (228, 228, 228)
HIGHLIGHT = (255, 190, 0)  # the outline of a highlighted mark
BAR_AREA = 0.8  # share of a category's slot covered by its bars, as in pipeline/data/cof/render.py
TICKS = 4  # y gridlines above zero


@lru_cache(maxsize=4)
def font(size: int = 10) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def rgb(name: str) -> tuple[int, int, int]:
    return ImageColor.getrgb(name)[:3]


def nice_max(value: float) -> float:
    """The smallest round step (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten), times TICKS,
    that covers `value`: 18.7 -> 20 (step 5), 41 -> 50 (step 12.5)."""
    raw = max(value, 1e-9) / TICKS
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * power >= raw)
    return step * TICKS


def ease(t: float) -> float:
    """Smoothstep: zero speed at both ends of a motion."""
    t = min(max(t, 0.0), 1.0)
    return t * t * (3 - 2 * t)


@dataclass
class Scene:
    """What one frame shows: values[category][series] and each mark's style."""

    values: np.ndarray  # (categories, series) floats
    colours: list[list[tuple[int, int, int]]]  # per mark
    series_colours: list[tuple[int, int, int]]  # legend swatches
    hidden: frozenset = frozenset()  # (i, j) marks not drawn
    hidden_series: frozenset = frozenset()  # legend entries not drawn
    outlined: frozenset = frozenset()  # (i, j) highlighted marks
    notes: tuple = ()  # (i, j, text): a labelled box above the mark

    @classmethod
    def of(cls, table: dict, values) -> "Scene":
        by_category = table["colour_by"] == "category"
        cols = [rgb(c) for c in table["colours"]]
        n_cat, n_ser = len(table["categories"]), len(table["series"])
        colours = [[cols[i if by_category else j] for j in range(n_ser)] for i in range(n_cat)]
        series_colours = [cols[0 if by_category else j] for j in range(n_ser)]
        return cls(np.asarray(values, dtype=float).reshape(n_cat, n_ser), colours, series_colours)

    def with_values(self, values: np.ndarray) -> "Scene":
        return replace(self, values=values)


@dataclass
class Layout:
    """Geometry shared by every frame of a sample (source and target): plot box and y range."""

    table: dict
    width: int = 320
    height: int = 240
    vmax: float = 0.0  # top of the y axis (pie: unused); 0 means "fit the table"
    plot: tuple[int, int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        if not self.vmax:
            values = np.asarray(self.table["values"], dtype=float)
            top = values.sum(axis=1).max() if self.table["chart_type"] == "stacked_bar" else values.max()
            self.vmax = nice_max(float(top) * 1.1)
        self.plot = (30, 22, self.width - 8, self.height - 18)  # left, top, right, bottom

    @property
    def chart_type(self) -> str:
        return self.table["chart_type"]

    def y(self, value: float) -> float:
        left, top, right, bottom = self.plot
        return bottom - (bottom - top) * min(max(value, 0.0), self.vmax) / self.vmax

    def slot(self, i: int) -> tuple[float, float]:
        """(left, width) of category i's slot."""
        left, _, right, _ = self.plot
        width = (right - left) / len(self.table["categories"])
        return left + i * width, width


Box = tuple[int, int, int, int]


class Mark(NamedTuple):
    """One drawn mark: where it is and what it looks like; a change of either is an edit."""

    box: Box  # every pixel the mark's drawing can touch (the edit mask is made of these)
    style: tuple  # colour, outline, angles...: what changes without moving the box
    anchor: tuple[float, float] | None = None  # data marks: the point a note about the mark sits above


def _union(a: Box | None, b: Box) -> Box:
    return b if a is None else (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def _text_box(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, anchor: str) -> Box:
    x0, y0, x1, y1 = draw.textbbox(xy, text, font=font(), anchor=anchor)
    return (int(x0), int(y0), int(x1) + 1, int(y1) + 1)


def _axes(draw: ImageDraw.ImageDraw, layout: Layout) -> None:
    left, top, right, bottom = layout.plot
    for k in range(TICKS + 1):
        v = layout.vmax * k / TICKS
        y = layout.y(v)
        draw.line([(left, y), (right, y)], fill=GRID if k else INK, width=1)
        draw.text((left - 3, y), f"{v:g}", fill=INK, font=font(), anchor="rm")
    for i, name in enumerate(layout.table["categories"]):
        x, w = layout.slot(i)
        draw.text((x + w / 2, bottom + 3), name, fill=INK, font=font(), anchor="mt")


def _bars(draw, layout: Layout, scene: Scene) -> dict:
    marks = {}
    n_cat, n_ser = scene.values.shape
    stacked = layout.chart_type == "stacked_bar"
    for i in range(n_cat):
        x, w = layout.slot(i)
        x0 = x + w * (1 - BAR_AREA) / 2
        bar_w = w * BAR_AREA / (1 if stacked else n_ser)
        base = 0.0
        for j in range(n_ser):
            v = scene.values[i, j]
            if (i, j) in scene.hidden:
                marks[(i, j)] = None
                continue
            left = x0 if stacked else x0 + j * bar_w
            lo, hi = (base, base + v) if stacked else (0.0, v)
            box = (int(left), int(layout.y(hi)), int(math.ceil(left + bar_w)), int(math.ceil(layout.y(lo))))
            draw.rectangle(box, fill=scene.colours[i][j])
            if (i, j) in scene.outlined:
                box = (box[0] - 3, box[1] - 3, box[2] + 3, box[3] + 1)
                draw.rectangle(box, outline=HIGHLIGHT, width=3)
            top = (left + bar_w / 2, box[1])  # the bar's top edge (its outline's, when outlined)
            marks[(i, j)] = Mark(box, (scene.colours[i][j], (i, j) in scene.outlined), top)
            base += v if stacked else 0.0
    return marks


def _lines(draw, layout: Layout, scene: Scene) -> dict:
    marks = {}
    n_cat, n_ser = scene.values.shape
    centres = [layout.slot(i)[0] + layout.slot(i)[1] / 2 for i in range(n_cat)]
    for j in range(n_ser):
        points = [(centres[i], layout.y(scene.values[i, j])) for i in range(n_cat)]
        visible = [(i, p) for i, p in enumerate(points) if (i, j) not in scene.hidden]
        colour = scene.colours[0][j]
        if len(visible) > 1:
            draw.line([p for _, p in visible], fill=colour, width=2)
        for k, (i, (x, y)) in enumerate(visible):
            draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=scene.colours[i][j])
            ring = 7 if (i, j) in scene.outlined else 4
            if (i, j) in scene.outlined:
                draw.ellipse((x - ring, y - ring, x + ring, y + ring), outline=HIGHLIGHT, width=3)
            # A point's mark spans its segments to both neighbours: moving it redraws them.
            near = [p for _, p in visible[max(k - 1, 0) : k + 2]]
            xs, ys = [p[0] for p in near], [p[1] for p in near]
            box = (int(min(xs)) - ring, int(min(ys)) - ring, int(max(xs)) + ring + 1, int(max(ys)) + ring + 1)
            marks[(i, j)] = Mark(box, (scene.colours[i][j], colour, (i, j) in scene.outlined), (x, y - ring))
        for i in range(n_cat):
            marks.setdefault((i, j), None)
    return marks


def _pie(draw, layout: Layout, scene: Scene) -> dict:
    left, top, right, bottom = layout.plot
    r = min(right - left, bottom - top) / 2 - 12
    cx, cy = (left + right) / 2, (top + bottom) / 2
    disc = (int(cx - r), int(cy - r), int(math.ceil(cx + r)), int(math.ceil(cy + r)))
    values = [0.0 if (i, 0) in scene.hidden else max(v, 0.0) for i, v in enumerate(scene.values[:, 0])]
    total = sum(values) or 1.0
    marks, start = {}, -90.0  # PIL angles run clockwise from 3 o'clock: start at 12, clockwise
    for i, v in enumerate(values):
        if (i, 0) in scene.hidden:
            marks[(i, 0)] = None
            continue
        end = start + 360.0 * v / total
        outlined = (i, 0) in scene.outlined
        draw.pieslice(disc, start, end, fill=scene.colours[i][0], outline=HIGHLIGHT if outlined else BACKGROUND,
                      width=3 if outlined else 1)
        mid = math.radians((start + end) / 2)
        label = (cx + (r + 9) * math.cos(mid), cy + (r + 9) * math.sin(mid))
        name = layout.table["categories"][i]
        draw.text(label, name, fill=INK, font=font(), anchor="mm")
        # A slice's mark is the whole disc and its label: any change of one slice turns all the others.
        text = _text_box(draw, label, name, "mm")
        box = _union(text, (disc[0] - 3, disc[1] - 3, disc[2] + 3, disc[3] + 3))
        # The note goes above the slice's label, which sits outside the rim at the slice's angular midpoint.
        style = (scene.colours[i][0], outlined, round(start, 2), round(end, 2))
        marks[(i, 0)] = Mark(box, style, (label[0], text[1]))
        start = end
    return marks


def _legend(draw, layout: Layout, scene: Scene) -> dict:
    marks = {}
    series = layout.table["series"]
    if len(series) < 2:
        return marks
    x, y = layout.plot[2] - 58, layout.plot[1] + 2
    for j, name in enumerate(series):
        if j in scene.hidden_series:
            marks[("legend", j)] = None
            continue
        yj = y + 11 * j
        draw.rectangle((x, yj + 1, x + 7, yj + 8), fill=scene.series_colours[j])
        draw.text((x + 10, yj), name, fill=INK, font=font(), anchor="lt")
        box = _union(_text_box(draw, (x + 10, yj), name, "lt"), (x, yj, x + 8, yj + 9))
        marks[("legend", j)] = Mark(box, (scene.series_colours[j],))
    return marks


def _notes(draw, layout: Layout, scene: Scene, marks: dict) -> dict:
    """Each note a labelled box centred over its mark's anchor, 3 px above it (moved inside the frame)."""
    out = {}
    for k, (i, j, text) in enumerate(scene.notes):
        mark = marks.get((i, j))
        if mark is None:
            continue
        x, y = mark.anchor
        tx0, ty0, tx1, ty1 = draw.textbbox((0, 0), text, font=font(), anchor="lt")
        w, h = tx1 - tx0 + 6, ty1 - ty0 + 4
        left = int(min(max(x - w / 2, 1), layout.width - w - 1))
        top = int(min(max(y - h - 3, 1), layout.height - h - 1))
        box = (left, top, left + w, top + h)
        draw.rectangle(box, fill=BACKGROUND, outline=INK, width=1)
        draw.text((left + 3 - tx0, top + 2 - ty0), text, fill=INK, font=font(), anchor="lt")
        out[("note", k)] = Mark((box[0], box[1], box[2] + 1, box[3] + 1), (text,))
    return out


def draw(layout: Layout, scene: Scene) -> tuple[np.ndarray, dict]:
    """(H x W x 3 uint8 pixels, {mark key: Mark (box, style, anchor) or None when not drawn})."""
    image = Image.new("RGB", (layout.width, layout.height), BACKGROUND)
    pen = ImageDraw.Draw(image)
    pen.text((6, 4), f"{layout.table['title']} ({layout.table['unit']})", fill=INK, font=font(), anchor="lt")
    if layout.chart_type == "pie":
        marks = _pie(pen, layout, scene)
    else:
        _axes(pen, layout)
        marks = (_lines if layout.chart_type == "line" else _bars)(pen, layout, scene)
    marks.update(_legend(pen, layout, scene))
    marks.update(_notes(pen, layout, scene, marks))
    return np.asarray(image), marks


def changed_region(a: dict, b: dict) -> list[Box]:
    """Boxes of the marks drawn differently in two scenes (in either scene's position)."""
    boxes = []
    for key in a.keys() | b.keys():
        ma, mb = a.get(key), b.get(key)
        if ma != mb:
            boxes.extend(m.box for m in (ma, mb) if m is not None)
    return sorted(boxes)


def region_mask(boxes: list[Box], width: int, height: int, margin: int) -> Image.Image:
    """An 'L' image, 255 inside the boxes grown by `margin` pixels (anti-aliasing, outlines)."""
    mask = Image.new("L", (width, height), 0)
    pen = ImageDraw.Draw(mask)
    for x0, y0, x1, y1 in boxes:
        pen.rectangle((x0 - margin, y0 - margin, x1 + margin, y1 + margin), fill=255)
    return mask


@dataclass(frozen=True)
class Camera:
    """Where the camera ends; it starts at identity and eases there."""

    zoom: float = 1.0  # scale factor at the end (>1 zooms in)
    pan_x: float = 0.0  # pixels the content moves right
    pan_y: float = 0.0  # pixels the content moves down
    rotation: float = 0.0  # degrees, counter-clockwise

    def at(self, t: float) -> "Camera":
        s = ease(t)
        return Camera(1 + (self.zoom - 1) * s, self.pan_x * s, self.pan_y * s, self.rotation * s)

    def describe(self) -> str:
        return f"zoom {self.zoom:.3f}, pan ({self.pan_x:.1f}, {self.pan_y:.1f}) px, rotate {self.rotation:.2f} deg"


def warp(image: Image.Image, cam: Camera, resample=Image.Resampling.BILINEAR, fill=BACKGROUND) -> Image.Image:
    """The image as the camera sees it: scale and rotate about the centre, then pan."""
    w, h = image.size
    cx, cy = w / 2, h / 2
    theta = math.radians(cam.rotation)
    # PIL maps each output pixel back to an input pixel: the inverse transform.
    a, b = math.cos(theta) / cam.zoom, -math.sin(theta) / cam.zoom
    d, e = math.sin(theta) / cam.zoom, math.cos(theta) / cam.zoom
    ox, oy = cx + cam.pan_x, cy + cam.pan_y
    data = (a, b, cx - a * ox - b * oy, d, e, cy - d * ox - e * oy)
    return image.transform((w, h), Image.Transform.AFFINE, data, resample=resample, fillcolor=fill)
