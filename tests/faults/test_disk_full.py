"""A write that fails part-way for lack of space (an injected ENOSPC) leaves the previous output intact, removes
its temporary files, and exits 2 with a message naming the output and the file."""

from __future__ import annotations

import pytest

from pipeline.io import hash_path
from tests.faults.conftest import PYTHON, sh

pytestmark = pytest.mark.e2e


def test_a_full_disk_keeps_the_previous_output(repo):
    sh([PYTHON, "-m", "stages.synthesize"], repo)
    data, metrics = repo / "data/synthesize", repo / "metrics/synthesize.json"
    before, metrics_before = hash_path(data), metrics.read_bytes()

    full = sh([PYTHON, "-m", "stages.synthesize"], repo, check=False,
              PIPELINE_FAULT="enospc@write:*/val.parquet")  # the second split written: one file is complete
    assert full.returncode == 2, full.stderr[-2000:]
    assert "error: data/synthesize: No space left on device while writing data/.synthesize.tmp-" in full.stderr
    assert "val.parquet; data/synthesize is left as it was" in full.stderr
    assert "Traceback" not in full.stderr  # the flow run ends Failed with the message, not a crash
    assert hash_path(data) == before
    assert not list((repo / "data").glob(".synthesize.*"))

    full = sh([PYTHON, "-m", "stages.synthesize"], repo, check=False, PIPELINE_FAULT="enospc@write:metrics/*")
    assert full.returncode == 2
    assert "error: metrics/synthesize.json: No space left on device; metrics/synthesize.json is left as it was" \
        in full.stderr
    assert metrics.read_bytes() == metrics_before
    assert not [p for p in (repo / "metrics").iterdir() if p.name.startswith(".")]
