"""Two `python -m pipeline repro` at once: the second waits up to `repro.lock_timeout` seconds, else exits at once
saying the pipeline is already running and naming the first run's PID; nothing is corrupted."""

from __future__ import annotations

import time

import pytest

from pipeline.core.io import read_rows
from tests.conftest import venv_env
from tests.faults.conftest import PYTHON, kill_session, lock_record, sh, start

pytestmark = pytest.mark.e2e


def test_a_second_run_exits_at_once_or_waits_for_the_first(repo, tmp_path):
    # the first run holds the lock 12 s more, stalled just before its output is put in place
    first = start([PYTHON, "-m", "pipeline", "repro", "--force", "synthesize"], repo,
                  venv_env(PIPELINE_FAULT="stall:12@commit:data/synthesize"), log=tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 120
        while lock_record(repo).get("pid") != first.pid or not list((repo / "data").glob(".synthesize.tmp-*")):
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.2)

        second = sh([PYTHON, "-m", "pipeline", "repro", "synthesize"], repo, check=False)  # lock_timeout: 0
        assert second.returncode == 1
        assert f"the pipeline is already running in {repo} (PID {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr + second.stdout
        assert first.poll() is None, "the second run disturbed the first"

        # -S takes effect for the wait itself (params.yaml is rewritten only once the lock is held)
        third = sh([PYTHON, "-m", "pipeline", "repro", "synthesize", "-S", "repro.lock_timeout=300"], repo)
        assert first.poll() == 0, "the third run went ahead before the first had finished"
        assert "Running stage" not in third.stdout  # the first run's outputs are complete: nothing to redo
    finally:
        kill_session(first)
    assert len(read_rows(repo / "data/synthesize/train.parquet")) > 0
    assert "up to date" in sh([PYTHON, "-m", "pipeline", "status", "synthesize"], repo).stdout
    assert lock_record(repo) == {}, "the lock file is emptied when its holder finishes"
