"""The experiment trackers of the `tracking` section, for every TRL trainer beside its dvclive curves.

    args = SFTConfig(..., **trackers.arguments(live_dir))   # report_to, run_name, project

dvclive keeps writing the stage's curves into its DVC output (`plots/<stage>/`, put in place when the stage
ends); a tracker gets the same logs as they are made: TensorBoard's event files under
`<tracking.logging_dir>/<stage>/<commit>-<start time>[/<phase>]/` (flushed at every log, so `tensorboard --logdir
runs` shows a stage while it trains), or a tracker's own server or folder. The run is named after the stage, its
phase and the commit it runs (`sft/phase2 0b53dc3+`, `+` for uncommitted changes), so that runs of two pipeline
versions sit side by side in the tracker.
"""

from __future__ import annotations

import functools
import os
import subprocess
import time
from pathlib import Path

from pipeline.core import phases
from pipeline.core.params import given
from pipeline.training.params import TrackingConfig

# transformers' TensorBoard callback reads its folder from this variable when it is built (with the trainer)
TENSORBOARD_DIR = "TENSORBOARD_LOGGING_DIR"


@functools.lru_cache(maxsize=1)
def version() -> str:
    """The commit this run's code is at (short), `+` when tracked files differ from it; `unversioned` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unversioned"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unversioned"
    return head.stdout.strip() + ("+" if dirty else "")


@functools.lru_cache(maxsize=1)
def started() -> str:
    """This process's start, UTC (one folder for all the phases of a stage's run)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def phase_of(live_dir: Path, stage: str) -> str:
    """The trainer's phase within its stage, from its dvclive folder: '' for the stage's own (plots/sft or its
    temporary `.sft.tmp-*`), else the sub-folders below it (`phase2`, `rank_drill`)."""
    parts = Path(live_dir).parts
    for i, part in enumerate(parts):
        if part == stage or part.startswith(f".{stage}.tmp-"):
            return "/".join(parts[i + 1:])
    return ""


def arguments(live_dir: Path) -> dict:
    """Trainer arguments for the `tracking` section: `report_to` ("none" without trackers: dvclive is attached
    as a callback of its own), `run_name` and `project`; for TensorBoard, its folder for this trainer."""
    cfg = given(TrackingConfig)
    if not cfg.report_to:
        return {"report_to": "none"}
    stage = phases.current_stage or "run"
    phase = phase_of(live_dir, stage)
    if "tensorboard" in cfg.report_to:
        os.environ[TENSORBOARD_DIR] = str(Path(cfg.logging_dir) / stage / f"{version()}-{started()}" / phase)
    os.environ.setdefault("WANDB_PROJECT", cfg.project)  # the user's own environment wins
    os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", cfg.project)
    return {"report_to": list(cfg.report_to), "run_name": f"{stage}{'/' + phase if phase else ''} {version()}",
            "project": cfg.project}
