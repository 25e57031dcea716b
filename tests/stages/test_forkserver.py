"""The fork server that spares each stage process its imports: a real server, real stage processes.

A stage is `python -m stages.<name>`; here a probe package of that name in a temporary folder stands for the
repository's, so that each case sees what ran where: the fork's environment marker, the arguments, the working
directory, the streams, the exit code and a signal's end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core import forkserver

ROOT = Path(__file__).resolve().parents[2]

PROBE = '''
import os, signal, sys, time
print("forked" if os.environ.get("PIPELINE_FORKED") else "own process", os.getcwd(), sys.argv[1:], flush=True)
print("torch preloaded" if "torch" in sys.modules else "torch not loaded", file=sys.stderr, flush=True)
open("pid", "w").write(str(os.getpid()))
print("group", os.getpgrp(), file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":  # as a stage's own SIGTERM handler (pipeline.orchestration.flows._die_on_sigterm)
    def stopped(signum, frame):
        open("signal", "w").write(str(signum))
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, stopped)
    time.sleep(60)
if sys.argv[1] == "child":  # a stage that starts a process of its own (a launch's rank, a vLLM server)
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open("child", "w").write(str(child.pid))
    time.sleep(60)
if sys.argv[1] == "kill-group":  # as the fault hook's kill@<point>: a scheduler killing the job
    os.killpg(os.getpgrp(), 9)
sys.exit(int(sys.argv[1]))
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("probe")
    (folder / "stages").mkdir()
    (folder / "stages" / "__init__.py").write_text("from pipeline.core.forkserver import delegate\n\ndelegate()\n")
    (folder / "stages" / "probe.py").write_text(PROBE)
    return folder


@pytest.fixture(scope="module")
def server(probe):
    """(the environment the stages run with, pointing at a running server)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(forkserver.SWITCH, None)
    with forkserver.serving(env) as extra:
        deadline = time.time() + 60
        while True:  # listening once its imports are done
            try:
                with socket.socket(socket.AF_UNIX) as probe_connection:
                    probe_connection.connect(extra[forkserver.SWITCH])
                break
            except OSError:
                assert time.time() < deadline, "the fork server did not start listening"
                time.sleep(0.1)
        yield env | extra


