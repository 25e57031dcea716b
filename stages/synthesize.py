"""python -m stages.synthesize

The questions every later stage reads, as data/synthesize/{train,val,test,ood}.parquet
(the example contract of pipeline/core/io.py), with counts in metrics/synthesize.json.

- `task.kind: cof`: Chain-of-Functions questions from random chart tables, with PNG charts
  for the first `render_charts` questions of each split. The questions are drawn in blocks of
  `block_size`, on `workers` processes; the files are the same whatever the number of workers.
- `task.kind: dataset`: your dataset (`task.dataset`, read by pipeline/data/task_data.py). The
  chart columns stay empty; `rationale` is the SFT completion: the dataset's worked solution
  (or nothing) followed by the answer as `task.answer_format` states it. Rows whose answer
  cannot be extracted are listed in quarantine.jsonl with their split, row and reason. A
  dataset without an ood split gets an empty ood.parquet, so every reader finds its file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.core import paths
from pipeline.core.io import (
    EXAMPLE_SCHEMA,
    InputError,
    atomic_dir,
    hash_path,
    write_manifest,
    write_metrics,
    write_rows,
)
from pipeline.core.params import load_section
from pipeline.core.phases import phase, stage_logger
from pipeline.data.cof.generate import block_count, generate_dataset
from pipeline.data.params import SynthesizeConfig, TaskConfig
from pipeline.data.task import Task
from pipeline.data.task_data import SPLITS, read_task_dataset
from pipeline.orchestration.flows import expected_errors, run_stage

# What the charts folder holds when there are no charts: DVC keeps no empty folders, and `animate` depends on it.
NO_CHARTS = "No charts: task.kind is dataset, whose questions are text.\n"


@phase("generate")
def run(cfg: SynthesizeConfig, task_cfg: TaskConfig) -> None:
    if task_cfg.kind == "dataset":
        return from_dataset(task_cfg)
    log = stage_logger()
    start = time.perf_counter()
    rows_by_split, stats = generate_dataset(cfg)
    gen_seconds = time.perf_counter() - start
    total = sum(len(rows) for rows in rows_by_split.values())
    blocks = block_count(cfg)
    log.info("generated %d questions in %.1f s (%.0f/s; %d blocks, workers: %d)", total, gen_seconds,
             total / gen_seconds, blocks, min(cfg.workers, blocks))
    # Imported here, not at the top: each synthesis worker re-runs this module (multiprocessing
    # re-imports the main module), and matplotlib would add about 0.5 s to its start.
    from pipeline.data.cof.render import render_chart

    out_dir = paths.stage_data("synthesize")
    with atomic_dir(out_dir) as tmp:
        charts = tmp / paths.charts_dir().relative_to(out_dir)
        charts.mkdir()
        for split, rows in rows_by_split.items():
            for row in rows[: cfg.render_charts]:
                render_chart(json.loads(row["table"]), charts / f"{row['id']}.png")
                row["image_path"] = str(paths.charts_dir() / f"{row['id']}.png")
            write_rows(tmp / paths.split_file(split).name, rows, schema=EXAMPLE_SCHEMA)
        # Without `workers`: the folder is the same bytes whatever the number of workers.
        write_manifest(tmp, "synthesize", cfg.model_dump(mode="json", exclude={"workers"}))
    write_metrics(
        paths.metrics_file("synthesize"),
        {**stats, "questions": total, "questions_per_second": round(total / gen_seconds, 1)},
    )


def dataset_rows(task_cfg: TaskConfig, log=None) -> tuple[dict[str, list[dict]], list[dict]]:
    """(split -> rows in the example contract, quarantined rows) of the task's dataset; `log` hears what the
    reader left unread, cut or dropped."""
    task = Task.from_config(task_cfg)
    splits, quarantine = read_task_dataset(task_cfg.dataset, task_cfg.step_split, log=log)
    out = {}
    for split in SPLITS:
        out[split] = [
            {**row, "question": row["prompt"], "rationale": task.target(row["rationale"], row["answer"]),
             "steps": [{"function": "", "text": step, "value": ""} for step in row["steps"]]}
            for row in splits.get(split, [])
        ]
    return out, quarantine


def from_dataset(task_cfg: TaskConfig) -> None:
    log = stage_logger()
    start = time.perf_counter()
    rows_by_split, quarantine = dataset_rows(task_cfg, log=log.info)
    seconds = time.perf_counter() - start
    counts = {split: len(rows) for split, rows in rows_by_split.items()}
    hints = {split: f"raise task.dataset.{split}_fraction, or map a split with task.dataset.splits"
             for split in ("val", "test")}
    for split, hint in hints.items():
        if not counts[split]:
            raise InputError(f"task.dataset.path: {task_cfg.dataset.path}: no {split} questions ({hint})")
    log.info("dataset %s: %s questions, %d quarantined (%.1f s)", task_cfg.dataset.path,
             ", ".join(f"{n} {s}" for s, n in counts.items()), len(quarantine), seconds)
    out_dir = paths.stage_data("synthesize")
    source = Path(task_cfg.data_dependency)
    with atomic_dir(out_dir) as tmp:
        charts = tmp / paths.charts_dir().relative_to(out_dir)
        charts.mkdir()
        (charts / "README.txt").write_text(NO_CHARTS)
        for split, rows in rows_by_split.items():
            write_rows(tmp / paths.split_file(split).name, rows, schema=EXAMPLE_SCHEMA)
        (tmp / "quarantine.jsonl").write_text("".join(json.dumps(q, sort_keys=True) + "\n" for q in quarantine))
        write_manifest(tmp, "synthesize", task_cfg, inputs=[source] if source.exists() else [])
    total = sum(counts.values())
    write_metrics(paths.metrics_file("synthesize"), {
        "questions": total, "by_split": counts, "quarantined": len(quarantine),
        "with_rationale": sum(bool(r["steps"]) for rows in rows_by_split.values() for r in rows),
        "dataset_hash": hash_path(source) if source.exists() else None,
        "questions_per_second": round(total / max(seconds, 1e-9), 1)})


def main() -> None:
    with expected_errors():
        cfg = load_section("synthesize", SynthesizeConfig)
        task_cfg = load_section("task", TaskConfig)
    run_stage("synthesize", run, cfg, task_cfg)


if __name__ == "__main__":
    main()
