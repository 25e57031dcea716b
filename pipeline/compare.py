"""Two versions' accuracies on the same questions: a paired bootstrap, and a gate on regressions.

    from pipeline.compare import paired_bootstrap, regressed
    result = paired_bootstrap(before_rows, after_rows)   # rows of data/evaluate/<model>/predictions.parquet
    result["difference"], result["ci_low"], result["ci_high"]
    regressed(result, margin=0.01)  # True when even the upper 95% bound is below -0.01

Rows pair on (split, id); both versions must hold the same questions with the same gold answers,
or the comparison is refused (a different test set is not a change in accuracy). The bootstrap
resamples the per-question differences (after minus before) with a fixed seed and number of
resamples, so the same predictions always give the same interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000
SEED = 0


class NotComparable(ValueError):
    """The two versions were not measured on the same questions."""


def _by_question(rows: Sequence[dict], label: str) -> dict[tuple[str, str], dict]:
    keyed: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (str(row.get("split")), str(row["id"]))
        if key in keyed:
            raise NotComparable(f"{label}: question {key[1]} of split {key[0]} appears twice")
        keyed[key] = row
    return keyed


def paired_bootstrap(before: Sequence[dict], after: Sequence[dict], *, resamples: int = RESAMPLES,
                     seed: int = SEED) -> dict:
    """The change in accuracy (after minus before) over the shared questions, with its 95% bootstrap interval."""
    a, b = _by_question(before, "before"), _by_question(after, "after")
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        example = (only_a or only_b)[0]
        raise NotComparable(f"the two test sets differ: {len(only_a)} questions only before, {len(only_b)} only "
                            f"after (e.g. {example[1]} of split {example[0]})")
    keys = sorted(a)
    changed = [k for k in keys if str(a[k].get("answer")) != str(b[k].get("answer"))]
    if changed:
        raise NotComparable(f"the two test sets differ: {len(changed)} questions have another gold answer "
                            f"(e.g. {changed[0][1]} of split {changed[0][0]})")
    if not keys:
        raise NotComparable("no questions to compare")
    diffs = np.array([float(bool(b[k]["correct"])) - float(bool(a[k]["correct"])) for k in keys])
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return {
        "questions": len(keys),
        "before": round(float(np.mean([bool(a[k]["correct"]) for k in keys])), 4),
        "after": round(float(np.mean([bool(b[k]["correct"]) for k in keys])), 4),
        "difference": round(float(diffs.mean()), 4),
        "standard_error": round(float(means.std(ddof=1)), 4),
        "ci_low": round(float(low), 4),
        "ci_high": round(float(high), 4),
        "resamples": resamples,
        "seed": seed,
    }


def regressed(result: dict, margin: float = 0.0) -> bool:
    """Did accuracy fall by more than `margin`, beyond doubt: the upper 95% bound below -margin?"""
    return result["ci_high"] < -margin


def is_commit(rev: str) -> bool:
    """Does git know `rev` as a commit (a hash, branch, tag, HEAD~1 or an experiment's full ref)?"""
    import subprocess

    return subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], capture_output=True,
                          check=False).returncode == 0


def resolve_rev(rev: str) -> str:
    """A git revision as it is; the name of a DVC experiment (`dvc exp show`) as its full ref, which git and DVC
    both read. An unknown name comes back unchanged (DVC then says it is unknown)."""
    if is_commit(rev):
        return rev
    from dvc.repo import Repo
    from dvc.repo.experiments.utils import resolve_name

    with Repo() as repo:
        found = resolve_name(repo.scm, rev).get(rev)
    return str(found) if found is not None else rev


