"""How `python -m pipeline repro` reads a failed `dvc repro` (pipeline/orchestrate.py): the stage, its exit code
and its own reason, from the stderr it passed through."""

from __future__ import annotations

import io
import os
import subprocess
import threading

from pipeline.orchestrate import STAGE_FAILED, TEE_TAIL, _pass_through, failure_code, stage_failure

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
    from pipeline.versions import uncommitted_files
    from pipeline.orchestrate import record_version

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

    from pipeline.versions import missing_remote

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
