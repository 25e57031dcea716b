"""The tiny DAG, built once per session as real Prefect flows; each stage test works in a copy of its own.

Every test takes what it needs from the built DAG, so any one of them runs alone or in any order, and a test that
changes params or breaks an input changes only its copy.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_params


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# (stage, arguments) in an order each one finds its inputs: evaluate runs on the models the tests grade
BUILD = (("synthesize", []), ("base", []), ("teacher", []), ("distill", []), ("sft", []), ("prm_data", []),
         ("prm", []), ("evaluate", ["--model", "teacher"]), ("evaluate", ["--model", "sft"]), ("mine", []),
         ("grpo", []), ("sft_extended", []), ("dpo", []), ("evaluate", ["--model", "grpo"]))


@pytest.fixture(scope="session")
def tiny_dag(tmp_path_factory, prefect_api) -> tuple[Path, dict[str, list[logging.LogRecord]]]:
    """(folder, each stage's log records): the tiny params and every stage's outputs, never changed by a test."""
    import importlib

    folder = tmp_path_factory.mktemp("tiny_dag")
    write_params(folder)
    logs: dict[str, list[logging.LogRecord]] = {}
    cwd = os.getcwd()
    root = logging.getLogger()
    os.chdir(folder)
    try:
        for stage, args in BUILD:
            handler = _Records()
            root.addHandler(handler)
            try:
                main = importlib.import_module(f"stages.{stage}").main
                main(args) if args else main()
            finally:
                root.removeHandler(handler)
            logs.setdefault(stage, []).extend(handler.records)
    finally:
        os.chdir(cwd)
    return folder, logs


@pytest.fixture
def workspace(tiny_dag, tmp_path) -> Iterator[Path]:
    """A copy of the built tiny DAG, the working directory for the test."""
    folder = tmp_path / "workspace"
    shutil.copytree(tiny_dag[0], folder, symlinks=True)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(cwd)


@pytest.fixture
def stage_logs(tiny_dag) -> dict[str, list[logging.LogRecord]]:
    """What each stage logged while the DAG was built."""
    return tiny_dag[1]