def read_predictions(path: str, rev: str | None = None, split: str = "test") -> list[dict]:
    """The rows of one predictions.parquet of `split`: in the workspace, or at git revision `rev` through DVC
    (its cache, or its remote when the cache lacks it)."""
    import io

    import pyarrow.parquet as pq

    if rev is None:
        table = pq.read_table(path)
    else:
        import dvc.api

        with dvc.api.open(path, rev=rev, mode="rb") as handle:
            table = pq.read_table(io.BytesIO(handle.read()))
    return [row for row in table.to_pylist() if row.get("split") == split]


def compare_models(before: str, models: Sequence[str], after: str | None = None, split: str = "test"
                   ) -> dict[str, dict | str]:
    """model -> its paired bootstrap from revision `before` to `after` (None: the workspace), or why there is none.

    With the workspace as `after`, a model it has not evaluated is left out."""
    from pathlib import Path

    out: dict[str, dict | str] = {}
    for model in models:
        path = f"data/evaluate/{model}/predictions.parquet"
        if after is None and not Path(path).exists():
            continue
        try:
            then, now = read_predictions(path, before, split), read_predictions(path, after, split)
        except Exception as exc:  # not at that revision, or in neither the cache nor the remote
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            out[model] = f"no predictions: {reason}"
            continue
        try:
            out[model] = paired_bootstrap(then, now)
        except NotComparable as exc:
            out[model] = f"not comparable: {exc}"
    return out


def bootstrap_markdown(before: str, models: Sequence[str], after: str | None = None, split: str = "test",
                       results: dict[str, dict | str] | None = None) -> str:
    """Each model's greedy accuracy at `before` against `after` (None: the workspace), paired per question, as a
    markdown table; a model evaluated in neither is left out."""
    results = results if results is not None else compare_models(before, models, after, split)
    before, to = shown(before), shown(after) if after else "workspace"
    lines = [f"Greedy accuracy on {split}, {before} against {to} (paired bootstrap, {RESAMPLES:,} resamples, "
             f"seed {SEED}):", "",
             f"| model | {before} | {to} | change | 95% interval | questions |", "|---|---|---|---|---|---|"]
    for model, r in results.items():
        if isinstance(r, str):
            lines.append(f"| {model} | {r} | | | | |")
            continue
        lines.append(f"| {model} | {r['before']:.3f} | {r['after']:.3f} | {r['difference']:+.3f} | "
                     f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['questions']} |")
    return "\n".join(lines)


def shown(rev: str) -> str:
    """An experiment's full ref (`resolve_rev`) by its name, as `dvc exp show` lists it."""
    return rev.rsplit("/", 1)[-1] if rev.startswith("refs/exps/") else rev


def parse_gate(spec: str) -> tuple[str, float]:
    """'grpo:0.01' -> ('grpo', 0.01): a model whose greedy test accuracy must not fall by more than the margin
    (accuracy points as a fraction; no margin: 0)."""
    model, _, margin = spec.partition(":")
    try:
        value = float(margin) if margin else 0.0
    except ValueError:
        value = -1.0
    if not model or not 0 <= value < 1:
        raise ValueError(f"{spec!r}: expected MODEL[:MARGIN], e.g. grpo:0.01 (a margin in [0, 1))")
    from pipeline.report import STUDENTS

    if model not in ("teacher", *STUDENTS):
        raise ValueError(f"{spec!r}: {model} is not an evaluated model ({', '.join(('teacher', *STUDENTS))})")
    return model, value


def gate(results: dict[str, dict | str], specs: Sequence[str]) -> list[str]:
    """Why each gated model fails: a sure drop beyond its margin, or no comparison to judge by; [] when all pass."""
    failures = []
    for spec in specs:
        model, margin = parse_gate(spec)
        r = results.get(model, "not compared (not an evaluated model)")
        if isinstance(r, str):
            failures.append(f"{model}: cannot judge a regression: {r}")
        elif regressed(r, margin):
            failures.append(f"{model}: accuracy {r['before']:.3f} -> {r['after']:.3f} ({r['difference']:+.3f}, 95% "
                            f"interval [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]) fell by more than {margin}")
    return failures
