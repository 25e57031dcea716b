"""dvc.yaml lists the code each stage runs: a change to a module a stage imports must re-run that stage.

Checked on module-level imports, followed through the `pipeline` package: those run
whenever the stage runs. Imports inside functions are listed by hand where the stage
calls them (evaluate and distill load models through `pipeline.inference.teacher`'s lazy import
of `pipeline.modeling.models`); the test leaves them out because a module imports some only for
the function one other stage calls (`pipeline.training.trainer` imports `pipeline.prm.model` for the
PRM trainer alone). tests/e2e/test_repro.py checks those at run time: each stage
process of its `dvc repro` logs every pipeline file it imported. Prefect plumbing
(`pipeline/orchestration/flows.py`) and path names (`pipeline/core/paths.py`) decide how and where a
stage runs, not what it writes, so a change there re-runs nothing. Nor do the
params schemas (each room's `params.py`, `pipeline/core/params.py`, and
`pipeline/orchestration/sections.py` which gathers them): stages read params.yaml
with every key spelled out, and tests/unit/test_config.py checks that each section
parsed by its model is the raw YAML, so what a stage reads is what DVC tracks as its
params; a field's description or a default can change without making any stage stale.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from tests.imports import pipeline_imports

ROOT = Path(__file__).resolve().parents[2]
# Process plumbing that cannot change an output: the fault hooks are inert unless PIPELINE_FAULT is set, the tether
# only stops a Prefect server, a phase runs its function as a Prefect task or a plain call (the same arithmetic), and
# `launch` decides how a stage's processes start, not what they compute.
PLUMBING = {"pipeline/orchestration/flows.py", "pipeline/core/paths.py", "pipeline/orchestration/sections.py",
            "pipeline/__init__.py",
            "stages/__init__.py", "pipeline/core/faults.py", "pipeline/core/phases.py", "pipeline/core/processes.py",
            "pipeline/orchestration/tether.py", "pipeline/orchestration/runlock.py", "pipeline/orchestration/launch.py",
            "pipeline/core/registry.py",  # names and flags of the stages (its docstring says why)
            # in which process a stage runs (a fork of a server with its imports done), not what it computes
            "pipeline/core/forkserver.py",
            "pipeline/orchestration/checks.py"}  # checks across params sections: they refuse params, compute nothing


def plumbing(path: str) -> bool:
    """Plumbing, a params schema (`pipeline/<room>/params.py`), or a sub-package's `__init__.py` that holds only its
    docstring (importing it runs nothing)."""
    if path in PLUMBING or (path.startswith("pipeline/") and path.endswith("/params.py")):
        return True
    if not path.endswith("/__init__.py"):
        return False
    body = ast.parse((ROOT / path).read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def listed(path: str, deps: list[str]) -> bool:
    """Whether a repository file is among a stage's deps, itself or inside a listed folder."""
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def module_file(name: str) -> Path | None:
    for candidate in (ROOT / f"{name.replace('.', '/')}.py", ROOT / name.replace(".", "/") / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def module_imports(path: Path) -> set[str]:
    """Absolute imports of `pipeline` modules at the top level of a file (`from pipeline.x import y` may be a
    module y)."""
    names = {name for module, imported, _ in pipeline_imports(path, top_level=True)
             for name in (module, *(f"{module}.{n}" for n in imported))}
    # Importing pipeline.data.cof.tables runs pipeline/data/cof/__init__.py first.
    return names | {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 1)}


def imported_files(start: Path) -> set[str]:
    """Repository paths of every pipeline file `start` imports at module level, directly or through another."""
    seen: set[Path] = set()
    todo = [start]
    while todo:
        for name in module_imports(todo.pop()):
            path = module_file(name)
            if path is not None and path not in seen:
                seen.add(path)
                todo.append(path)
    return {str(p.relative_to(ROOT)) for p in seen}


def stages() -> list[tuple[str, str, list[str]]]:
    """(stage name, module it runs, its deps) for every stage of dvc.yaml."""
    dag = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return [(name, stage["cmd"].split("-m ")[1].split()[0], stage["deps"]) for name, stage in dag.items()]


def test_module_imports_follow_from_imports(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import os\nfrom pipeline.core import io\nfrom pipeline.prm.model import auroc\n\n"
                    "def f():\n    import pipeline.rl.grpo\n")
    assert module_imports(path) == {"pipeline", "pipeline.core", "pipeline.core.io", "pipeline.prm",
                                    "pipeline.prm.model", "pipeline.prm.model.auroc"}
    path.write_text("from pipeline.data.cof.tables import Table\n")
    assert module_imports(path) == {"pipeline", "pipeline.data", "pipeline.data.cof", "pipeline.data.cof.tables",
                                    "pipeline.data.cof.tables.Table"}