def run_probe(env: dict, cwd: Path, *args: str, **popen) -> subprocess.Popen:
    # a process group of its own, as a job's: what kills the group must not reach pytest
    return subprocess.Popen([sys.executable, "-m", "stages.probe", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0, **popen)


def test_the_command_line_names_a_stage_module_or_nothing():
    py = "/venv/bin/python"
    assert forkserver.stage_module([py, "-m", "stages.sft"]) == "stages.sft"
    assert forkserver.stage_module([py, "-m", "stages.evaluate", "--model", "sft"]) == "stages.evaluate"
    assert forkserver.stage_module([py, "-X", "importtime", "-m", "stages.evaluate"]) is None  # the interpreter's own
    assert forkserver.stage_module([py, "-m", "pipeline", "repro"]) is None
    assert forkserver.stage_module([py, "script.py", "-m", "stages.sft"]) is None
    assert forkserver.stage_module([py, "-c", "import stages.sft"]) is None
    assert forkserver.stage_module([py, "-m"]) is None


def test_only_dvc_s_own_variables_may_differ():
    own = {"PATH": "/bin", "HF_HUB_OFFLINE": "1"}
    stage = own | {"DVC_STAGE": "sft", "DVC_ROOT": "/repo", forkserver.SWITCH: "/tmp/socket", "_": "/bin/python",
                   "SHLVL": "2"}  # the shell's bookkeeping: make and sh set `_` each their own way
    assert forkserver._differences(stage, own) == []
    assert forkserver._differences(stage | {"HF_HUB_OFFLINE": "0"}, own) == ["HF_HUB_OFFLINE"]
    assert forkserver._differences({"PATH": "/bin"}, own) == ["HF_HUB_OFFLINE"]


def test_a_stage_runs_in_a_fork_with_its_own_arguments_folder_streams_and_exit_code(server, probe):
    proc = run_probe(server | {"DVC_STAGE": "probe"}, probe, "3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert out.strip() == f"forked {probe} ['3']"
    assert "torch preloaded" in err
    assert int((probe / "pid").read_text()) != proc.pid  # the fork ran it, not the stage process
    assert f"group {proc.pid}" in err  # in the stage process's group, where a signal to the job reaches it


def test_a_stage_process_killed_outright_takes_what_its_fork_started_too(server, probe):
    (probe / "child").unlink(missing_ok=True)
    proc = run_probe(server, probe, "child")
    fork = wait_for_pid_file(probe, proc)
    deadline = time.time() + 30
    while not (probe / "child").exists() or not (probe / "child").read_text():
        assert time.time() < deadline, "the probe's child did not start"
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=30)
    assert gone(int((probe / "child").read_text()), 15) and gone(fork, 5)


def test_a_fork_that_kills_its_group_kills_the_stage_process_as_well(server, probe):
    proc = run_probe(server, probe, "kill-group")
    out, _ = proc.communicate(timeout=60)
    assert out.startswith("forked") and proc.returncode == -signal.SIGKILL


def test_another_environment_is_declined_and_the_stage_runs_itself(server, probe):
    proc = run_probe(server | {"HF_HUB_OFFLINE": "maybe"}, probe, "0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.startswith("own process")
    assert "fork server: environment differs: HF_HUB_OFFLINE" in err
    assert "torch not loaded" in err


def test_without_a_server_the_stage_runs_itself(probe, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), forkserver.SWITCH: str(tmp_path / "no-socket")}
    proc = run_probe(env, probe, "0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.startswith("own process")


def wait_for_pid_file(folder: Path, proc: subprocess.Popen) -> int:
    (folder / "pid").unlink(missing_ok=True)
    deadline = time.time() + 60
    while not (folder / "pid").exists() or not (folder / "pid").read_text():
        assert proc.poll() is None and time.time() < deadline, "the probe did not start"
        time.sleep(0.05)
    return int((folder / "pid").read_text())


def gone(pid: int, within: float) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_to_the_stage_process_reaches_the_fork_s_handler(server, probe):
    (probe / "signal").unlink(missing_ok=True)
    proc = run_probe(server, probe, "sleep")
    fork = wait_for_pid_file(probe, proc)
    proc.send_signal(signal.SIGTERM)  # to the stage process alone, as DVC's stop_tree sends it
    proc.communicate(timeout=30)
    assert (probe / "signal").read_text() == str(int(signal.SIGTERM))  # the fork's handler ran ...
    assert proc.returncode == 128 + signal.SIGTERM  # ... and its exit code is the stage process's
    assert gone(fork, 5)


def test_what_the_stage_process_ignores_the_fork_ignores(server, probe):
    """Under nohup (SIGHUP ignored) a hang-up to the job's group leaves the stage running, forked or not."""
    proc = run_probe(server, probe, "sleep", preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    fork = wait_for_pid_file(probe, proc)
    os.killpg(proc.pid, signal.SIGHUP)
    time.sleep(1)
    assert proc.poll() is None and not gone(fork, 0.1)
    proc.kill()
    proc.wait(timeout=30)


def test_a_stage_process_killed_outright_takes_its_fork_with_it(server, probe):
    proc = run_probe(server, probe, "sleep")
    fork = wait_for_pid_file(probe, proc)
    proc.kill()
    proc.wait(timeout=30)
    assert gone(fork, 5), "the fork ran on after its stage process was killed"


def test_a_stage_process_without_stdin_runs_itself(server, probe):
    proc = run_probe(server, probe, "4", stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4 and out.startswith("own process")


def test_a_stage_process_under_nice_runs_itself(server, probe):
    proc = run_probe(server, probe, "0", preexec_fn=lambda: os.nice(1))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.startswith("own process")
    assert "fork server: other process limits" in err


def test_a_fork_killed_alone_ends_its_stage_process_by_the_same_signal(server, probe):
    """The out-of-memory killer takes the fork, not the stage process: DVC must see a stage killed by SIGKILL."""
    proc = run_probe(server, probe, "sleep")
    fork = wait_for_pid_file(probe, proc)
    os.kill(fork, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
