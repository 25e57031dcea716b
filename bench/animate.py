"""python bench/animate.py [--tables 20] [--frames 16]

Procedural frame rendering of the `animate` stage against re-plotting every
frame with matplotlib, at the same size (the default 320 x 240, the size of a
synthesize chart; other `animate` sizes compare unequal frames), on one core.
Both draw the first `--tables` training tables at each frame's values (the data
dynamics of pipeline/data/video/sample.py) and return an RGB array moved by the same
camera warp, so the ratio is the renderer's alone: PIL rasterisation
(pipeline/data/video/render.py) against a fresh matplotlib Figure per frame
(pipeline/data/cof/render.chart_figure, the synthesize stage's own chart code with
its layout pass, Agg canvas to array; only the PNG encoding is left out). Needs
data/synthesize (dvc repro synthesize).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from PIL import Image

from pipeline.core import paths
from pipeline.core.io import read_rows
from pipeline.data.cof.render import chart_figure
from pipeline.data.video.render import Scene, draw, warp
from pipeline.data.video.sample import make_plan, sample_seed
from pipeline.orchestration.sections import load_named


def matplotlib_frame(table: dict, values: np.ndarray) -> np.ndarray:
    """One frame re-plotted from scratch by the pipeline's own chart code (pipeline/data/cof/render.py)."""
    fig = chart_figure({**table, "values": values.tolist()})
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=20, help="training tables, each drawn for every frame")
    parser.add_argument("--frames", type=int, default=None, help="frames per table (default: animate.frames)")
    args = parser.parse_args()
    cfg = load_named("animate")
    if args.frames:
        cfg = cfg.model_copy(update={"frames": args.frames})
    rows = read_rows(paths.split_file("train"))[: args.tables]
    plans = [make_plan(json.loads(r["table"]), cfg, sample_seed(cfg.seed, r["id"])) for r in rows]
    n = len(plans) * cfg.frames

    def run(render) -> float:
        start = time.perf_counter()
        for plan in plans:
            for k, values in enumerate(plan.frame_values):
                frame = render(plan, values)
                warp(Image.fromarray(frame), plan.camera.at(k / (cfg.frames - 1)))
        return n / (time.perf_counter() - start)

    procedural = run(lambda plan, values: draw(plan.layout, Scene.of(plan.table, values))[0])
    replot = run(lambda plan, values: matplotlib_frame(plan.table, values))
    shape = matplotlib_frame(plans[0].table, plans[0].frame_values[0]).shape
    print(f"{len(plans)} tables x {cfg.frames} frames at {cfg.width} x {cfg.height} "
          f"(matplotlib array {shape[1]} x {shape[0]})")
    print(f"procedural (PIL raster + camera warp): {procedural:.0f} frames/s")
    print(f"matplotlib re-plot per frame (+ the same warp): {replot:.0f} frames/s")
    print(f"ratio: {procedural / replot:.1f}x")


if __name__ == "__main__":
    main()
