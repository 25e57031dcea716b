"""Prefect plumbing: run a stage as a flow, share one API server, publish artifacts.

Every `python -m stages.<name>` runs its work inside a Prefect flow named after
the stage. `python -m pipeline repro` starts one server and hands its URL to
every stage process through the environment (`PREFECT_API_URL`). A stage run
without one (plain `dvc repro`, `dvc exp run`, the experiment queue) uses this
machine's shared background server, found through `$PREFECT_HOME/pipeline-server.json`
or started there by the first stage that needs it. It keeps running, so the
next stages pay no start-up, until no stage has used it for
`PIPELINE_SERVER_IDLE_SECONDS` (default 600, read when it starts; 0: never), when
it stops itself and says so in `$PREFECT_HOME/pipeline-server.log`
(`pipeline.orchestration.idle`); the next stage then starts a fresh one. `python -m pipeline
server --stop` stops it at once.
`PIPELINE_SHARED_SERVER=0` restores Prefect's own temporary server per process
(its cost: BENCHMARKS.md, "Orchestration").
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core import phases
from pipeline.core.forkserver import FORKED, PREFECT_DEFAULTS
from pipeline.core.io import DISK_FULL, ConfigError, InputError, StageFailed
from pipeline.core.phases import is_expected, phase
from pipeline.orchestration.tether import GRACE as TETHER_GRACE

# Quiet, offline defaults; a user's own environment wins.
for _key, _value in PREFECT_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

# Set (to a file path) by the e2e test: each stage process appends the repository files it imported.
IMPORT_LOG = "PIPELINE_IMPORT_LOG"


def fail(message: str, code: int = 2) -> None:
    """Print a one-line reason and exit non-zero (no traceback for expected bad input)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


@contextlib.contextmanager
def expected_errors() -> Iterator[None]:
    """Bad params, bad inputs and a full disk: a clear message and exit code 2; a stage that failed for a
    reason it names (training diverged): the message and exit code 1. No traceback for either."""
    try:
        yield
    except (ConfigError, InputError) as exc:
        fail(str(exc))
    except StageFailed as exc:
        fail(str(exc), code=1)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        fail(f"{exc.filename}: {exc.strerror}")


def run_stage(name: str, body: Callable[..., Any], *args: Any) -> Any:
    """Run `body(*args)` as the Prefect flow `name`; bad input exits 2 with its message.

    The stage's main passes its own sections in `args`; the run-wide ones (the task, the prompt format, model
    loading, the generation engine, checkpoints, trackers) are read here and handed to the rooms that read them
    for the run (`pipeline.core.params.giving`). A training stage that `launch` spreads over several processes
    runs them instead, as the flow's one task (`pipeline.orchestration.launch`); each of those ranks runs `body`
    here again, without a flow (`_run_rank`)."""
    from pipeline.core.params import giving
    from pipeline.orchestration.sections import run_settings

    with expected_errors():
        settings = run_settings()
    with giving(*settings):
        return _run_stage(name, body, *args)


