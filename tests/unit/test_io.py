"""Atomic outputs and clear input errors."""

import pytest

from pipeline.core.io import InputError, atomic_dir, hash_path, read_rows, write_manifest, write_rows


def test_atomic_dir_replaces_only_on_success(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (final / "a.txt").read_text() == "one"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "a.txt").write_text("half-written")
            raise RuntimeError("killed")
    assert (final / "a.txt").read_text() == "one"  # the old output survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left behind


def test_read_rows_names_the_file(tmp_path):
    with pytest.raises(InputError, match=r"missing.parquet: file not found"):
        read_rows(tmp_path / "missing.parquet")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputError, match=r"corrupt.parquet: not a readable parquet file"):
        read_rows(corrupt)
    good = tmp_path / "good.parquet"
    write_rows(good, [{"a": 1}])
    with pytest.raises(InputError, match=r"good.parquet: missing column\(s\) b"):
        read_rows(good, required=("a", "b"))
    assert read_rows(good, required=("a",)) == [{"a": 1}]


def test_parquet_bytes_are_reproducible(tmp_path):
    rows = [{"id": str(i), "xs": [i, i + 1], "s": {"k": "v"}} for i in range(50)]
    write_rows(tmp_path / "a.parquet", rows)
    write_rows(tmp_path / "b.parquet", rows)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_manifest_records_inputs_seed_and_versions(tmp_path):
    (tmp_path / "in.txt").write_text("x")
    write_manifest(tmp_path, "demo", {"seed": 3, "lr": 0.1}, inputs=[tmp_path / "in.txt"])
    import json

    manifest = json.loads((tmp_path / "config.json").read_text())
    assert manifest["seed"] == 3 and manifest["params"]["lr"] == 0.1
    assert manifest["inputs"][str(tmp_path / "in.txt")] == hash_path(tmp_path / "in.txt")
    assert {"torch", "transformers", "trl"} <= set(manifest["versions"])


def test_manifest_leaves_out_wall_clock_figures(tmp_path):
    """A rerun that makes the same output writes the same manifest: no seconds or throughputs, at any depth."""
    import json

    metrics = {"train_loss": 0.5, "train_seconds": 3.2, "tokens_per_second": 900.0, "frames_per_second": 8,
               "drills": {"colour": {"exact": 1.0, "seconds": 12.0}}, "seconds_per_question": 0.1}
    write_manifest(tmp_path, "demo", {"seed": 0}, metrics=metrics)
    manifest = json.loads((tmp_path / "config.json").read_text())
    assert manifest["metrics"] == {"train_loss": 0.5, "drills": {"colour": {"exact": 1.0}}}


def test_metrics_go_where_dvc_hashes_them_and_their_timings_beside(tmp_path, monkeypatch):
    """The machine's speed never reaches a file DVC hashes into dvc.lock (metrics/*.json): transformers' runtimes,
    TRL's step times and our throughputs go to timings/, in their places; a run without any removes the old file."""
    import json

    from pipeline.core import paths
    from pipeline.core.io import write_metrics

    monkeypatch.chdir(tmp_path)
    metrics = {"eval": {"loss": 1.1, "runtime": 0.3, "samples_per_second": 670.7}, "step_time": 2.5, "steps": 8,
               "decoding": {"greedy": {"accuracy": 0.5, "seconds_per_question": 0.01}}, "teacher_seconds": 4.0}
    written = write_metrics(paths.metrics_file("sft"), metrics)
    assert json.loads((tmp_path / "metrics/sft.json").read_text()) == {
        "eval": {"loss": 1.1}, "steps": 8, "decoding": {"greedy": {"accuracy": 0.5}}}
    timings = {"eval": {"runtime": 0.3, "samples_per_second": 670.7}, "step_time": 2.5,
               "decoding": {"greedy": {"seconds_per_question": 0.01}}, "teacher_seconds": 4.0}
    assert written == timings and json.loads((tmp_path / "timings/sft.json").read_text()) == timings
    write_metrics(paths.eval_metrics_file("sft"), {"accuracy": 0.5, "seconds_per_question": 0.1})
    assert json.loads((tmp_path / "timings/evaluate/sft.json").read_text()) == {"seconds_per_question": 0.1}
    assert write_metrics(paths.metrics_file("sft"), {"steps": 8}) is None
    assert not (tmp_path / "timings/sft.json").exists()
