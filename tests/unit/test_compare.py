"""The paired bootstrap and the regression gate (pipeline/evaluation/compare.py) on hand-made predictions."""

from __future__ import annotations

import pytest

from pipeline.evaluation.compare import NotComparable, paired_bootstrap, regressed


def rows(correct: list[bool], split: str = "test", answers: list[str] | None = None) -> list[dict]:
    answers = answers or [str(i) for i in range(len(correct))]
    return [{"split": split, "id": f"q{i:03d}", "answer": answers[i], "correct": c} for i, c in enumerate(correct)]


def test_a_known_gain_is_measured_with_an_interval_that_excludes_zero():
    before = rows([True] * 50 + [False] * 50)
    after = rows([True] * 50 + [True] * 20 + [False] * 30)  # 20 questions fixed, none broken
    result = paired_bootstrap(before, after)
    assert (result["before"], result["after"], result["difference"]) == (0.5, 0.7, 0.2)
    assert 0.1 < result["ci_low"] < 0.2 < result["ci_high"] < 0.3
    # the SE of a mean of 100 draws of a 0/1 variable with p = 0.2: sqrt(0.2 * 0.8 / 100) = 0.04
    assert result["standard_error"] == pytest.approx(0.04, abs=0.004)
    assert not regressed(result) and regressed(paired_bootstrap(after, before))


def test_no_change_and_balanced_swaps_do_not_trip_the_gate():
    same = rows([True, False] * 50)
    result = paired_bootstrap(same, same)
    assert (result["difference"], result["ci_low"], result["ci_high"]) == (0.0, 0.0, 0.0)
    swapped = rows([False, True] * 50)  # 50 fixed, 50 broken
    result = paired_bootstrap(same, swapped)
    assert result["difference"] == 0.0 and result["ci_low"] < 0 < result["ci_high"]
    assert not regressed(result)


def test_the_margin_forgives_a_small_sure_drop():
    before = rows([True] * 200)
    after = rows([True] * 190 + [False] * 10)  # 10 of 200 broken: -0.05, SE about 0.015
    result = paired_bootstrap(before, after)
    assert result["difference"] == -0.05 and -0.03 < result["ci_high"] < -0.01
    assert regressed(result, margin=0.01) and not regressed(result, margin=0.05)
    # 2 of 100 broken is not beyond doubt: 13% of resamples (0.98 ** 100) draw none of them
    assert not regressed(paired_bootstrap(rows([True] * 100), rows([True] * 98 + [False] * 2)))


def test_the_same_predictions_give_the_same_interval():
    a, b = rows([i % 3 == 0 for i in range(60)]), rows([i % 2 == 0 for i in range(60)])
    assert paired_bootstrap(a, b) == paired_bootstrap(a, b)
    assert paired_bootstrap(a, b, seed=1)["ci_low"] != paired_bootstrap(a, b)["ci_low"]


def test_different_test_sets_are_refused():
    with pytest.raises(NotComparable, match="1 questions only before, 0 only after"):
        paired_bootstrap(rows([True, True]), rows([True]))
    with pytest.raises(NotComparable, match="another gold answer"):
        paired_bootstrap(rows([True, True], answers=["1", "2"]), rows([True, True], answers=["1", "3"]))
    with pytest.raises(NotComparable, match="appears twice"):
        paired_bootstrap(rows([True]) * 2, rows([True]))
    with pytest.raises(NotComparable, match="only before"):
        paired_bootstrap(rows([True], split="test"), rows([True], split="ood"))


def test_the_gate_fails_a_sure_drop_beyond_its_margin_and_a_model_it_cannot_judge():
    from pipeline.evaluation.compare import gate, parse_gate

    results = {"sft": paired_bootstrap(rows([True] * 200), rows([True] * 190 + [False] * 10)),
               "grpo": paired_bootstrap(rows([True, False] * 50), rows([True, False] * 50)),
               "dpo": "no predictions: not at that revision"}
    assert gate(results, ["grpo", "sft:0.05"]) == []
    failed = gate(results, ["sft:0.01", "dpo", "teacher"])
    assert failed[0].startswith("sft: accuracy 1.000 -> 0.950 (-0.050, 95% interval [") \
        and "by more than 0.01" in failed[0]
    assert failed[1] == "dpo: cannot judge a regression: no predictions: not at that revision"
    assert failed[2].startswith("teacher: cannot judge")
    assert parse_gate("grpo") == ("grpo", 0.0) and parse_gate("grpo:0.02") == ("grpo", 0.02)
    for bad in ("", ":0.1", "grpo:x", "grpo:1.5"):
        with pytest.raises(ValueError, match="MODEL\\[:MARGIN\\]"):
            parse_gate(bad)
    with pytest.raises(ValueError, match=r"'sft_extnded:0.02': sft_extnded is not an evaluated model \(teacher, sft, "):
        parse_gate("sft_extnded:0.02")  # a typo fails before any run, not after it


