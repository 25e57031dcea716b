"""The house as docs/design.md draws it: sub-packages on floors, no import circles, the library below orchestration.

Read from the code's own imports (every one, those inside functions too; `if TYPE_CHECKING:` blocks left out, as
they never run), so a new import that runs back up a floor, or closes a circle, fails here with the file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.imports import pipeline_imports

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"

# The rooms from the ground up: each may import the rooms below it and never one above; `__main__` (the CLI) is the
# roof. Each room's params schemas (`<room>/params.py`) live on its own floor.
FLOORS = ("core", "data", "modeling", "inference", "prm", "training", "rl", "evaluation", "orchestration", "__main__")
LIBRARY = FLOORS[:FLOORS.index("orchestration")]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    """`pipeline.data.cof.core` -> data; `pipeline.core.params` -> core; `pipeline` -> pipeline."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PIPELINE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported pipeline module, line) for each import in the file that runs; `from a import b` names module a.b
    when b is one."""
    out = []
    for module, names, line in pipeline_imports(path):
        subs = [f"{module}.{name}" for name in names if f"{module}.{name}" in known]
        out += [(m, line) for m in subs] or [(module, line)]
    return out


def graph() -> dict[str, list[tuple[str, int]]]:
    known = modules()
    return {name: [(m, line) for m, line in imports(path, known) if m in known and m != name]
            for name, path in known.items()}


def circles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _ in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_circles_are_found():
    edges = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": [("b", 1)], "b": []}) == []


def test_no_import_circles():
    found = circles(graph())
    assert not found, f"modules that import each other in a circle: {found}"


def test_every_room_imports_only_the_floors_below_it():
    ups = []
    for name, edges in graph().items():
        here = room(name)
        if here not in FLOORS:  # pipeline/__init__.py
            continue
        ups += [f"{name} (floor {here}) imports {m} (floor {room(m)}), line {line}" for m, line in edges
                if room(m) in FLOORS and FLOORS.index(room(m)) > FLOORS.index(here)]
    assert not ups, "imports that run back up a floor:\n" + "\n".join(ups)


def test_the_library_imports_no_orchestration():
    """Training, sampling, the PRM and evaluation run the same whether a flow, a test or a bench calls them: the
    phase decorator and the stage logger they use live on the ground floor (pipeline.core.phases)."""
    wrong = [f"{name} imports {m}, line {line}" for name, edges in graph().items() if room(name) in LIBRARY
             for m, line in edges if room(m) in ("orchestration", "__main__")]
    assert not wrong, "\n".join(wrong)


# What reads params.yaml; only a stage's main (stages/), the orchestrator and the CLI call them, and hand the
# library its sections (`pipeline.core.params.giving`)
READERS = {"load_section", "read_params", "read_mapping", "params_path", "read_section", "run_settings"}
# Library modules that are programs of their own as well: their `main` reads what it serves with
ENTRY_POINTS = {"pipeline.inference.openai_server"}


def reads_params(path: Path) -> list[tuple[str, int]]:
    """(reader, line) for each name of `READERS` the file uses outside the functions that define them."""
    tree = ast.parse(path.read_text())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    return [(node.id if isinstance(node, ast.Name) else node.attr, node.lineno) for node in ast.walk(tree)
            if (isinstance(node, ast.Name) and node.id in READERS - defined)
            or (isinstance(node, ast.Attribute) and node.attr in READERS - defined)]


def test_params_readers_are_found(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from pipeline.core import params\nfrom pipeline.core.params import load_section, given\n\n"
                     "def f():\n    return params.read_params(), given(int), load_section('x', int)\n")
    assert sorted(reads_params(probe)) == [("load_section", 5), ("read_params", 5)]  # given() is no reader
    probe.write_text("def load_section(name):\n    return name\n\nload_section('x')\n")  # its own, not a reader
    assert reads_params(probe) == []


def test_the_library_reads_no_params_file():
    """Each room gets its sections as arguments, or the run-wide ones (the task, the prompt format, model loading,
    ...) handed over by the stage's `run_stage`: a library call from a test, a bench or a notebook computes with
    what it is given, never with whatever params.yaml lies in the working directory."""
    wrong = [f"{name} calls {reader}, line {line}" for name, path in modules().items()
             if room(name) in LIBRARY and name != "pipeline.core.params" and name not in ENTRY_POINTS
             for reader, line in reads_params(path)]
    assert not wrong, "\n".join(wrong)


def documented_layout() -> dict[str, set[str]]:
    """{sub-package: its modules} from docs/design.md's Layout block: lines `pipeline/<room>/  a.py b.py ...`."""
    text = (ROOT / "docs/design.md").read_text()
    block = text.split("## Layout", 1)[1].split("```")[1]
    layout: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        head = re.match(r"^(pipeline/[\w/]+/)\s", line + " ")
        if head:
            current = head.group(1)
            layout[current] = set()
        elif not line.startswith(" "):
            current = None
        if current:
            layout[current] |= set(re.findall(r"\b(\w+\.py|\w+/)(?=[\s,;:]|$)", line.split(current, 1)[-1]))
    return layout


def actual_layout() -> dict[str, set[str]]:
    layout = {}
    for package in sorted(p for p in PIPELINE.iterdir() if (p / "__init__.py").exists()):
        entries = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
        entries |= {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}
        layout[f"pipeline/{package.name}/"] = entries
    return layout


def test_the_documented_layout_is_the_tree():
    documented, actual = documented_layout(), actual_layout()
    assert documented.keys() == actual.keys(), f"docs/design.md's Layout lists {sorted(documented)}; the tree has " \
                                               f"{sorted(actual)}"
    for package, entries in actual.items():
        assert documented[package] == entries, f"docs/design.md's Layout: {package} lists " \
            f"{sorted(documented[package] - entries)} that are not there, misses " \
            f"{sorted(entries - documented[package])}"
    readme = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    missing = [package for package in actual if f" {package.split('/')[1]}/" not in readme]
    assert not missing, f"README's Layout does not name {missing}"
