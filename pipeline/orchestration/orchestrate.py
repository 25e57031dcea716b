"""The orchestrator flow: one pipeline version under one Prefect flow, then its metrics as artifacts.

DVC decides what is stale; this flow runs it (its tasks: pull, repro, compare and gate, record,
push), shares one Prefect API server with every stage process (through `PREFECT_API_URL` in their
environment), and publishes this version's metrics, their diff against git HEAD and the paired
bootstrap of every model's accuracy against it. Scheduled runs call it with prefect.yaml's
parameters (`pipeline.orchestration.schedule`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from pipeline.core import forkserver, paths
from pipeline.core.phases import stage_logger
from pipeline.core.processes import stop_tree
from pipeline.core.versions import RECORDED, missing_remote, uncommitted_files
from pipeline.evaluation.report import decoding_markdown, generalisation_markdown, load_evaluations
from pipeline.orchestration import runlock
from pipeline.orchestration.flows import flatten, publish_markdown, publish_table
from pipeline.orchestration.sections import read_section
from pipeline.orchestration.validation import validate_all


def dvc(*args: str, capture: bool = False, tee: bool = False, fork_server: bool = False) -> subprocess.CompletedProcess:
    """Run the venv's DVC with the venv's `python` first on PATH (stage cmds say `python -m ...`).

    `capture` keeps both streams; `tee` passes stderr (DVC's and its stages') through as it comes and keeps its
    last `TEE_TAIL` bytes as the result's `stderr`. Interrupted here (SIGTERM through Prefect's handler, Ctrl-C),
    DVC and the stage it runs are stopped before this returns: killing DVC alone would leave the stage running,
    orphaned. `fork_server`: the stages DVC runs start as forks of one process with their imports done
    (pipeline.core.forkserver).
    """
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    pipe = subprocess.PIPE if capture else None
    with forkserver.serving(env) if fork_server else contextlib.nullcontext({}) as server:
        proc = subprocess.Popen([sys.executable, "-m", "dvc", *args], env=env | server, text=not tee, stdout=pipe,
                                stderr=subprocess.PIPE if capture or tee else None)
        try:
            if tee:
                tail = _pass_through(proc.stderr, sys.stderr)
                proc.wait()
                out, err = None, tail
            else:
                out, err = proc.communicate()
        except BaseException:
            stop_tree(proc.pid)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


TEE_TAIL = 64 * 1024  # bytes of a teed stderr kept: the failed stage's message and DVC's verdict are at its end


def _pass_through(source, sink) -> str:
    """Copy `source` (a binary pipe) to `sink` chunk by chunk until it closes (progress bars' carriage returns
    pass at once, not a line later); the last `TEE_TAIL` bytes, decoded."""
    tail = bytearray()
    while chunk := os.read(source.fileno(), 65536):
        sink.buffer.write(chunk) if hasattr(sink, "buffer") else sink.write(chunk.decode(errors="replace"))
        sink.flush()
        tail = (tail + chunk)[-TEE_TAIL:]
    return tail.decode(errors="replace")


# How DVC 3 ends a run whose stage failed (its last ERROR line), and how a stage states its reason (flows.fail).
_DVC_STAGE_FAILED = re.compile(r"failed to reproduce '([^']+)': failed to run: .*?, exited with (-?\d+)")
_STAGE_REASON = re.compile(r"^error: (.+)$", re.MULTILINE)
# How the repro flow's Failed state begins when a stage failed (then `stage NAME failed (exit N): reason`).
STAGE_FAILED = "dvc repro stopped: "


def stage_failure(stderr: str, returncode: int) -> tuple[str, int]:
    """(what failed and why, in one line; the exit code for it) from a failed `dvc repro`'s stderr tail: 2 when
    its stage exited 2 (bad params or input), else 1."""
    found = _DVC_STAGE_FAILED.findall(stderr)
    if not found:
        return f"dvc repro failed with exit code {returncode} (its message is above)", 1
    name, code = found[-1][0], int(found[-1][1])
    # its own lines: from DVC's "Running stage" to its verdict (an earlier stage's reason is not this one's)
    start = max(stderr.rfind(f"Running stage '{name}'"), 0)
    reasons = _STAGE_REASON.findall(stderr[start: stderr.rfind(f"failed to reproduce '{name}'")])
    reason = reasons[-1].strip() if reasons else "its log is above"
    return f"stage {name} failed (exit {code}): {reason}", 2 if code == 2 else 1


def failure_code(message: str) -> int:
    """The exit code a Failed repro flow's message stands for (`stage_failure`)."""
    return 2 if re.match(re.escape(STAGE_FAILED) + r"stage \S+ failed \(exit 2\)", message) else 1


