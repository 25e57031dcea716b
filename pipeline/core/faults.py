"""Fault injection for the fault suite (tests/faults): off unless `PIPELINE_FAULT` names a point.

`PIPELINE_FAULT="ACTION@POINT"`, the point a shell-style pattern:

- `kill@commit:data/synthesize`: SIGKILL this process's whole process group (the stage, the `dvc repro` that
  ran it and the `python -m pipeline repro` above it, as a scheduler kills a job) just before `atomic_dir`
  renames a finished temporary folder into `data/synthesize`, so partial files exist and nothing is in place;
- `enospc@write:*/train.parquet`: an `OSError(ENOSPC)` part-way through writing a matching file, as a full disk
  raises it;
- `nan@step:3`: the training loss turns NaN at optimizer step 3 (`pipeline.training.checkpoints`);
- `stall:20@commit:data/synthesize`: wait 20 s there (a hung file system; a run that holds the lock long enough
  for a second one to meet it).

The hooks cost one environment lookup when unset, and nothing here runs in normal use.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import time

VARIABLE = "PIPELINE_FAULT"


def armed(point: str) -> str | None:
    """The action `PIPELINE_FAULT` names for `point` (None: no fault here)."""
    spec = os.environ.get(VARIABLE)
    if not spec or "@" not in spec:
        return None
    action, _, pattern = spec.partition("@")
    return action if fnmatch.fnmatchcase(point, pattern) else None


def at(point: str) -> None:
    """Kill the process group here when `kill@<point>` is armed; wait when `stall:<seconds>@<point>` is."""
    action = armed(point)
    if action == "kill":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    elif action and action.startswith("stall:"):
        time.sleep(float(action.partition(":")[2]))


def disk_full(path: str) -> OSError:
    """The error a full disk raises while writing `path`."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
