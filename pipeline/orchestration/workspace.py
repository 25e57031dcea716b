"""A copy of this project to run stages in, away from the working tree: the tests and benches build one.

    folder = copy_project(tmp)            # the tracked files, without data, models, tests or benches
    write_params(folder, resolve("tiny"))  # params.yaml as `python -m pipeline params` writes it
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from pipeline.orchestration.profiles import render

ROOT = Path(__file__).resolve().parents[2]  # the repository (pipeline/ is installed editable, in place)


def write_params(folder: Path, params: dict, profile: str = "tiny") -> Path:
    """params.yaml with every key of every section spelled out, as `python -m pipeline params` writes it
    (dvc.yaml names single keys such as `distill.k`, which DVC requires to be present); its header names
    `profile`, so values that differ from it read as hand edits."""
    from pipeline.orchestration.sections import SECTIONS

    full = {name: SECTIONS[name].model_validate(params.get(name) or {}).model_dump(mode="json") for name in SECTIONS}
    path = folder / "params.yaml"
    path.write_text(render(full, profile))
    return path


def copy_project(dest: Path, root: Path = ROOT) -> Path:
    """The tracked and untracked-but-not-ignored project files of `root` (no data, models, venv, tests, benches
    or experiments) into `dest`."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True,
        text=True, check=True,
    ).stdout.split()
    for rel in files:
        src = root / rel
        if src.is_file() and not rel.startswith(("tests/", "bench/", "experiments/")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest
