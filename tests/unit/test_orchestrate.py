"""How `python -m pipeline repro` reads a failed `dvc repro` (pipeline/orchestration/orchestrate.py): the stage, its
exit code and its own reason, from the stderr it passed through."""

from __future__ import annotations

import io
import os
import subprocess
import threading

from pipeline.orchestration.orchestrate import STAGE_FAILED, TEE_TAIL, _pass_through, failure_code, stage_failure

# What DVC 3 and a stage print when the stage refuses its input (flows.fail, then DVC's verdict)
BAD_INPUT = """Running stage 'synthesize':
> python -m stages.synthesize
09:26:27.379 | INFO    | Flow run 'x' - Finished in state Failed('task.dataset.path: d.jsonl: empty file')
error: task.dataset.path: d.jsonl: empty file
ERROR: failed to reproduce 'synthesize': failed to run: python -m stages.synthesize, exited with 2
"""


def test_a_stage_that_exits_2_is_named_with_its_reason_and_code_2():
    assert stage_failure(BAD_INPUT, 255) == ("stage synthesize failed (exit 2): task.dataset.path: d.jsonl: empty file",
                                             2)
    assert failure_code(STAGE_FAILED + stage_failure(BAD_INPUT, 255)[0]) == 2


def test_another_failure_is_code_1_and_reads_only_the_failed_stages_reason():
    # an earlier stage's error line (it passed on a retry, say) is not this failure's reason
    text = ("error: an old reason\nRunning stage 'evaluate@sft':\nTraceback (most recent call last):\n"
            "ValueError: boom\nERROR: failed to reproduce 'evaluate@sft': failed to run: python -m stages.evaluate "
            "--model sft, exited with 1\n")
    message, code = stage_failure(text, 255)
    assert code == 1 and message == "stage evaluate@sft failed (exit 1): its log is above"
    killed = stage_failure("ERROR: failed to reproduce 'sft': failed to run: python -m stages.sft, exited with -9\n",
                           255)
    assert killed == ("stage sft failed (exit -9): its log is above", 1)
    # DVC failing before any stage (a broken dvc.yaml, a lock): its own message is above
    assert stage_failure("ERROR: unable to read 'dvc.yaml'\n", 255) == (
        "dvc repro failed with exit code 255 (its message is above)", 1)
    assert failure_code(STAGE_FAILED + killed[0]) == 1
    assert failure_code("the gate stopped this version; nothing recorded or pushed: sft fell") == 1


def test_the_pass_through_copies_everything_and_keeps_the_tail():
    read, write = os.pipe()
    payload = b"progress 10%\r" * 10_000 + b"error: the end\n"

    def writer() -> None:  # as DVC would be, on the pipe's other end
        with os.fdopen(write, "wb") as fh:
            fh.write(payload)

    thread = threading.Thread(target=writer)
    thread.start()
    sink = io.StringIO()
    with os.fdopen(read, "rb") as source:
        tail = _pass_through(source, sink)
    thread.join()
    assert sink.getvalue() == payload.decode()
    assert len(tail) == TEE_TAIL and tail.endswith("error: the end\n")