@pytest.mark.parametrize("name,module,deps", stages(), ids=[s[0] for s in stages()])
def test_every_stage_depends_on_the_code_it_imports(name, module, deps):
    start = module_file(module)
    assert start is not None, f"dvc.yaml: stage {name} runs {module}, which does not exist"
    assert str(start.relative_to(ROOT)) in deps, f"dvc.yaml: stage {name} does not depend on its own module"

    missing = sorted(p for p in imported_files(start) if not plumbing(p) and not listed(p, deps))
    assert not missing, f"dvc.yaml: stage {name} imports {missing} but does not list them under deps"


def test_log_imports_lists_the_repository_files_this_process_imported(tmp_path, monkeypatch):
    import pipeline.prm.model  # noqa: F401  (imported here, inside a function: what the static check above cannot see)
    from pipeline.orchestration.flows import log_imports

    monkeypatch.chdir(ROOT)
    target = tmp_path / "imports.jsonl"
    log_imports(str(target), "prm")
    log_imports(str(target), "evaluate@sft")
    first, second = (json.loads(line) for line in target.read_text().splitlines())
    assert first["stage"] == "prm" and second["stage"] == "evaluate@sft"
    assert {"pipeline/prm/model.py", "pipeline/orchestration/flows.py"} <= set(first["files"])
    assert all(f.startswith(("pipeline/", "stages/")) for f in first["files"])  # not tests/ or site-packages


def test_every_evaluated_model_has_its_images_declared_as_plots():
    """`dvc plots diff` shows what dvc.yaml declares: each model of the evaluate matrix, both of its images."""
    dag = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    declared = {p for p in dag["plots"] if isinstance(p, str)}
    for model in dag["stages"]["evaluate"]["matrix"]["model"]:
        for image in ("by_task_type", "decoding"):
            assert f"plots/evaluate/{model}/{image}.png" in declared, f"dvc.yaml plots: {model}'s {image}.png"


def test_a_skipped_part_leaves_every_declared_plot_drawable(tmp_path):
    """fill_skipped writes, for the plots dvc.yaml declares under plots/<stage>/, a header-only curve and an image
    card; `dvc plots show` would otherwise report "DVC failed to load some plots" on a dataset task or a loaded
    model (base's drills, animate, dpo without pairs)."""
    from PIL import Image

    from pipeline.core.plots import fill_skipped

    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    for stage, reason in (("base", "drills skipped"), ("animate", "no charts"), ("dpo", "no pairs"),
                          ("teacher", "an endpoint")):
        live = tmp_path / stage
        live.mkdir()
        written = fill_skipped(live, stage, reason, ROOT / "dvc.yaml")
        declared = {f for entry in spec for f in ([entry] if isinstance(entry, str) else
                                                  [y for s in entry.values() for y in s.get("y", {})])
                    if f.startswith(f"plots/{stage}/")}
        assert declared and {f"plots/{stage}/{w}" for w in written} == declared, stage
    assert (tmp_path / "base/plots/metrics/numbers/loss.tsv").read_text() == "step\tloss\n"
    assert (tmp_path / "dpo/plots/metrics/rewards/margins.tsv").read_text() == "step\tmargins\n"
    assert Image.open(tmp_path / "animate/contact_sheet.png").size == (500, 120)
    (tmp_path / "again").mkdir()
    (tmp_path / "again/filters.png").write_bytes(b"drawn")  # what the stage drew is kept
    assert "filters.png" not in fill_skipped(tmp_path / "again", "animate", "x", ROOT / "dvc.yaml")
    assert (tmp_path / "again/filters.png").read_bytes() == b"drawn"
    assert fill_skipped(tmp_path / "again", "animate", "x", tmp_path / "no-dvc.yaml") == []


def test_dvc_reads_yaml_with_the_c_parser():
    """A no-op `dvc repro` of the default DAG reads params.yaml once a stage and dvc.lock twice: in ruamel's pure
    Python parser that was half of its 2 s (bench/orchestration.py measures both), so ruamel.yaml.clib is a
    dependency and DVC's safe loader must find it."""
    from ruamel.yaml import YAML

    assert YAML(typ="safe").Parser.__name__ == "CParser"