def metrics_rows(root: Path = paths.METRICS) -> list[dict]:
    """One row per metric of every metrics/*.json file."""
    rows = []
    for file in sorted(root.rglob("*.json")):
        for key, value in flatten(json.loads(file.read_text())).items():
            rows.append({"file": str(file), "metric": key, "value": value})
    return rows


def diff_markdown(rev: str = "HEAD", after: str | None = None) -> str:
    """`dvc metrics diff` of `after` (None: the workspace) against `rev`, as a markdown table, without the timing
    keys (seconds, throughputs: `pipeline.core.io.is_timing`) that an older revision's metrics files still hold."""
    from pipeline.core.io import is_timing

    revs = [rev] + ([after] if after else [])
    proc = dvc("metrics", "diff", *revs, "--json", capture=True)
    if proc.returncode != 0:
        return f"`dvc metrics diff {' '.join(revs)}` failed: {proc.stderr.strip()[:500]}"
    diff = json.loads(proc.stdout or "{}")  # DVC 3: {file: {metric: {old, new, diff}}}, no wrapper key
    lines = ["| file | metric | old | new | change |", "|---|---|---|---|---|"]
    for file, entries in sorted(diff.items()):
        for key, d in sorted(entries.items()):
            if is_timing(key):  # a flattened key: any of its parts ("decoding.greedy.seconds_per_question")
                continue
            change = d.get('diff')
            change = round(change, 4) if isinstance(change, float) else change
            lines.append(f"| {file} | {key} | {d.get('old')} | {d.get('new')} | {change} |")
    from pipeline.evaluation.compare import shown  # an experiment by its name, not its full ref

    return "\n".join(lines) if len(lines) > 2 else f"No metric changed against {shown(rev)}."


def models_markdown(root: Path = paths.METRICS) -> str:
    """Every evaluated model side by side (greedy accuracy, pass@k, maj@k), then the RL yardstick:
    p0 (the SFT policy's sampled success on the RL pool), p*(p0, beta) and the success measured after GRPO."""
    from pipeline.evaluation.report import cell

    evaluations = load_evaluations(root)
    # the splits evaluated beside test (evaluate.splits: ood on the chart task, val where a profile asks for it)
    def accuracy(m: dict, split: str):
        return m.get(f"accuracy_{split}", (m.get(split) or {}).get("accuracy"))

    others = [s for s in ("val", "ood") if any(accuracy(m, s) is not None for m in evaluations.values())]
    lines = ["| model | test | " + "".join(f"{s} | " for s in others) + "step accuracy | pass@k | maj@k | "
             "sampled accuracy | tokens/question |", "|---|---|" + "---|" * (len(others) + 5)]
    for name, m in evaluations.items():
        sampled = m.get("sampled", {})
        k = sampled.get("k")
        values = [m.get("accuracy"), *(accuracy(m, s) for s in others), m.get("step_accuracy"),
                  f"{cell(m.get(f'pass_at_{k}'))} (k={k})", m.get(f"maj_at_{k}"), sampled.get("sampled_accuracy"),
                  m.get("tokens_per_question")]
        lines.append(f"| {name} | " + " | ".join(map(cell, values)) + " |")
    prm_file = root / "prm.json"
    if prm_file.exists():
        p = json.loads(prm_file.read_text())
        # the labels are the chart task's gold values, or Monte-Carlo (mc, mcts) ones on a dataset task
        sources = list(p.get("sources", {}))
        labels = "gold" if "gold" in sources else " and ".join(sources)
        held = p["held_out"]
        within = held.get("within_question", {})
        one_class = (f"one class only: {held.get('positive_share')} of the lines right; "
                     if p.get("auroc") is None and held.get("positive_share") in (0.0, 1.0) else "")
        ranked = (f"within one question, a right answer ranked above a wrong one in {within.get('pair_accuracy_mean')} "
                  f"of {within.get('pairs')} pairs (mean of line scores; 0.5 is chance)" if within.get("pairs") else
                  "no held-out question has both a right and a wrong answer to rank")
        lines += ["", f"PRM on held-out step labels ({labels}; {held['lines']} lines): AUROC {cell(p.get('auroc'))} "
                      f"({one_class}steps {cell(held.get('auroc_steps'))}, answers {cell(held.get('auroc_answers'))}), "
                      f"accuracy {cell(p.get('accuracy'))}, ECE {cell(p.get('ece'))}; {ranked}."]
    grpo_file = root / "grpo.json"
    if grpo_file.exists():
        g = json.loads(grpo_file.read_text())
        lines += ["", f"RL ({g.get('algorithm')}, {g.get('steps')} steps, {g.get('rollouts')} rollouts): "
                      f"p0 = {g.get('p0')} on the RL pool; success-amplification fixed point p*(p0, beta) = "
                      f"{g.get('p_star')}; measured on {g.get('success_prompts')} pool prompts: "
                      f"{g.get('p_before')} before, {g.get('p_after')} after."]
    return "\n".join(lines)


