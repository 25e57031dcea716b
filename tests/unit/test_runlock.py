"""DVC's rwlock file after killed runs (pipeline/runlock.release_dead_dvc_locks), read back by DVC itself."""

import json
import os
import subprocess
import sys

import pytest
from dvc.exceptions import DvcException
from dvc.fs import LocalFileSystem
from dvc.rwlock import _edit_rwlock

from pipeline.orchestration import runlock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the PID names no process
    return proc.pid


def _dvc_reads(tmp) -> dict:
    with _edit_rwlock(str(tmp), LocalFileSystem(), False) as lock:
        return {"read": dict(lock["read"]), "write": dict(lock["write"])}


def test_an_emptied_rwlock_is_removed_so_dvc_runs_again(tmp_path):
    (tmp_path / "rwlock").write_text("")  # a dvc killed between DVC's truncation and its json.dump
    with pytest.raises(DvcException, match="corrupted"):
        _dvc_reads(tmp_path)
    assert runlock.release_dead_dvc_locks(tmp_path) == []
    assert not (tmp_path / "rwlock").exists() and _dvc_reads(tmp_path) == {"read": {}, "write": {}}


def test_dead_holders_are_dropped_and_live_ones_kept(tmp_path):
    dead, live = _dead_pid(), os.getpid()
    info = lambda pid: {"pid": pid, "cmd": "dvc repro"}  # noqa: E731
    (tmp_path / "rwlock").write_text(json.dumps({
        "write": {"/repo/data/a": info(dead), "/repo/data/b": info(live)},
        "read": {"/repo/data/c": [info(dead), info(live)], "/repo/data/d": [info(dead)]}}))
    assert runlock.release_dead_dvc_locks(tmp_path) == [dead]
    assert _dvc_reads(tmp_path) == {"write": {"/repo/data/b": info(live)}, "read": {"/repo/data/c": [info(live)]}}


def test_a_garbled_rwlock_is_left_for_dvc_to_name(tmp_path):
    (tmp_path / "rwlock").write_text('{"read": {')
    assert runlock.release_dead_dvc_locks(tmp_path) == []
    assert (tmp_path / "rwlock").read_text() == '{"read": {'


def test_a_killed_stages_temporary_folder_and_its_live_link_are_removed_a_running_ones_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dead = _dead_pid()
    (tmp_path / "plots" / f".sft.tmp-{dead}-x").mkdir(parents=True)
    (tmp_path / "plots" / "sft.live").symlink_to(f".sft.tmp-{dead}-x")
    (tmp_path / "plots" / f".prm.tmp-{os.getpid()}-y").mkdir()  # this process: a stage still writing
    (tmp_path / "plots" / "prm.live").symlink_to(f".prm.tmp-{os.getpid()}-y")
    removed = runlock.remove_dead_temporaries(("plots",))
    assert sorted(p.name for p in removed) == [f".sft.tmp-{dead}-x", "sft.live"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [f".prm.tmp-{os.getpid()}-y", "prm.live"]
