"""What a fresh install gets: every library the code imports is declared, the installs are pinned, manifests record
every declared library's version."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

from pipeline.core.io import library_versions

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# imported where installed only (a GPU machine's, a GPU backend's): not installed here, so named by hand
OPTIONAL_MODULES = {"vllm": ("gpu", "trl"), "diffusers": ("video", "diffusers")}


def imported_modules() -> set[str]:
    """Top-level modules imported anywhere in pipeline/ and stages/, the standard library and the project aside."""
    found = set()
    for root in ("pipeline", "stages"):
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"pipeline", "stages", "__future__"}


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in requirements}


def test_every_imported_library_is_declared():
    core = names(PYPROJECT["dependencies"])
    extras = {extra: names(reqs) for extra, reqs in PYPROJECT["optional-dependencies"].items()}
    by_module = packages_distributions()
    undeclared = []
    for module in sorted(imported_modules()):
        if module in OPTIONAL_MODULES:
            extra, dist = OPTIONAL_MODULES[module]
            assert dist in extras[extra], f"{module}: expected in the {extra} extra"
            continue
        dists = {d.lower() for d in by_module.get(module, [])}
        assert dists, f"{module}: imported but not installed"
        if not dists & (core | set().union(*extras.values())):
            undeclared.append(f"{module} ({', '.join(sorted(dists))})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_trl_is_held_to_the_minor_release_that_is_tested():
    (trl,) = [Requirement(r) for r in PYPROJECT["dependencies"] if Requirement(r).name == "trl"]
    from importlib.metadata import version

    assert version("trl") in trl.specifier
    assert not trl.specifier.contains("1.17.0") and not trl.specifier.contains("2.0.0")


def test_the_constraints_pin_every_installed_library_and_the_makefile_installs_with_them():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = pinned
    assert pins["torch"] == "2.13.0"  # the CPU wheel's version, as the Makefile installs it
    for req in PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["dev"]:
        name = Requirement(req).name.lower()
        if name != "reasoning-pipeline":
            assert name in pins, f"{name}: declared but not pinned in constraints.txt (make lock)"
            assert pins[name] in Requirement(req).specifier, f"{name}=={pins[name]} outside {req}"
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if re.search(r"\$\(BIN\)/pip install .*(torch|-e)", line)]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    assert re.search(r"^\$\(STAMP\): .*constraints\.txt", makefile, re.M)  # a new pin reinstalls
    assert re.search(r"^lock:", makefile, re.M)


def test_a_manifest_records_python_and_every_declared_library_installed():
    versions = library_versions()
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    for name in names(PYPROJECT["dependencies"]):
        assert versions[name] != "missing", name
    assert "tensorboard" in versions and "deepspeed" in versions  # extras installed here (dev)
    assert "pytest" not in versions  # the test runner is no stage's library