@task(retries=2, retry_delay_seconds=10, persist_result=False, cache_policy=NO_CACHE)
def dvc_transfer(command: str) -> None:
    """`dvc pull` or `dvc push`: safe to repeat, so retried (a remote's hiccup is not a failed run)."""
    if dvc(command).returncode != 0:
        raise RuntimeError(f"dvc {command} failed")


@task(persist_result=False, cache_policy=NO_CACHE)
def reproduce(targets: list[str] | None, force: bool) -> tuple[float, str | None]:
    """`dvc repro`: what is stale runs, each stage as its own flow. Not retried: a failure is a finding.

    (seconds, None), or (seconds, what failed): a failed stage is a reason the flow states (`stage_failure`), not
    a crash of this task (no traceback: the stage's own message is the news)."""
    start = time.perf_counter()
    proc = dvc("repro", *(["--force"] if force else []), *(targets or []), tee=True, fork_server=True)
    failed = stage_failure(proc.stderr, proc.returncode)[0] if proc.returncode != 0 else None
    return time.perf_counter() - start, failed


@task(persist_result=False, cache_policy=NO_CACHE)
def compare_with_previous(gate_specs: list[str], previous: str = "HEAD") -> list[str]:
    """This version's accuracies against `previous` (paired bootstrap per model), published as an artifact;
    the reasons the gate stops this version ([] when it passes or there is no gate)."""
    from pipeline.core.registry import STUDENTS
    from pipeline.evaluation.compare import bootstrap_markdown, compare_models, gate

    models = ["teacher", *STUDENTS]
    results = compare_models(previous, models)
    failures = gate(results, gate_specs) if gate_specs else []
    verdict = (["", "**The gate stopped this version** (nothing recorded or pushed):", *(f"- {f}" for f in failures)]
               if failures else ["", f"Gate: {', '.join(gate_specs)} passed."] if gate_specs else [])
    publish_markdown("pipeline-comparison", "\n".join([bootstrap_markdown(previous, models, results=results),
                                                        *verdict]),
                     f"Greedy test accuracy against {previous}: paired bootstrap per model, and the gate")
    return failures


