"""Cross-model tables and the generalisation plot, from metrics/evaluate/<model>.json.

- `decoding_markdown`: every model and decoding strategy, accuracy beside cost,
  with each model's faithfulness (inconsistency rates on swapped comparisons and reversed trends);
- `generalisation_markdown` and `generalisation_plot`: accuracy per task type,
  in-domain (test) and out-of-domain (ood), for every model and strategy.

The models are dvc.yaml's evaluate matrix, in its order.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pipeline.core import paths
from pipeline.core.plots import heatmap
from pipeline.core.registry import STUDENTS


def evaluated_models(root: Path = paths.METRICS) -> list[str]:
    """The models of the `evaluate` matrix in the dvc.yaml beside `root` (the project's metrics folder); without
    one, every <root>/evaluate/*.json by name."""
    dvc_file = root.parent / "dvc.yaml"
    if dvc_file.exists():
        return list(yaml.safe_load(dvc_file.read_text())["stages"]["evaluate"]["matrix"]["model"])
    return sorted(f.stem for f in (root / "evaluate").glob("*.json"))


def load_evaluations(root: Path = paths.METRICS, models: list[str] | None = None) -> dict[str, dict]:
    """model -> its evaluate metrics, for the models whose file exists and that were measured (evaluate@base of a
    student built here says why it was skipped)."""
    out = {}
    for name in models if models is not None else evaluated_models(root=root):
        file = root / "evaluate" / f"{name}.json"
        if file.exists() and "skipped" not in (metrics := json.loads(file.read_text())):
            out[name] = metrics
    return out


def cell(value) -> str:
    """A table cell: '–' for what a run did not measure (None: the chart-only parts of a dataset task)."""
    return "–" if value is None else str(value)


def decoding_markdown(evaluations: dict[str, dict]) -> str:
    ood = any("accuracy_ood" in d for m in evaluations.values() for d in m.get("decoding", {}).values())
    # the cost in tokens, which no machine's speed changes (seconds per question: timings/evaluate/<model>.json)
    lines = ["| model | strategy | test | " + ("ood | " if ood else "") + "test minus greedy (paired SE) | "
             "tokens/question | PRM tokens/question |", "|---|---|---|" + "---|" * (3 + ood)]
    for model, m in evaluations.items():
        for strategy, d in m.get("decoding", {}).items():
            values = [d["accuracy"], *([d.get("accuracy_ood")] if ood else []), _versus(d), d["tokens_per_question"],
                      d["prm_tokens_per_question"]]
            lines.append(f"| {model} | {strategy} | " + " | ".join(map(cell, values)) + " |")
    lines += ["", "Best-of-N against its ceilings on the same N samples (test): a perfect outcome verifier (pass@N), "
              "a perfect step verifier (picks a sample whose steps all match the gold chain; – without gold steps), "
              "and how many samples have all steps right.", "",
              "| model | greedy | random pick of N | PRM best-of-N | minus random pick (paired SE) | "
              "perfect step verifier | pass@N | samples with all steps right |",
              "|---|---|---|---|---|---|---|---|"]
    for model, m in evaluations.items():
        d = m.get("decoding", {})
        if "ceilings" in d.get("prm_best_of_n", {}):
            best = d["prm_best_of_n"]
            c, r = best["ceilings"], best.get("vs_random", {})
            lines.append(f"| {model} | {cell(d.get('greedy', {}).get('accuracy'))} | {cell(r.get('random_pick'))} | "
                         f"{best['accuracy']} | {_difference(r)} | {cell(c['step_oracle'])} | {cell(c['pass_at_n'])} | "
                         f"{cell(c['all_steps_right'])} |")
    lines += ["", "Faithfulness: each question asked again as its twin (comparisons with the operands swapped; trends "
              "with the direction reversed); the share of answered pairs whose answers contradict each other."]
    probed = {model: m.get("faithfulness", {}) for model, m in evaluations.items()}
    skipped = {f["skipped"] for f in probed.values() if "skipped" in f}
    if skipped and all("skipped" in f for f in probed.values()):
        return "\n".join([*lines, "", f"Skipped for every model: {'; '.join(sorted(skipped))}."])
    lines += ["", "| model | comparison pairs | answered both | inconsistency rate | trend pairs | answered both | "
              "inconsistency rate |", "|---|---|---|---|---|---|---|"]
    for model, f in probed.items():
        t = f.get("trend", {})
        lines.append(f"| {model} | {cell(f.get('pairs'))} | {cell(f.get('answered'))} | "
                     f"{cell(f.get('inconsistency_rate'))} | {cell(t.get('pairs'))} | {cell(t.get('answered'))} | "
                     f"{cell(t.get('inconsistency_rate'))} |")
    return "\n".join(lines)


def _versus(d: dict) -> str:
    """'+0.035 (0.021)': a strategy's test accuracy minus greedy's with its paired standard error; '' for greedy."""
    return _difference(d.get("vs_greedy"))


def _difference(v: dict | None) -> str:
    """'+0.035 (0.021)': a paired difference and its standard error; '' when there is none."""
    if not v or v.get("difference") is None:
        return ""
    se = v.get("standard_error")
    return f"{v['difference']:+.3f} ({'-' if se is None else f'{se:.3f}'})"


def generalisation(evaluations: dict[str, dict]) -> tuple[list[str], list[str], dict[str, list[list[float | None]]]]:
    """(row names "model / strategy", task types, {"in-domain (test)": grid, "out-of-domain (ood)": grid})."""
    rows, grids = [], {"in-domain (test)": [], "out-of-domain (ood)": []}
    # a dataset task's rows have one task type, "all": it is the last column already
    tasks = sorted({t for m in evaluations.values() for d in m.get("decoding", {}).values()
                    for key in ("by_task_type", "by_task_type_ood") for t in d.get(key, {})} - {"all"})
    for model, m in evaluations.items():
        for strategy, d in m.get("decoding", {}).items():
            rows.append(f"{model} / {strategy}")
            test, ood = d.get("by_task_type", {}), d.get("by_task_type_ood", {})
            grids["in-domain (test)"].append([test.get(t) for t in tasks] + [d["accuracy"]])
            grids["out-of-domain (ood)"].append([ood.get(t) for t in tasks] + [d.get("accuracy_ood")])
    return rows, [*tasks, "all"], grids


def generalisation_markdown(evaluations: dict[str, dict]) -> str:
    rows, columns, grids = generalisation(evaluations)
    test, ood = grids["in-domain (test)"], grids["out-of-domain (ood)"]
    lines = ["Accuracy per task type, in-domain (test) / out-of-domain (ood); - where a split has no such question.",
             "", "| model / strategy | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]

    def cell(a, b) -> str:
        return f"{'-' if a is None else f'{a:.2f}'} / {'-' if b is None else f'{b:.2f}'}"

    for name, t, o in zip(rows, test, ood):
        lines.append(f"| {name} | " + " | ".join(cell(a, b) for a, b in zip(t, o)) + " |")
    return "\n".join(lines)


def generalisation_plot(evaluations: dict[str, dict], path: Path) -> None:
    rows, columns, grids = generalisation(evaluations)
    heatmap({name: (rows, columns, grid) for name, grid in grids.items()}, path,
            title="Accuracy per task type, every model and decoding strategy")


# --- The README's results table: several runs side by side, each from its own metrics folder ---

# (column title, metrics folder relative to the repository root): this workspace's run of the quick default,
# and snapshots of other runs' metrics/ (docs/results/<name>/, each with a README saying how it was made).
RESULT_COLUMNS = (
    ("quick default", "metrics"),
    ("quick default, `--seed 1`", "docs/results/quick-seed1"),
    ("`smollm2` profile (SmolLM2-135M-Instruct)", "docs/results/smollm2"),
)


def _num(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _signed(v: dict | None) -> str:
    """'+0.071 ± 0.015': a paired difference with its standard error; '–' when absent."""
    if not v or v.get("difference") is None:
        return "–"
    se = v.get("standard_error")
    return f"{v['difference']:+.3f}" + ("" if se is None else f" ± {se:.3f}")


def _pairs(prm: dict) -> str:
    """'0.693 (160 pairs)': the share of held-out (right, wrong) answer pairs of one question the PRM ranks right."""
    within = prm.get("held_out", {}).get("within_question", {})
    value = _num(within.get("pair_accuracy_mean"))
    return value if "pairs" not in within else f"{value} ({within['pairs']} pairs)"


def result_rows(root: Path) -> list[tuple[str, str]]:
    """(row label, value) of one run's headline results, from its metrics folder."""
    evals = load_evaluations(root, ["base", "teacher", *STUDENTS])
    prm_file = root / "prm.json"
    prm = json.loads(prm_file.read_text()) if prm_file.exists() else {}
    sft = evals.get("sft", {})
    decoding = sft.get("decoding", {})
    best = decoding.get("prm_best_of_n", {})
    sampled = sft.get("sampled", {})
    n = sampled.get("samples")
    versus = best.get("vs_random", {})
    base = evals.get("base", {})
    rows = [("majority answer per answer type (trivial baseline)", _num(sft.get("baseline_majority"))),
            ("base as loaded, zero-shot, greedy", _num(base.get("accuracy"))),
            ("base as loaded, zero-shot, lenient reading", _num(base.get("lenient_accuracy")))]
    rows += [(f"{name}, greedy", _num(evals.get(name, {}).get("accuracy"))) for name in ("teacher", *STUDENTS)]
    rows += [("sft, greedy, lenient reading", _num(sft.get("lenient_accuracy"))),
             ("sft, ood (longer chains), greedy", _num(sft.get("accuracy_ood")))]
    rows += [
        (f"sft, random pick of N sampled (T {sampled.get('temperature', '–')})", _num(versus.get("random_pick"))),
        ("sft, majority vote of N", _num(decoding.get("maj_at_n", {}).get("accuracy"))),
        ("sft, PRM best-of-N", _num(best.get("accuracy"))),
        ("sft, PRM-weighted vote of N", _num(decoding.get("prm_weighted_vote", {}).get("accuracy"))),
        ("sft, best-of-N minus random pick (paired SE)", _signed(versus)),
        ("sft, best-of-N minus greedy (paired SE)", _signed(best.get("vs_greedy"))),
        ("sft, PRM beam search", _num(decoding.get("prm_beam", {}).get("accuracy"))),
        ("PRM held-out AUROC over lines", _num(prm.get("auroc"))),
        ("PRM within-question pairs ranked right (mean line score)", _pairs(prm)),
        ("test questions: greedy / decoding strategies; N",
         f"{sft.get('questions', '–')} / {decoding.get('greedy', {}).get('questions', '–')}; {n or '–'}"),
    ]
    return rows


def results_markdown(repo: Path = Path("."), columns=RESULT_COLUMNS) -> str:
    """Test accuracy of every model and the PRM's numbers, one column per run (a missing folder: a column of –)."""
    runs = {title: dict(result_rows(repo / folder)) for title, folder in columns}
    labels = [label for label, _ in result_rows(repo / columns[0][1])]
    lines = ["| test accuracy unless named | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    lines += [f"| {label} | " + " | ".join(run.get(label, "–") for run in runs.values()) + " |" for label in labels]
    return "\n".join(lines)
