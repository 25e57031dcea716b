"""python -m stages.synthesize

Chain-of-Functions questions from random chart tables, written to
data/synthesize/{train,val,test,ood}.parquet with PNG charts for the first
`render_charts` questions of each split; counts and rejections in
metrics/synthesize.json.
"""

from __future__ import annotations

import json
import time

from pipeline import paths
from pipeline.cof.generate import generate_dataset
from pipeline.cof.render import render_chart
from pipeline.config import SynthesizeConfig, load_section
from pipeline.flows import expected_errors, run_stage, stage_logger
from pipeline.io import EXAMPLE_SCHEMA, atomic_dir, write_json, write_manifest, write_rows


def run(cfg: SynthesizeConfig) -> None:
    log = stage_logger()
    start = time.perf_counter()
    rows_by_split, stats = generate_dataset(cfg)
    gen_seconds = time.perf_counter() - start
    total = sum(len(rows) for rows in rows_by_split.values())
    log.info("generated %d questions in %.1f s (%.0f/s)", total, gen_seconds, total / gen_seconds)
    out_dir = paths.stage_data("synthesize")
    with atomic_dir(out_dir) as tmp:
        charts = tmp / paths.charts_dir().relative_to(out_dir)
        charts.mkdir()
        for split, rows in rows_by_split.items():
            for row in rows[: cfg.render_charts]:
                render_chart(json.loads(row["table"]), charts / f"{row['id']}.png")
                row["image_path"] = str(paths.charts_dir() / f"{row['id']}.png")
            write_rows(tmp / paths.split_file(split).name, rows, schema=EXAMPLE_SCHEMA)
        write_manifest(tmp, "synthesize", cfg)
    write_json(
        paths.metrics_file("synthesize"),
        {**stats, "questions": total, "questions_per_second": round(total / gen_seconds, 1)},
    )


def main() -> None:
    with expected_errors():
        cfg = load_section("synthesize", SynthesizeConfig)
    run_stage("synthesize", run, cfg)


if __name__ == "__main__":
    main()
