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

from pipeline import paths
from pipeline.plots import heatmap


def evaluated_models(root: Path = paths.METRICS) -> list[str]:
    """The models of the `evaluate` matrix in the dvc.yaml beside `root` (the project's metrics folder); without
    one, every <root>/evaluate/*.json by name."""
    dvc_file = root.parent / "dvc.yaml"
    if dvc_file.exists():
        return list(yaml.safe_load(dvc_file.read_text())["stages"]["evaluate"]["matrix"]["model"])
    return sorted(f.stem for f in (root / "evaluate").glob("*.json"))


def load_evaluations(root: Path = paths.METRICS, models: list[str] | None = None) -> dict[str, dict]:
    """model -> its evaluate metrics, for the models whose file exists."""
    out = {}
    for name in models if models is not None else evaluated_models(root=root):
        file = root / "evaluate" / f"{name}.json"
        if file.exists():
            out[name] = json.loads(file.read_text())
    return out


def decoding_markdown(evaluations: dict[str, dict]) -> str:
    lines = ["| model | strategy | test | ood | test minus greedy (paired SE) | tokens/question | PRM tokens/question | "
             "seconds/question |", "|---|---|---|---|---|---|---|---|"]
    for model, m in evaluations.items():
        for strategy, d in m.get("decoding", {}).items():
            lines.append(f"| {model} | {strategy} | {d['accuracy']} | {d.get('accuracy_ood')} | {_versus(d)} | "
                         f"{d['tokens_per_question']} | {d['prm_tokens_per_question']} | {d['seconds_per_question']} |")
    lines += ["", "Best-of-N against its ceilings on the same N samples (test): a perfect outcome verifier (pass@N), "
              "a perfect step verifier (picks a sample whose steps all match the gold chain), and how many "
              "samples have all steps right.", "",
              "| model | greedy | PRM best-of-N | perfect step verifier | pass@N | samples with all steps right |",
              "|---|---|---|---|---|---|"]
    for model, m in evaluations.items():
        d = m.get("decoding", {})
        if "ceilings" in d.get("prm_best_of_n", {}):
            c = d["prm_best_of_n"]["ceilings"]
            lines.append(f"| {model} | {d.get('greedy', {}).get('accuracy')} | {d['prm_best_of_n']['accuracy']} | "
                         f"{c['step_oracle']} | {c['pass_at_n']} | {c['all_steps_right']} |")
    lines += ["", "Faithfulness: each question asked again as its twin (comparisons with the operands swapped; trends "
              "with the direction reversed); the share of answered pairs whose answers contradict each other.", "",
              "| model | comparison pairs | answered both | inconsistency rate | trend pairs | answered both | "
              "inconsistency rate |", "|---|---|---|---|---|---|---|"]
    for model, m in evaluations.items():
        f = m.get("faithfulness", {})
        t = f.get("trend", {})
        lines.append(f"| {model} | {f.get('pairs')} | {f.get('answered')} | {f.get('inconsistency_rate')} | "
                     f"{t.get('pairs')} | {t.get('answered')} | {t.get('inconsistency_rate')} |")
    return "\n".join(lines)


def _versus(d: dict) -> str:
    """'+0.035 (0.021)': a strategy's test accuracy minus greedy's with its paired standard error; '' for greedy."""
    v = d.get("vs_greedy")
    if not v or v["difference"] is None:
        return ""
    se = v["standard_error"]
    return f"{v['difference']:+.3f} ({'-' if se is None else f'{se:.3f}'})"


def generalisation(evaluations: dict[str, dict]) -> tuple[list[str], list[str], dict[str, list[list[float | None]]]]:
    """(row names "model / strategy", task types, {"in-domain (test)": grid, "out-of-domain (ood)": grid})."""
    rows, grids = [], {"in-domain (test)": [], "out-of-domain (ood)": []}
    tasks = sorted({t for m in evaluations.values() for d in m.get("decoding", {}).values()
                    for key in ("by_task_type", "by_task_type_ood") for t in d.get(key, {})})
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