def _run_stage(name: str, body: Callable[..., Any], *args: Any) -> Any:
    from pipeline.orchestration import launch

    phases.current_stage = name  # not os.environ: stages run in one process (the tests) would pass it on to the next
    if launch.in_rank():
        return _run_rank(name, body, *args)
    with expected_errors():
        plan = launch.plan_for(os.environ.get("DVC_STAGE", name))
        if plan is not None:
            launch.check(plan)  # before any work: this machine's GPUs or cores, the accelerate config
            body, args = _launched, (plan,)
    if not os.environ.get("PREFECT_API_URL") and os.environ.get(SHARED_SERVER_SWITCH, "1") != "0":
        if "prefect" in sys.modules:
            raise RuntimeError("run_stage: Prefect was imported before the shared server's URL was set")
        os.environ["PREFECT_API_URL"] = shared_server()
    from prefect import flow  # imported here: params are validated before Prefect loads
    from prefect.states import Failed

    expected: list[Exception] = []

    def body_then_metrics(*inner: Any) -> Any:
        _die_on_sigterm(name)
        try:
            out = body(*inner)
        except Exception as exc:
            if not is_expected(exc):
                raise
            # A reason, not a crash: the run ends Failed with the message, and Prefect logs no traceback.
            expected.append(exc)
            return Failed(message=str(exc))
        publish_stage_metrics(os.environ.get("DVC_STAGE", name))
        if "pipeline.training.checkpoints" in sys.modules:  # the stage trained: its outputs are in place now
            sys.modules["pipeline.training.checkpoints"].stage_completed()
        return out

    functools.update_wrapper(body_then_metrics, body)
    stage_flow = flow(name=name, persist_result=False, validate_parameters=False)(body_then_metrics)
    with expected_errors():
        state = stage_flow(*args, return_state=True)
        if expected:
            raise expected[0]
        result = state.result()
    if os.environ.get(IMPORT_LOG):
        log_imports(os.environ[IMPORT_LOG], os.environ.get("DVC_STAGE", name))
    return result


def _run_rank(name: str, body: Callable[..., Any], *args: Any) -> Any:
    """One rank of a launched stage: `body` as a plain call, its log lines marked with the rank; rank 0 (the one
    that wrote the outputs) then removes the run's checkpoints."""
    from pipeline.core.io import rank, wait_for_ranks
    from pipeline.orchestration.launch import watch_launcher

    watch_launcher()
    logging.basicConfig(level=logging.INFO, format=f"[{name} rank {rank()}] %(message)s", stream=sys.stderr)
    with expected_errors():
        out = body(*args)
    wait_for_ranks()  # every rank is done with the run's checkpoints before rank 0 removes them
    if rank() == 0 and "pipeline.training.checkpoints" in sys.modules:
        sys.modules["pipeline.training.checkpoints"].stage_completed()
    return out


def _launched(plan: Any) -> None:
    """The flow's body for a launched stage: start the ranks and wait, their output in the flow's log."""
    from pipeline.orchestration import launch

    phase("launch ranks")(launch.run_ranks)(plan)


def _die_on_sigterm(name: str) -> None:
    """SIGTERM (or Ctrl-C's SIGINT) ends the stage process at once (exit 143 or 130), its output not put in place.

    Prefect's own handler marks the flow run Crashed but can leave the process alive (seen with Prefect 3.9:
    a stage went on training, orphaned, after its `dvc repro` was gone). The next run removes the
    temporary folder this leaves (`pipeline.core.io.atomic_dir`).
    """
    import signal

    def terminate(signum: int, frame: Any) -> None:
        print(f"error: stage {name} stopped by signal {signum}; its output was not written", file=sys.stderr,
              flush=True)
        if "pipeline.orchestration.launch" in sys.modules:  # a launched stage's ranks stop with it
            sys.modules["pipeline.orchestration.launch"].stop()
        if "pipeline.rl.vllm_server" in sys.modules:  # and a vLLM server the stage started
            sys.modules["pipeline.rl.vllm_server"].stop()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # Ctrl-C reaches the stage too: no traceback
        signal.signal(signal.SIGINT, terminate)