def git(*args: str, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_a_recorded_version_commits_its_lock_params_and_metrics_only(tmp_path, monkeypatch):
    from pipeline.core.versions import uncommitted_files
    from pipeline.orchestration.orchestrate import record_version

    for cmd in (["init", "-q"], ["config", "user.email", "ci@example.com"], ["config", "user.name", "ci"]):
        git(*cmd, cwd=tmp_path)
    (tmp_path / "metrics").mkdir()
    for name, text in (("dvc.lock", "a"), ("params.yaml", "a"), ("metrics/sft.json", "{}"), ("code.py", "a")):
        (tmp_path / name).write_text(text)
    git("add", "-A", cwd=tmp_path)
    git("commit", "-qm", "start", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    assert uncommitted_files() == []
    (tmp_path / "dvc.lock").write_text("b")
    (tmp_path / "metrics" / "new.json").write_text("{}")
    assert uncommitted_files() == []  # what recording commits does not count
    (tmp_path / "code.py").write_text("b")
    (tmp_path / "notes.txt").write_text("mine")
    git("add", "notes.txt", cwd=tmp_path)
    assert uncommitted_files() == ["code.py", "notes.txt"]  # changed, and staged but not committed
    commit = record_version.fn("a version")
    assert git("show", "--name-only", "--format=%s", commit, cwd=tmp_path).split() == [
        "a", "version", "dvc.lock", "metrics/new.json"]
    assert git("status", "--porcelain", cwd=tmp_path).splitlines() == [" M code.py", "A  notes.txt"]
    assert record_version.fn("again") is None  # nothing of its own changed: no commit


def test_a_remote_that_cannot_work_is_named_before_any_transfer(tmp_path, monkeypatch):
    import sys

    from pipeline.core.versions import missing_remote

    def dvc(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "dvc", *args], cwd=tmp_path, capture_output=True, check=True)

    git("init", "-q", cwd=tmp_path)
    dvc("init", "-q")
    monkeypatch.chdir(tmp_path)
    assert missing_remote().startswith("no default DVC remote (`make remote` makes")
    dvc("remote", "add", "-d", "local", "store")  # a path beside the repository files, as the shipped one
    store = tmp_path / "store"
    assert missing_remote() == (f"the default DVC remote 'local' is a folder that does not exist: {store} "
                                "(`make remote` makes it)")
    store.mkdir()
    assert missing_remote() is None


def test_the_metrics_diff_leaves_out_timings_an_old_revision_still_holds(monkeypatch):
    import json

    from pipeline.orchestration import orchestrate

    diff = {"metrics/sft.json": {"train_seconds": {"old": 52.0, "new": 620.3, "diff": 568.3},
                                 "final_loss": {"old": 0.5, "new": 0.4, "diff": -0.1}},
            "metrics/evaluate/sft.json": {"decoding.greedy.seconds_per_question": {"old": 0.1, "new": 0.2},
                                          "tokens_per_second": {"old": 5, "new": 6}},
            "metrics/base.json": {"questions_per_second": {"old": 1, "new": 2}}}
    monkeypatch.setattr(orchestrate, "dvc", lambda *args, capture=False: subprocess.CompletedProcess(
        args, 0, json.dumps(diff), ""))
    table = orchestrate.diff_markdown("HEAD")
    assert table.splitlines()[2:] == ["| metrics/sft.json | final_loss | 0.5 | 0.4 | -0.1 |"]
    diff.pop("metrics/sft.json")
    assert orchestrate.diff_markdown("HEAD") == "No metric changed against HEAD."


def test_server_reports_whether_one_runs_and_starts_one_only_when_asked(tmp_path, monkeypatch, capsys):
    """`python -m pipeline server` reads as "show me the server": it says whether the shared server runs (exit 0,
    its URL first) or not (exit 1), starting nothing and not touching its state file (asking is not a use, so the
    idle clock runs on); `--start` starts one and says how it stops."""
    import json
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from pipeline import __main__ as cli
    from pipeline.orchestration import flows

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    started = []

    def start(*args, **kwargs):
        started.append(args)
        raise AssertionError("a server was started")

    monkeypatch.setattr(flows, "_start_server", start)
    state = tmp_path / flows.SHARED_SERVER_FILE
    assert cli.main(["server"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no shared Prefect server runs (nothing started") and "server --start" in out
    assert not started and not state.exists()

    class Health(BaseHTTPRequestHandler):  # a stand-in server that answers /health
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    health = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    # a stand-in watchdog: its command line carries `--seconds 600` as pipeline.orchestration.idle's does
    watchdog = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--seconds", "600"])
    try:
        url = f"http://127.0.0.1:{health.server_address[1]}/api"
        state.write_text(json.dumps({"url": url, "pid": watchdog.pid}))
        os.utime(state, (1_000_000_000, 1_000_000_000))
        assert cli.main(["server"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == url and f"runs (PID {watchdog.pid})" in out[1]
        assert "it stops itself once unused for 600 s (PIPELINE_SERVER_IDLE_SECONDS)" in out[1]
        assert "`python -m pipeline server --stop` stops it now" in out[1]
        assert state.stat().st_mtime == 1_000_000_000 and not started  # read-only
        assert cli.main(["server", "--start", "--stop"]) == 2
        capsys.readouterr()
        monkeypatch.setattr(flows, "shared_server", lambda: url)
        assert cli.main(["server", "--start"]) == 0
        assert "the shared Prefect server already runs" in capsys.readouterr().out
    finally:
        watchdog.kill()
        watchdog.wait()
        health.shutdown()
        health.server_close()
    state.unlink()

    def fresh(timeout: float = 120.0) -> str:
        state.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        return url

    health = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{health.server_address[1]}/api"
    monkeypatch.setattr(flows, "shared_server", fresh)
    try:
        assert cli.main(["server", "--start"]) == 0
    finally:
        health.shutdown()
        health.server_close()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == url and out[1].startswith(f"started the shared Prefect server (PID {os.getpid()}); it stops "
                                               "itself once unused for its idle time")