def test_two_revisions_are_compared_with_each_other_and_the_report_exits_1_on_a_regression(monkeypatch, capsys):
    from pipeline import __main__ as cli
    from pipeline.evaluation import compare, report
    from pipeline.orchestration import orchestrate

    by_rev = {"A": rows([True] * 200), "B": rows([True] * 150 + [False] * 50)}
    asked = []

    def read(path, rev=None, split="test"):
        asked.append((path, rev))
        return by_rev[rev]

    monkeypatch.setattr(compare, "read_predictions", read)
    monkeypatch.setattr(orchestrate, "diff_markdown", lambda before, after=None: f"diff {before} {after}")
    monkeypatch.setattr(orchestrate, "metrics_rows", lambda: [])
    monkeypatch.setattr(orchestrate, "models_markdown", lambda: "")
    monkeypatch.setattr(report, "load_evaluations", lambda: {})
    monkeypatch.setattr(report, "decoding_markdown", lambda e: "")
    monkeypatch.setattr(report, "generalisation_markdown", lambda e: "")
    monkeypatch.setattr(compare, "is_commit", lambda rev: rev in by_rev)
    assert cli.main(["report", "--rev", "A", "--rev", "B"]) == 0
    out = capsys.readouterr().out
    assert "diff A B" in out and "| sft | 1.000 | 0.750 | -0.250 |" in out and "A against B" in out
    assert ("data/evaluate/sft/predictions.parquet", "B") in asked
    assert cli.main(["report", "--rev", "A", "--rev", "B", "--fail-on-regression", "sft:0.1"]) == 1
    assert "regression: sft: accuracy 1.000 -> 0.750" in capsys.readouterr().err
    assert cli.main(["report", "--rev", "A", "--rev", "B", "--fail-on-regression", "sft:0.3"]) == 0
    capsys.readouterr()
    # bad arguments exit 2 before any table is printed
    assert cli.main(["report", "--rev", "A", "--rev", "B", "--rev", "C"]) == 2
    assert cli.main(["report", "--fail-on-regression", "sft:2"]) == 2
    assert cli.main(["report", "--rev", "nosuch"]) == 2
    assert cli.main(["report", "--results", "--rev", "A"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "error: --rev nosuch: neither a git revision nor a DVC experiment here" in err


class DataIndexDirError(Exception):
    """What DVC raises for an output its dvc.lock records but neither its cache nor its remote holds."""


def _quiet_report(monkeypatch, by_rev: dict, recorded: dict | None = None, diff=None, rows=None):
    """`report` with predictions per revision from `by_rev` (absent: DVC's error for a missing output) and every
    table but the comparison stubbed."""
    from pipeline.core import versions
    from pipeline.evaluation import compare, report
    from pipeline.orchestration import orchestrate

    def read(path, rev=None, split="test"):
        if rev not in by_rev:
            raise DataIndexDirError("failed to load directory ('data', 'evaluate', 'sft')")
        return by_rev[rev]

    monkeypatch.setattr(compare, "read_predictions", read)
    monkeypatch.setattr(compare, "recording_stage", lambda path, rev=None: (recorded or {}).get(
        (path.split("/")[2], rev), f"evaluate@{path.split('/')[2]}"))
    monkeypatch.setattr(versions, "default_remote", lambda: ("local", "/srv/dvc-remote", True))
    monkeypatch.setattr(orchestrate, "diff_markdown", diff or (lambda before, after=None: f"diff {before} {after}"))
    monkeypatch.setattr(orchestrate, "metrics_rows", lambda: rows or [])
    monkeypatch.setattr(orchestrate, "models_markdown", lambda: "MODELS TABLE")
    monkeypatch.setattr(report, "load_evaluations", lambda: {})
    monkeypatch.setattr(report, "decoding_markdown", lambda e: "")
    monkeypatch.setattr(report, "generalisation_markdown", lambda e: "")
    monkeypatch.setattr(compare, "is_commit", lambda rev: rev in ("A", "B", "HEAD"))


def test_a_version_without_predictions_gets_one_line_saying_what_fetches_them_and_the_gate_exits_3(
        monkeypatch, capsys):
    """A fresh clone: HEAD's predictions in neither the cache nor the remote. The report still compares what it
    has, names per version what is missing and what gets it (not DVC's internals), and the gate's refusal to judge
    exits 3, apart from a regression's 1."""
    from pipeline import __main__ as cli

    good, worse = rows([True] * 200), rows([True] * 150 + [False] * 50)
    _quiet_report(monkeypatch, {"B": good}, recorded={("dpo", "A"): None})
    assert cli.main(["report", "--rev", "A", "--rev", "B", "--fail-on-regression", "sft:0.01"]) == 3
    out, err = capsys.readouterr()
    assert "failed to load directory" not in out + err
    assert "| sft | no predictions at A | | | | |" in out
    (line,) = [x for x in out.splitlines() if x.startswith("- A: ")]  # one line for the version, every model in it
    assert line.startswith("- A: no predictions of teacher, sft, sft_extended, grpo: its dvc.lock records them "
                           "(evaluate@teacher evaluate@sft evaluate@sft_extended evaluate@grpo), but neither this "
                           "DVC cache nor remote `local` (/srv/dvc-remote) holds them; `dvc push -r local` where A "
                           "was run puts them where this report reads them, or re-run them at A: `git worktree add "
                           "--detach ../at-A A && cd ../at-A && dvc cache dir --local ")
    assert line.endswith("&& python -m pipeline repro evaluate@teacher evaluate@sft evaluate@sft_extended "
                         "evaluate@grpo`; dpo not evaluated at A (no evaluate@ stage of its dvc.lock holds them): "
                         "nothing to fetch; re-running that revision with them evaluated would compare them")
    assert "Gate (sft:0.01): cannot judge\n- sft: cannot judge a regression: no predictions at A: in neither the " \
           "DVC cache nor the remote" in out.replace("its dvc.lock records them, ", "")
    assert "error: --fail-on-regression could not judge 1 model(s) (exit 3, not 1" in err
    # a regression beside a model it cannot judge: 1, the finding
    _quiet_report(monkeypatch, {"A": good, "B": worse})
    monkeypatch.setattr("pipeline.evaluation.compare.read_predictions", lambda path, rev=None, split="test": (
        {"A": good, "B": worse}[rev] if "/sft/" in path or rev == "B" else
        (_ for _ in ()).throw(DataIndexDirError("failed to load"))))
    assert cli.main(["report", "--rev", "A", "--rev", "B", "--fail-on-regression", "sft:0.1",
                     "--fail-on-regression", "grpo"]) == 1
    out, err = capsys.readouterr()
    assert "Gate (sft:0.1, grpo): regressed" in out and "regression: sft: accuracy 1.000 -> 0.750" in err
    assert "\ngrpo: cannot judge a regression: no predictions at A" in err
    # the workspace's own: dvc.lock records them but they are not here; `dvc pull` from the remote fetches them
    from pipeline.evaluation.compare import Missing, missing_lines

    workspace = missing_lines({"grpo": Missing("no predictions at the workspace: not in the workspace",
                                               [(None, "evaluate@grpo")])})
    assert workspace == ["workspace: no predictions of grpo here, though dvc.lock records them: `dvc pull -r local "
                         "evaluate@grpo` fetches them from remote `local` (/srv/dvc-remote), or `python -m pipeline "
                         "repro evaluate@grpo` makes them"]


def test_recording_stage_reads_a_revisions_dvc_lock():
    from pipeline.evaluation.compare import recording_stage

    assert recording_stage("data/evaluate/sft/predictions.parquet", "HEAD") == "evaluate@sft"
    assert recording_stage("data/evaluate/nosuch/predictions.parquet", "HEAD") is None
    assert recording_stage("data/evaluate/sft/predictions.parquet", "0" * 40) is None  # no such revision


def test_the_report_leads_with_the_decision_and_shows_raw_metrics_only_when_asked(monkeypatch, capsys):
    from pipeline import __main__ as cli

    _quiet_report(monkeypatch, {"A": rows([True] * 200), "B": rows([True] * 200)},
                  rows=[{"file": "metrics/sft.json", "metric": "loss", "value": 0.5}])
    assert cli.main(["report", "--rev", "A", "--rev", "B"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "## Against A (B against it)" and "| sft | 1.000 | 1.000 | +0.000 |" in "\n".join(lines[:12])
    assert out.index("| sft | 1.000") < out.index("MODELS TABLE") < out.index("diff A B")
    assert "## Metrics changed against A at B (timings left out)" in out
    assert "metrics/sft.json" not in out and "## Every metric" not in out
    assert cli.main(["report", "--rev", "A", "--rev", "B", "--metrics"]) == 0
    out = capsys.readouterr().out
    assert out.index("diff A B") < out.index("## Every metric (metrics/*.json)") < out.index("metrics/sft.json")
    assert cli.main(["report", "--results", "--metrics"]) == 2