def flatten(data: dict, prefix: str = "") -> dict[str, float]:
    """Nested metrics to dotted keys with numeric leaves."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def publish_stage_metrics(stage: str) -> None:
    """The stage's own metrics file and its timings as a table artifact of its flow run (`evaluate@sft`:
    metrics/evaluate/sft.json, timings/evaluate/sft.json)."""
    from pipeline.core import paths

    base, _, model = stage.partition("@")  # foreach stages: evaluate@<model>
    file = paths.eval_metrics_file(model) if model else paths.metrics_file(base)
    if not file.exists():
        return
    rows = [{"metric": k, "value": v} for k, v in flatten(json.loads(file.read_text())).items()]
    timings = paths.timings_file(file)  # the run's wall-clock figures, which DVC does not hash
    if timings.exists():
        rows += [{"metric": k, "value": v} for k, v in flatten(json.loads(timings.read_text())).items()]
    key = re.sub(r"[^a-z0-9-]+", "-", f"{stage}-metrics".lower())
    publish_table(key, rows, f"Metrics of stage {stage} ({file}; timings: {timings})")


def log_imports(target: str, stage: str) -> None:
    """Append {stage, files, forked}: every `pipeline/` and `stages/` file this process has imported, and whether
    it is a fork of the fork server (pipeline.core.forkserver).

    Read after the stage's work, so imports inside functions count too: the e2e test
    checks them against the stage's deps in dvc.yaml, which a static look at
    module-level imports (tests/unit/test_dag.py) cannot.
    """
    root = Path.cwd().resolve()
    files = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in ("pipeline", "stages"):
            files.add(str(path.relative_to(root)))
    with open(target, "a") as out:  # one short line per stage process: appends do not interleave
        out.write(json.dumps({"stage": stage, "files": sorted(files), "forked": bool(os.environ.get(FORKED))}) + "\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def server_started(pid: int, url: str) -> None:
    """Note the server in the run lock's record, for a second run's message and the fault suite."""
    from pipeline.orchestration import runlock

    runlock.annotate(server={"pid": pid, "url": url})


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser()


def _start_server(log_path: Path, timeout: float, home: Path | None = None, tethered: bool = False,
                  idle: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """A Prefect API server on a free loopback port, in its own session, logging to `log_path`; returned once
    healthy (killed, and an error naming the log, when it exits or is not healthy within `timeout` s).

    `tethered`: started through `pipeline.orchestration.tether`, so it stops when this process dies, even by SIGKILL.
    `idle`: started through `pipeline.orchestration.idle` with these arguments, so it stops once unused; the process
    returned is then that watchdog, leader of the session.
    """
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    if tethered:
        command = [sys.executable, "-m", "pipeline.orchestration.tether", "--", *command]
    elif idle is not None:
        command = [sys.executable, "-m", "pipeline.orchestration.idle", *idle, "--", *command]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE if tethered else subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not _healthy(api_url):
        if proc.poll() is not None:
            raise RuntimeError(f"Prefect server exited with code {proc.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            _kill_session(proc)
            raise RuntimeError(f"Prefect server not healthy after {timeout:.0f} s; see {log_path}")
        time.sleep(0.3)
    return proc, api_url


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the session `proc` leads (the server and every process it started)."""
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def prefect_server(home: Path | None = None, timeout: float = 120.0) -> Iterator[str]:
    """Yield an API URL: `PREFECT_API_URL` when set, else a server started here and stopped after.

    The server listens on loopback only; its SQLite database lives in `home`
    (default: Prefect's own, so the runs stay browsable with `make server`). It is tethered to this
    process (`pipeline.orchestration.tether`): killed with it, it dies too instead of running on, orphaned.
    """
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    log_dir = home if home is not None else prefect_home()
    log_dir.mkdir(parents=True, exist_ok=True)
    proc, api_url = _start_server(log_dir / "server.log", timeout, home, tethered=True)
    server_started(proc.pid, api_url)
    try:
        yield api_url
    finally:
        drain_prefect()
        proc.terminate()  # the tether stops the server, then exits
        try:
            proc.wait(timeout=TETHER_GRACE + 5)
        except subprocess.TimeoutExpired:
            _kill_session(proc)


SHARED_SERVER_SWITCH = "PIPELINE_SHARED_SERVER"
SHARED_SERVER_FILE = "pipeline-server.json"  # in PREFECT_HOME: {"url", "pid"} of the shared server
SHARED_SERVER_LOCK = "pipeline-server.lock"  # flock: taking or stopping the shared server
SHARED_SERVER_IN_USE = "pipeline-server.in-use"  # shared flock, held by each process that took the server
IDLE_SECONDS = "PIPELINE_SERVER_IDLE_SECONDS"  # the shared server stops after this long unused (0: never)
_in_use: dict[Path, Any] = {}  # the open in-use files of this process, held until it exits


