"""The animate stage on tiny params, as a real Prefect flow, after a tiny synthesize."""

from __future__ import annotations

import json
import os
from fractions import Fraction

import pytest
import yaml

from pipeline.core import paths
from pipeline.core.io import EXAMPLE_COLUMNS, read_rows
from pipeline.data.grading import extract_answer, grade
from pipeline.data.video.clips import read_mp4
from tests.conftest import TINY_PARAMS, write_params
from tests.unit.test_animate import expected_answer

TINY = TINY_PARAMS["animate"]

VIDEO_COLUMNS = ("id", "source_image", "source_clip", "instruction", "target_clip", "edit_op", "frames", "fps",
                 "temporal_ssim", "motion", "preserved_psnr", "preserved_ssim")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, prefect_api):
    folder = tmp_path_factory.mktemp("animate_workspace")
    write_params(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    from stages import synthesize

    synthesize.main()
    yield folder
    os.chdir(cwd)


def test_animate(workspace):
    from stages import animate

    animate.main()
    metrics = json.loads(paths.metrics_file("animate").read_text())
    manifest = read_rows(paths.stage_data("animate") / "manifest.parquet", required=VIDEO_COLUMNS)
    assert metrics["rows"] == TINY["samples"] and metrics["samples"] == len(manifest) >= TINY["samples"] // 2
    assert metrics["samples"] + metrics["rejected"] + metrics["skipped_images"] + metrics["skipped_tables"] \
        == TINY["samples"]
    assert set(metrics["rejected_by"]) == {"temporal", "motion", "preservation", "edited_area"}
    for m in manifest:
        for key in ("source_clip", "target_clip"):
            frames, fps = read_mp4(m[key])
            assert len(frames) == TINY["frames"] and fps == Fraction(8)
            assert frames[0].shape == (TINY["height"], TINY["width"], 3)
        assert os.path.exists(m["source_image"]) and m["instruction"].endswith(".")
    questions = read_rows(paths.animate_questions(), required=EXAMPLE_COLUMNS)
    assert len(questions) == metrics["questions"] == 2 * len(manifest)
    for q in questions:  # graded against answers worked out from the frame values, not from the rationale
        assert grade(extract_answer(q["rationale"]), expected_answer(q), q["answer_type"]), q["question"]
    assert (paths.live_dir("animate") / "contact_sheet.png").read_bytes().startswith(b"\x89PNG")
    assert (paths.stage_data("animate") / "preview.gif").read_bytes().startswith(b"GIF8")
    config = json.loads((paths.stage_data("animate") / "config.json").read_text())
    assert config["params"]["samples"] == TINY["samples"] and str(paths.split_file("train")) in config["inputs"]


def test_animate_rerun_is_byte_identical_and_skips_a_corrupted_chart(workspace):
    from stages import animate

    clips = paths.stage_data("animate") / "clips"
    before = {f.name: f.read_bytes() for f in clips.iterdir()}
    chart = read_rows(paths.split_file("train"))[0]["image_path"]
    with open(chart, "r+b") as fh:  # cut the PNG short: PIL fails on it
        fh.truncate(200)
    animate.main()
    metrics = json.loads(paths.metrics_file("animate").read_text())
    assert metrics["skipped_images"] == 1 and metrics["rows"] == TINY["samples"]
    after = {f.name: f.read_bytes() for f in clips.iterdir()}
    assert not any(name.startswith("animate-train-000000.") for name in after)
    assert {n: b for n, b in before.items() if not n.startswith("animate-train-000000.")} == after


def test_diffusers_without_a_model_fails_before_work(workspace, capsys):
    from stages import animate

    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["animate"].update(backend="diffusers", model_path=str(workspace / "no-such-model"))
    (workspace / "bad.yaml").write_text(yaml.safe_dump(params))
    before = sorted(p.name for p in paths.stage_data("animate").rglob("*"))
    os.environ["PIPELINE_PARAMS"] = str(workspace / "bad.yaml")
    try:
        with pytest.raises(SystemExit) as exc:
            animate.main()
    finally:
        del os.environ["PIPELINE_PARAMS"]
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "diffusers" in err  # the package or the model folder, named
    assert sorted(p.name for p in paths.stage_data("animate").rglob("*")) == before
