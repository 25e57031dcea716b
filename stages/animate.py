"""python -m stages.animate

Image-to-video data (docs/methods.md, "Image-to-video data"; after VEGGIE): the first
`animate.samples` training tables become paired video-edit samples. Each gets
a source clip (camera zoom/pan/rotation with easing, and the table's values
moving from one state to another, redrawn every frame), an edit instruction,
and a target clip with the same motion and the edit applied to every frame
(pipeline/data/video/). Samples that fail a filter (temporal SSIM, motion,
preservation outside the edit mask) are counted and dropped; kept samples get
temporal questions (`Step k:` chains over the frames) in the reasoning-example
columns, which `sft.mix` can add to SFT.

A source chart image that cannot be read is logged with its path, skipped and
counted (`skipped_images`); so is a row whose table JSON is malformed, with
its row id (`skipped_tables`). `animate.backend: diffusers` animates with a local
image-to-video pipeline instead (GPU); a missing package or model path fails
before any work.

Writes data/animate/ (clips/<id>.source.mp4 and .target.mp4, images/ for
tables without a synthesize chart, manifest.parquet, questions.parquet,
preview.gif, config.json), plots/animate/ (contact_sheet.png, filters.png) and
metrics/animate.json.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
from PIL import Image

from pipeline.core import paths
from pipeline.core.io import (
    EXAMPLE_COLUMNS,
    EXAMPLE_SCHEMA,
    atomic_dir,
    read_rows,
    write_manifest,
    write_metrics,
    write_rows,
)
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.core.plots import bar_chart, fill_skipped
from pipeline.data.params import AnimateConfig, TaskConfig
from pipeline.data.video.backends import check_backend, make_backend
from pipeline.data.video.clips import contact_sheet, write_gif, write_mp4
from pipeline.data.video.sample import Sample, make_sample, parse_table
from pipeline.orchestration.flows import expected_errors, run_stage

SCORES = ("temporal_ssim", "motion", "preserved_psnr", "preserved_ssim", "edited_area")
FILTERS = ("temporal", "motion", "preservation", "edited_area")
MANIFEST_SCHEMA = pa.schema(
    [("id", pa.string()), ("source_id", pa.string()), ("chart_type", pa.string()), ("source_image", pa.string()),
     ("source_clip", pa.string()), ("instruction", pa.string()), ("target_clip", pa.string()),
     ("edit_op", pa.string()), ("frames", pa.int64()), ("fps", pa.int64()), ("width", pa.int64()),
     ("height", pa.int64()), ("backend", pa.string()), ("camera", pa.string()), ("questions", pa.int64())]
    + [(name, pa.float64()) for name in SCORES]
)


def readable_image(path: str) -> str | None:
    """None when the image opens and decodes, else why not."""
    try:
        with Image.open(path) as image:
            image.load()
        return None
    except (OSError, SyntaxError, ValueError) as exc:  # PIL raises these on truncated or foreign bytes
        return f"{type(exc).__name__}: {exc}"


def manifest_row(sample: Sample, row: dict, cfg: AnimateConfig, backend: str, source_image: str,
                 clips: dict[str, str]) -> dict:
    return {
        "id": sample_id(row), "source_id": row["id"], "chart_type": sample.plan.table["chart_type"],
        "source_image": source_image, "source_clip": clips["source"], "instruction": sample.plan.edit.instruction,
        "target_clip": clips["target"], "edit_op": sample.plan.edit.op, "frames": cfg.frames, "fps": cfg.fps,
        "width": cfg.width, "height": cfg.height, "backend": backend, "camera": sample.plan.camera.describe(),
        "questions": len(sample.questions), **{k: float(sample.scores[k]) for k in SCORES},
    }


def sample_id(row: dict) -> str:
    return f"animate-{row['id']}"


@phase("render clips")
def run(cfg: AnimateConfig, rows: list[dict], out: Path, backend) -> dict:
    """Samples from `rows` into `out` (the stage's temporary folder); returns tables, metrics and previews.

    Paths written into the tables are the final ones (data/animate/...), as synthesize writes image_path.
    """
    log = stage_logger()
    final = paths.stage_data("animate")
    (out / "clips").mkdir()
    (out / "images").mkdir()
    manifest, questions, previews = [], [], []
    rejected, skipped, bad_tables, ops = Counter(), [], [], Counter()
    start = time.perf_counter()
    for row in rows:
        try:
            table = parse_table(row["table"])
        except ValueError as exc:
            log.warning("animate: skipping %s, its table is malformed (%s)", row["id"], exc)
            bad_tables.append(row["id"])
            continue
        image = row.get("image_path")
        if image:
            problem = readable_image(image)
            if problem:
                log.warning("animate: skipping %s, source image %s is unreadable (%s)", row["id"], image, problem)
                skipped.append(image)
                continue
        sample = make_sample(row, cfg, backend, table)
        if sample.reasons:
            rejected.update(sample.reasons)
            rejected["any"] += 1
            continue
        sid = sample_id(row)
        clips = {}
        for kind, frames in (("source", sample.clips.source), ("target", sample.clips.target)):
            name = f"clips/{sid}.{kind}.mp4"
            write_mp4(out / name, frames, cfg.fps, cfg.crf)
            clips[kind] = str(final / name)
        if not image:  # no synthesize chart for this table: its first frame is the source image
            image = str(final / "images" / f"{sid}.png")
            Image.fromarray(sample.clips.source[0]).save(out / "images" / f"{sid}.png", format="png")
        manifest.append(manifest_row(sample, row, cfg, backend.name, image, clips))
        for k, q in enumerate(sample.questions):
            questions.append({"id": f"{sid}-q{k}", "split": "train", **q, "image_path": clips["source"]})
        ops[sample.plan.edit.op] += 1
        if len(previews) < cfg.contact_sheet:
            previews.append((f"{sid}: {sample.plan.edit.instruction}", sample.clips.source, sample.clips.target))
    seconds = time.perf_counter() - start
    tried = len(rows) - len(skipped) - len(bad_tables)
    metrics = {
        "backend": backend.name,
        "rows": len(rows),
        "samples": len(manifest),
        "rejected": rejected["any"],
        "rejected_by": {name: rejected[name] for name in FILTERS},
        "skipped_images": len(skipped),
        "skipped_tables": len(bad_tables),
        "edit_ops": dict(sorted(ops.items())),
        "questions": len(questions),
        "questions_by_task": dict(sorted(Counter(q["task_type"] for q in questions).items())),
        "mean": {k: round(sum(m[k] for m in manifest) / max(len(manifest), 1), 4) for k in SCORES},
        "seconds": round(seconds, 1),
        # both clips of every sample tried, rendered and scored (kept ones also encoded)
        "frames_per_second": round(2 * tried * cfg.frames / max(seconds, 1e-9), 1),
    }
    return {"manifest": manifest, "questions": questions, "previews": previews, "metrics": metrics,
            "skipped": skipped, "skipped_tables": bad_tables}


def _flow(cfg: AnimateConfig) -> None:
    log = stage_logger()
    train_file = paths.split_file("train")
    rows = read_rows(train_file, required=EXAMPLE_COLUMNS)[: cfg.samples]
    backend = make_backend(cfg)
    with atomic_dir(paths.stage_data("animate")) as out:
        result = run(cfg, rows, out, backend)
        metrics = result["metrics"]
        write_rows(out / "manifest.parquet", result["manifest"], schema=MANIFEST_SCHEMA)
        write_rows(out / paths.animate_questions().name, result["questions"], schema=EXAMPLE_SCHEMA)
        if result["previews"]:
            _, source, target = result["previews"][0]
            write_gif(out / "preview.gif", source, target, cfg.fps)
        counts = {k: v for k, v in metrics.items() if k not in ("seconds", "frames_per_second")}
        inputs = [train_file] + ([paths.charts_dir()] if paths.charts_dir().is_dir() else [])
        write_manifest(out, "animate", cfg, inputs=inputs, counts=counts, skipped_images=result["skipped"],
                       skipped_tables=result["skipped_tables"])
    with atomic_dir(paths.live_dir("animate")) as live:
        if result["previews"]:
            contact_sheet(live / "contact_sheet.png", result["previews"])
        bar_chart({"kept": metrics["samples"], **{f"rejected: {k}": v for k, v in metrics["rejected_by"].items()},
                   "skipped images": metrics["skipped_images"], "skipped tables": metrics["skipped_tables"]},
                  live / "filters.png",
                  title=f"animate: {metrics['rows']} tables", xlabel="samples", xmax=None, fmt="{:.0f}")
    write_metrics(paths.metrics_file("animate"), metrics)
    log.info("animate: %d samples kept of %d tables (rejected %s, %d unreadable images, %d malformed tables), "
             "%d questions, %.1f s, %.0f frames/s", metrics["samples"], metrics["rows"], metrics["rejected_by"],
             metrics["skipped_images"], metrics["skipped_tables"], metrics["questions"], metrics["seconds"],
             metrics["frames_per_second"])


def _skipped(cfg: AnimateConfig, task_cfg: TaskConfig) -> None:
    """A text dataset has no charts to animate: empty but valid outputs, so `sft.mix` and DVC find their files."""
    reason = f"skipped: task.kind is {task_cfg.kind}, whose questions have no charts"
    stage_logger().info("animate: %s", reason)
    with atomic_dir(paths.stage_data("animate")) as out:
        write_rows(out / "manifest.parquet", [], schema=MANIFEST_SCHEMA)
        write_rows(out / paths.animate_questions().name, [], schema=EXAMPLE_SCHEMA)
        write_manifest(out, "animate", cfg, skipped=reason)
    with atomic_dir(paths.live_dir("animate")) as live:
        (live / "README.txt").write_text(reason + "\n")
        fill_skipped(live, "animate", reason)
    write_metrics(paths.metrics_file("animate"), {"skipped": reason, "samples": 0, "questions": 0})


def main() -> None:
    with expected_errors():
        cfg = load_section("animate", AnimateConfig)
        task_cfg = load_section("task", TaskConfig)
        if task_cfg.kind != "cof":
            return run_stage("animate", _skipped, cfg, task_cfg)
        check_backend(cfg)  # a missing diffusers package or model folder fails before Prefect starts
    run_stage("animate", _flow, cfg)


if __name__ == "__main__":
    main()
