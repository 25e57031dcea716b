"""python bench/orchestration.py [--repeats 3]

Orchestration costs, side by side in one process:
1. no-op `dvc repro` on this repository's outputs (run `make run` first) against
   an empty 3-stage DVC project in a temporary git repository;
2. per-stage overhead: a stage process that runs an empty Prefect flow on a
   shared server, against a bare `python -c pass`, and against the work of the
   real stages (seconds from the last default run's metrics);
3. a stage process that imports what a training stage imports (torch,
   transformers' models, TRL, Prefect) and runs an empty flow: forked from the
   fork server that `python -m pipeline repro` starts, against its own process.
Prints each pair's times and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.orchestration.flows import prefect_server

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def timed(cmd: list[str], cwd: Path, repeats: int, env: dict | None = None) -> float:
    """Median wall seconds of `cmd` (after one warm-up run)."""
    subprocess.run(cmd, cwd=cwd, env=env or ENV, capture_output=True, check=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env or ENV, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trivial_project(folder: Path) -> None:
    """Three chained stages that each copy a small file."""
    stages = {
        "a": {"cmd": "echo a > a.txt", "outs": ["a.txt"]},
        "b": {"cmd": "cat a.txt > b.txt", "deps": ["a.txt"], "outs": ["b.txt"]},
        "c": {"cmd": "cat b.txt > c.txt", "deps": ["b.txt"], "outs": ["c.txt"]},
    }
    (folder / "dvc.yaml").write_text(json.dumps({"stages": stages}))
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                [sys.executable, "-m", "dvc", "repro", "-q"]):
        subprocess.run(cmd, cwd=folder, env=ENV, check=True, capture_output=True)


PROBE_STAGE = """
import pipeline.modeling.models, pipeline.training.trainer  # what stages/sft.py imports first
from pipeline.orchestration.flows import run_stage
run_stage("probe", lambda: None)
"""


def fork_server_stage(folder: Path, env: dict, repeats: int) -> tuple[float, float]:
    """(own process, forked) median seconds of `python -m stages.probe`, a stage package of its own in `folder`."""
    from pipeline.core import forkserver

    (folder / "stages").mkdir()
    (folder / "stages" / "__init__.py").write_text("from pipeline.core.forkserver import delegate\ndelegate()\n")
    (folder / "stages" / "probe.py").write_text(PROBE_STAGE)
    probe = [sys.executable, "-m", "stages.probe"]
    own = timed(probe, folder, repeats, env)
    with forkserver.serving(env) as server:
        time.sleep(10)  # its imports done (a stage that comes earlier runs itself)
        check = subprocess.run(probe, cwd=folder, env=env | server, capture_output=True, text=True)
        assert check.returncode == 0 and "fork server:" not in check.stderr, check.stderr[-2000:]
        forked = timed(probe, folder, repeats, env | server)
    return own, forked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dvc = [sys.executable, "-m", "dvc", "repro"]
    if (ROOT / "dvc.lock").exists():
        with tempfile.TemporaryDirectory() as tmp:
            trivial_project(Path(tmp))
            base = timed(dvc, Path(tmp), args.repeats)
        ours = timed(dvc, ROOT, args.repeats)
        print(f"no-op dvc repro: pipeline {ours:.2f} s, empty 3-stage project {base:.2f} s, ratio {ours / base:.2f}")
        # the same without ruamel's C parser (ruamel.yaml.clib): DVC reads params.yaml once a stage, dvc.lock twice
        pure = [sys.executable, "-c", "import sys; sys.modules['_ruamel_yaml'] = None; from dvc.cli import main; "
                "sys.exit(main(['repro']))"]
        python_yaml = timed(pure, ROOT, args.repeats)
        print(f"no-op dvc repro without the C YAML parser: {python_yaml:.2f} s, ratio {python_yaml / ours:.2f}")
    else:
        print("no-op dvc repro: skipped (no dvc.lock; run `make run` first)")

    noop_stage = [sys.executable, "-c",
                  "from pipeline.orchestration.flows import run_stage; run_stage('noop', lambda: None)"]
    bare = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as home, prefect_server(home=Path(home)) as api:
        env = {**ENV, "PREFECT_API_URL": api, "PREFECT_HOME": home}
        stage = timed(noop_stage, ROOT, args.repeats, env)
    python = timed(bare, ROOT, args.repeats)
    print(f"per-stage overhead: empty-flow stage process {stage:.2f} s vs bare python {python:.2f} s, "
          f"ratio {stage / python:.1f} (Prefect costs {stage - python:.2f} s a stage)")
    # Outside `python -m pipeline repro` (plain dvc repro, dvc exp run, the queue): no PREFECT_API_URL.
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in ENV.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": home}
        shared = timed(noop_stage, ROOT, args.repeats, env)  # the warm-up run starts the shared server
        temporary = timed(noop_stage, ROOT, 1, env | {"PIPELINE_SHARED_SERVER": "0"})
        subprocess.run([sys.executable, "-m", "pipeline", "server", "--stop"], cwd=ROOT, env=env, capture_output=True)
    print(f"a stage outside the orchestrator: shared background server {shared:.2f} s vs a temporary server per "
          f"process {temporary:.2f} s, ratio {temporary / shared:.1f} (Prefect costs {shared - python:.2f} s a stage)")
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as home, \
            prefect_server(home=Path(home)) as api:
        env = {**ENV, "PREFECT_API_URL": api, "PREFECT_HOME": home, "PYTHONPATH": str(ROOT)}
        own, forked = fork_server_stage(Path(folder), env, args.repeats)
    print(f"a training stage's imports and an empty flow: own process {own:.2f} s, forked from the fork server "
          f"{forked:.2f} s, ratio {own / forked:.2f} ({own - forked:.2f} s saved a stage)")
    work = {}
    for name, key in (("synthesize", None), ("sft", "train_seconds")):
        path = ROOT / "timings" / f"{name}.json"  # the last run's seconds (pipeline.core.io.write_metrics)
        if path.exists() and key:
            work[name] = json.loads(path.read_text())[key]
    for name, seconds in work.items():
        print(f"  against {name}'s work ({seconds:.1f} s): overhead is {100 * stage / seconds:.1f}%")


if __name__ == "__main__":
    main()
