"""A write that fails part-way for lack of space (an injected ENOSPC) leaves the previous output intact, removes
its temporary files, and exits 2 with a message naming the output and the file."""

from __future__ import annotations

import pytest

from pipeline.core.io import hash_path
from tests.faults.conftest import PYTHON, sh

pytestmark = pytest.mark.e2e


def test_a_full_disk_keeps_the_previous_output(repo):
    sh([PYTHON, "-m", "stages.synthesize"], repo)
    data, metrics = repo / "data/synthesize", repo / "metrics/synthesize.json"
    before, metrics_before = hash_path(data), metrics.read_bytes()

    full = sh([PYTHON, "-m", "stages.synthesize"], repo, check=False,
              PIPELINE_FAULT="enospc@write:*/val.parquet")  # the second split written: one file is complete
    assert full.returncode == 2, full.stderr[-2000:]
    # the file by its name in the output: the temporary folder it was written into is gone
    assert "error: data/synthesize: No space left on device while writing val.parquet; data/synthesize is left " \
        "as it was" in full.stderr
    assert "Traceback" not in full.stderr  # the flow run ends Failed with the message, not a crash
    assert hash_path(data) == before
    assert not list((repo / "data").glob(".synthesize.*"))

    # a text file of the output folder (its provenance), written through atomic_write_text: the same message
    full = sh([PYTHON, "-m", "stages.synthesize"], repo, check=False, PIPELINE_FAULT="enospc@write:*/config.json")
    assert full.returncode == 2, full.stderr[-2000:]
    assert "error: data/synthesize: No space left on device while writing config.json; data/synthesize is left " \
        "as it was" in full.stderr, full.stderr[-2000:]
    assert hash_path(data) == before and not list((repo / "data").glob(".synthesize.*"))

    full = sh([PYTHON, "-m", "stages.synthesize"], repo, check=False, PIPELINE_FAULT="enospc@write:metrics/*")
    assert full.returncode == 2
    assert "error: metrics/synthesize.json: No space left on device; metrics/synthesize.json is left as it was" \
        in full.stderr
    assert metrics.read_bytes() == metrics_before
    assert not [p for p in (repo / "metrics").iterdir() if p.name.startswith(".")]


def test_outputs_are_readable_by_the_group_and_an_unwritable_folder_is_named(tmp_path, monkeypatch):
    """mkdtemp and mkstemp make 0700 folders and 0600 files; an output keeps the umask's modes as a plain mkdir or
    open() would. A folder the stage cannot write into is named, with the output left as it was."""
    import errno
    import os
    import stat
    import tempfile

    from pipeline.core.io import InputError, atomic_dir, atomic_write_text

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as out:
            atomic_write_text(out / "a.json", "{}")
        assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "out" / "a.json").stat().st_mode) == 0o644
    finally:
        os.umask(old)
    # a read-only mount (root writes through a folder's mode bits, so the error is injected where it arises)
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(InputError, match=r"out: cannot write into .*: Read-only file system; .*out is left as it was"):
        with atomic_dir(tmp_path / "out"):
            raise AssertionError("no work starts")
    assert (tmp_path / "out" / "a.json").read_text() == "{}"
