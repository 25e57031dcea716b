"""The benches run as scripts of the installed project: they import `pipeline` as any user's code does, never by
editing `sys.path`, and never the test suite (what they share with it lives in `pipeline/`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_a_bench_neither_edits_sys_path_nor_imports_the_tests(script):
    tree = ast.parse(script.read_text())
    edits = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert not edits, f"{script.name}: sys.path at line(s) {edits}"
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {name for name in imported if name.split(".")[0] == "tests"}, script.name
