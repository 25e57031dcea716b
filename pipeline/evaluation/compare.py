"""Two versions' accuracies on the same questions: a paired bootstrap, and a gate on regressions.

    from pipeline.evaluation.compare import paired_bootstrap, regressed
    result = paired_bootstrap(before_rows, after_rows)   # rows of data/evaluate/<model>/predictions.parquet
    result["difference"], result["ci_low"], result["ci_high"]
    regressed(result, margin=0.01)  # True when even the upper 95% bound is below -0.01
    results = compare_models("HEAD", ["sft", "grpo"])   # model -> result, or why none (`Missing`: no predictions)
    missing_lines(results)  # one line per version lacking predictions: which, and what gets them
    judge(results, ["grpo:0.01"])  # (regressions, models it cannot judge): `report` exits 1, or 3 on the second alone

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


class Missing(str):
    """Why a model has no comparison when its predictions could not be read at one version or both: the reason in
    words (a str, as every other reason `compare_models` gives), and `versions`, each version that lacks them as
    (revision, None for the workspace; the dvc.lock stage that records them there, None when none does)."""

    versions: tuple[tuple[str | None, str | None], ...]

    def __new__(cls, text: str, versions: Sequence[tuple[str | None, str | None]]) -> "Missing":
        self = super().__new__(cls, text)
        self.versions = tuple(versions)
        return self


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


def recording_stage(path: str, rev: str | None = None) -> str | None:
    """The stage of `rev`'s dvc.lock (None: the workspace's) with an output holding `path`; None when none has."""
    import subprocess
    from pathlib import Path

    import yaml

    if rev is None:
        text = Path("dvc.lock").read_text() if Path("dvc.lock").exists() else ""
    else:
        proc = subprocess.run(["git", "show", f"{rev}:dvc.lock"], capture_output=True, text=True, check=False)
        text = proc.stdout if proc.returncode == 0 else ""
    try:
        stages = (yaml.safe_load(text) or {}).get("stages") or {}
    except yaml.YAMLError:
        return None
    for name, stage in stages.items():
        for out in (stage or {}).get("outs") or []:
            own = str(out.get("path", "")).rstrip("/")
            if own and (path == own or path.startswith(own + "/")):
                return name
    return None


def _read_or_missing(path: str, rev: str | None, split: str) -> list[dict] | tuple[str | None, str | None, str]:
    """The rows of `path` at `rev` (None: the workspace), or (rev, the stage recording it there, why not)."""
    try:
        return read_predictions(path, rev, split)
    except Exception as exc:  # not at that revision, or in neither the cache nor the remote (DVC says it its way)
        stage = recording_stage(path, rev)
        if stage is None:
            why = "not evaluated there" if rev is not None else "not evaluated here"
        elif isinstance(exc, FileNotFoundError) or type(exc).__name__ in ("DataIndexDirError", "DataIndexError",
                                                                           "PathMissingError"):
            why = ("its dvc.lock records them, in neither the DVC cache nor the remote" if rev is not None else
                   "dvc.lock records them, not here")
        else:  # something else went wrong (a remote that refused, a damaged file): DVC's own first line
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return rev, stage, why


def compare_models(before: str, models: Sequence[str], after: str | None = None, split: str = "test"
                   ) -> dict[str, dict | str]:
    """model -> its paired bootstrap from revision `before` to `after` (None: the workspace), or why there is none
    (a `Missing` when a version lacks its predictions: `missing_lines` says what fetches them).

    With the workspace as `after`, a model it has not evaluated (no stage of its dvc.lock records the predictions)
    is left out; one it has, whose predictions are not here (a fresh clone before `dvc pull`), is a `Missing`."""
    from pathlib import Path

    out: dict[str, dict | str] = {}
    for model in models:
        path = f"data/evaluate/{model}/predictions.parquet"
        if after is None and not Path(path).exists() and recording_stage(path) is None:
            continue
        then, now = _read_or_missing(path, before, split), _read_or_missing(path, after, split)
        lacking = [r for r in (then, now) if isinstance(r, tuple)]
        if lacking:
            out[model] = Missing("; ".join(f"no predictions {_at(rev)}: {why}" for rev, _, why in lacking),
                                 [(rev, stage) for rev, stage, _ in lacking])
            continue
        try:
            out[model] = paired_bootstrap(then, now)
        except NotComparable as exc:
            out[model] = f"not comparable: {exc}"
    return out


def _at(rev: str | None) -> str:
    return f"at {shown(rev)}" if rev else "in the workspace"


def missing_lines(results: dict[str, dict | str]) -> list[str]:
    """One line per version whose predictions are missing: which models', and what gets them (`dvc push` where that
    version ran and the remote this report reads, or re-running them at that revision)."""
    from pipeline.core.versions import default_remote

    by_version: dict[str | None, list[tuple[str, str | None]]] = {}
    for model, r in results.items():
        for rev, stage in getattr(r, "versions", ()):
            by_version.setdefault(rev, []).append((model, stage))
    if not by_version:
        return []
    remote = default_remote()
    where = (f"remote `{remote[0]}` ({remote[1]}{'' if remote[2] else ': no such folder, `make remote` makes it'})"
             if remote else "a DVC remote (none is configured: `make remote`, or `dvc remote add -d`)")
    lines = []
    for rev, entries in by_version.items():
        recorded = [(m, s) for m, s in entries if s is not None]
        unrecorded = [m for m, s in entries if s is None]
        name = shown(rev) if rev else "workspace"
        parts = []
        if recorded:
            models, stages = ", ".join(m for m, _ in recorded), " ".join(s for _, s in recorded)
            if rev is None:
                pull = f"dvc pull -r {remote[0]} {stages}" if remote else f"dvc pull {stages}"
                parts.append(f"no predictions of {models} here, though dvc.lock records them: `{pull}` fetches them "
                             f"from {where}, or `python -m pipeline repro {stages}` makes them")
            else:
                push = f"`dvc push -r {remote[0]}`" if remote else "`dvc push`"
                parts.append(f"no predictions of {models}: its dvc.lock records them ({stages}), but neither this "
                             f"DVC cache nor {where} holds them; {push} where {name} was run puts them where this "
                             f"report reads them, or re-run them at {name}: {_rerun_at(rev, stages)}")
        if unrecorded:
            parts.append(f"{', '.join(unrecorded)} not evaluated at {name} (no evaluate@ stage of its dvc.lock "
                         "holds them): nothing to fetch; re-running that revision with them evaluated would compare "
                         "them")
        lines.append(f"{name}: " + "; ".join(parts))
    return lines


def _rerun_at(rev: str, stages: str) -> str:
    """The commands that make a revision's outputs in a checkout of their own whose DVC cache is this one (so this
    report then reads them)."""
    import os
    import re

    cache = os.path.abspath(os.path.join(".dvc", "cache"))
    folder = "../at-" + re.sub(r"[^\w.-]", "-", shown(rev))
    return (f"`git worktree add --detach {folder} {rev} && cd {folder} && dvc cache dir --local {cache} && "
            f"python -m pipeline repro {stages}`")


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
        if isinstance(r, Missing):  # DVC's wording for it is its internals: the lines below say what is missing
            lines.append(f"| {model} | no predictions {' and '.join(_at(v) for v, _ in r.versions)} | | | | |")
            continue
        if isinstance(r, str):
            lines.append(f"| {model} | {r} | | | | |")
            continue
        lines.append(f"| {model} | {r['before']:.3f} | {r['after']:.3f} | {r['difference']:+.3f} | "
                     f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['questions']} |")
    if missing := missing_lines(results):
        lines += ["", "Missing, and what gets it:", "", *(f"- {line}" for line in missing)]
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
    from pipeline.core.registry import STUDENTS

    if model not in ("teacher", *STUDENTS):
        raise ValueError(f"{spec!r}: {model} is not an evaluated model ({', '.join(('teacher', *STUDENTS))})")
    return model, value


def judge(results: dict[str, dict | str], specs: Sequence[str]) -> tuple[list[str], list[str]]:
    """(each gated model that surely fell beyond its margin, each gated model with no comparison to judge by), in
    words; ([], []) when all pass. `report --fail-on-regression` exits 1 on the first, 3 on the second alone."""
    regressions, unjudged = [], []
    for spec in specs:
        model, margin = parse_gate(spec)
        # compare_models leaves out a model the workspace has not evaluated
        r = results.get(model, f"not evaluated in the workspace (no data/evaluate/{model}/predictions.parquet)")
        if isinstance(r, str):
            unjudged.append(f"{model}: cannot judge a regression: {r}")
        elif regressed(r, margin):
            regressions.append(f"{model}: accuracy {r['before']:.3f} -> {r['after']:.3f} ({r['difference']:+.3f}, "
                               f"95% interval [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]) fell by more than {margin}")
    return regressions, unjudged


def gate(results: dict[str, dict | str], specs: Sequence[str]) -> list[str]:
    """Why each gated model fails: a sure drop beyond its margin, or no comparison to judge by; [] when all pass
    (`judge` keeps the two apart)."""
    regressions, unjudged = judge(results, specs)
    order = {spec.partition(":")[0]: i for i, spec in enumerate(specs)}
    return sorted([*regressions, *unjudged], key=lambda line: order.get(line.partition(":")[0], len(order)))
