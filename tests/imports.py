"""The one reader of `pipeline` imports for the tests that hold the code's structure to its docs: dvc.yaml's deps
(tests/unit/test_dag.py) and the floors of the house (tests/unit/test_layout.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def pipeline_imports(path: Path, top_level: bool = False) -> Iterator[tuple[str, list[str], int]]:
    """(module, names, line) for each absolute import of a `pipeline` module the file runs: `import a.b` gives
    (`a.b`, [], line), `from a import b, c` gives (`a`, [`b`, `c`], line). With `top_level`, only those that run
    when the file is imported (not inside a function); `if TYPE_CHECKING:` blocks are left out, as they never run."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
    for node in (tree.body if top_level else ast.walk(tree)):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "pipeline")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "pipeline":
            yield node.module, [a.name for a in node.names], node.lineno