def idle_seconds() -> float:
    value = os.environ.get(IDLE_SECONDS, "600")
    try:
        return float(value)
    except ValueError:
        fail(f"{IDLE_SECONDS}={value!r}: not a number of seconds")  # exits 2
        raise


def shared_server(timeout: float = 120.0) -> str:
    """The API URL of this machine's shared background Prefect server, started (detached) if none answers.

    A lock file serialises the check and the start, so stages started at once (the experiment queue's
    workers) share one server. Its database is PREFECT_HOME's, so its runs stay browsable. It runs under
    `pipeline.orchestration.idle`, which stops it once no process has held the in-use flock (taken here, kept until this
    process exits) or touched the state file (done here) for `PIPELINE_SERVER_IDLE_SECONDS`.
    """
    import fcntl

    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    state = home / SHARED_SERVER_FILE
    with open(home / SHARED_SERVER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        url = None
        if state.exists():
            try:
                url = json.loads(state.read_text())["url"]
            except (ValueError, KeyError):
                url = None
        if url and _healthy(url):
            state.touch()  # in use: its watchdog waits a full idle time from now
        else:
            idle = ["--seconds", str(idle_seconds()), "--state", str(state), "--lock", str(home / SHARED_SERVER_LOCK),
                    "--in-use", str(home / SHARED_SERVER_IN_USE)]
            proc, url = _start_server(home / "pipeline-server.log", timeout, idle=idle)  # left running
            state.write_text(json.dumps({"url": url, "pid": proc.pid}))
        if home not in _in_use:  # taken before the lock goes: the watchdog sees this process from now on
            _in_use[home] = open(home / SHARED_SERVER_IN_USE, "a")
            fcntl.flock(_in_use[home], fcntl.LOCK_SH)
        return url


def shared_server_status() -> dict | None:
    """The shared background server when one answers: {"url", "pid", "idle_for" (seconds since a stage last took
    its URL; one may still be running on it), "idle_seconds" (after how long unused it stops, as its watchdog was
    started; None if unknown)}; None when none is recorded or the recorded one does not answer. Read-only: it
    starts nothing, takes no lock and touches no file, so asking does not keep the server up."""
    import psutil

    state = prefect_home() / SHARED_SERVER_FILE
    try:
        info = json.loads(state.read_text())
        url, pid = info["url"], int(info["pid"])
        touched = state.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _healthy(url):
        return None
    idle = None
    try:
        # the pipeline.orchestration.idle watchdog: `--seconds S` among its arguments
        command = psutil.Process(pid).cmdline()
        if "--seconds" in command:
            idle = float(command[command.index("--seconds") + 1])
    except (psutil.Error, IndexError, ValueError):
        idle = None
    return {"url": url, "pid": pid, "idle_for": max(0.0, time.time() - touched), "idle_seconds": idle}


def stop_shared_server() -> str:
    """Stop the shared background server, if one runs; what was done, in words."""
    import signal

    state = prefect_home() / SHARED_SERVER_FILE
    if not state.exists():
        return "no shared Prefect server recorded"
    try:
        info = json.loads(state.read_text())
        os.killpg(int(info["pid"]), signal.SIGTERM)  # its own session: the server and its workers
        stopped = f"stopped the shared Prefect server at {info['url']} (PID {info['pid']})"
    except (ValueError, KeyError, ProcessLookupError, PermissionError):
        stopped = "the shared Prefect server was not running"
    state.unlink(missing_ok=True)
    return stopped


def drain_prefect(timeout: float = 10.0) -> None:
    """Send the logs and events this process still holds, while the server is up.

    Prefect otherwise drains them at interpreter exit, after the server is gone,
    and retries against the dead URL for about a minute.
    """
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout)


def publish_table(key: str, rows: list[dict], description: str) -> None:
    """A Prefect table artifact (keys: lowercase letters, digits and dashes)."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(key=key, table=rows, description=description)


def publish_markdown(key: str, markdown: str, description: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(key=key, markdown=markdown, description=description)