@task(persist_result=False, cache_policy=NO_CACHE)
def record_version(message: str) -> str | None:
    """Commit this version (dvc.lock, params.yaml, metrics/) on the current branch; its hash, or None when
    nothing changed. The outputs themselves are in the DVC cache (and the remote after a push)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], text=True, capture_output=True, check=False)

    tracked = [p for p in RECORDED if Path(p).exists()]
    if (add := git("add", "--", *tracked)).returncode != 0:
        raise RuntimeError(f"git add failed: {add.stderr.strip()}")
    if git("diff", "--cached", "--quiet", "--", *tracked).returncode == 0:
        return None
    # these paths only: whatever else is staged stays staged, out of the version's commit
    if (commit := git("commit", "-q", "-m", message, "--", *tracked)).returncode != 0:
        raise RuntimeError(f"git commit failed: {commit.stderr.strip()}")
    return git("rev-parse", "HEAD").stdout.strip()


# How the flow's Failed state begins when the gate stopped a version (a verdict, not a crash: no traceback) ...
GATE_STOPPED = "the gate stopped this version; nothing recorded or pushed: "
# ... when a version to record rests on uncommitted changes, or the remote cannot work (checked before any work)
NOT_RECORDABLE = ("--record: a recorded dvc.lock would name changes no commit holds; commit or stash them first, "
                  "nothing was run: ")
NO_REMOTE = "--pull/--push: nothing was run: "
# Every Failed state the flow states a reason for (with STAGE_FAILED): the CLI prints it, without a traceback
STATED_FAILURES = (GATE_STOPPED, STAGE_FAILED, NOT_RECORDABLE, NO_REMOTE)


@flow(name="repro", persist_result=False)
def repro_flow(targets: list[str] | None = None, force: bool = False, pull: bool = False, push: bool = False,
               profile: str | None = None, sets: list[str] | None = None, gate: list[str] | None = None,
               record: bool = False) -> dict | State:
    """One pipeline version: pull, re-run what is stale, compare with git HEAD and gate, record, push.

    `profile` and `sets` rewrite params.yaml first (as `python -m pipeline repro --profile P -S k=v`);
    `gate` holds `MODEL[:MARGIN]` specs (`python -m pipeline report --fail-on-regression`): a version
    that fails one is neither recorded nor pushed, and the run ends Failed saying why (`GATE_STOPPED`). `record` commits
    the version (dvc.lock, params.yaml, metrics/). Scheduled runs take these from prefect.yaml.
    """
    if not Path("dvc.yaml").exists():  # a deployment's working directory that is not this repository
        raise RuntimeError(f"{Path.cwd()}: no dvc.yaml here; run the flow from the repository's root")
    with runlock.hold(read_section("repro").lock_timeout):  # already held when run by `python -m pipeline repro`
        return _one_version(targets, force, pull, push, profile, sets, gate, record)


def _one_version(targets: list[str] | None, force: bool, pull: bool, push: bool, profile: str | None,
                 sets: list[str] | None, gate: list[str] | None, record: bool) -> dict | State:
    log = stage_logger()
    if profile is not None or sets:
        from pipeline.orchestration import profiles

        chosen = profile or profiles.header_of(Path("params.yaml").read_text())[0] or profiles.DEFAULT
        if profiles.write(chosen, profiles.compact(list(sets or []))):
            log.info("params.yaml: profile %s %s", chosen, " ".join(sets or []))
    validate_all()  # every section, before DVC starts anything
    if record and (dirty := uncommitted_files()):
        return Failed(message=NOT_RECORDABLE + ", ".join(dirty[:8]))
    if (pull or push) and (problem := missing_remote()):  # before the run, not after it (and not retried)
        return Failed(message=NO_REMOTE + problem)
    if pull:
        dvc_transfer("pull")
    seconds, failed = reproduce(targets, force)
    if failed:
        log.error("%s%s", STAGE_FAILED, failed)
        return Failed(message=STAGE_FAILED + failed)
    log.info("dvc repro finished in %.1f s", seconds)
    failures = compare_with_previous(list(gate or []))
    if failures:
        log.error("%s%s", GATE_STOPPED, "; ".join(failures))
        return Failed(message=GATE_STOPPED + "; ".join(failures))
    diff = diff_markdown()  # against the HEAD before this version is recorded (then HEAD is this version)
    if record:
        commit = record_version(f"Pipeline version of {time.strftime('%Y-%m-%d %H:%M')} (repro flow"
                                f"{', profile ' + profile if profile else ''})")
        log.info("version recorded: %s", commit or "nothing changed, no commit")
    if push:
        dvc_transfer("push")
    rows = metrics_rows()
    if rows:
        publish_table("pipeline-metrics", rows, "Metrics of this pipeline version (metrics/*.json)")
    publish_markdown("pipeline-metrics-diff", diff, "dvc metrics diff against git HEAD (before this version)")
    publish_markdown("pipeline-models", models_markdown(), "Every evaluated model side by side, and the RL yardstick")
    evaluations = load_evaluations()
    publish_markdown("pipeline-decoding", decoding_markdown(evaluations),
                     "Decoding strategies at one sample budget: accuracy beside cost; faithfulness")
    publish_markdown("pipeline-generalisation", generalisation_markdown(evaluations),
                     "Accuracy per task type, in-domain and out-of-domain, every model and strategy")
    return {r["file"] + ":" + r["metric"]: r["value"] for r in rows}
