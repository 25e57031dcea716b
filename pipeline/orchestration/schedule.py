"""Scheduled runs: `prefect.yaml` (Prefect's own deployment file) is their one source.

    make server                      # a Prefect API server on loopback (or point PREFECT_API_URL at yours)
    make worker                      # the deployment's work pool (process type) made if missing, and a worker on it
    prefect --no-prompt deploy --all # the deployments of prefect.yaml, with their schedules and parameters
    python -m pipeline serve         # or: the same deployment served from this one process, no pool or worker

Both paths read the cron, the timezone and the run's parameters (profile, gate, pull, push, record)
from `prefect.yaml`, never from params.yaml, which profiles rewrite. A run does, in this order:
pull, re-run what is stale, compare with the previous version (git HEAD) and gate, record the new
version (a git commit of dvc.lock, params.yaml and metrics/), push (`pipeline.orchestration.orchestrate.repro_flow`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.core.io import ConfigError

DEPLOYMENT_FILE = Path("prefect.yaml")
FLOW = "repro"  # pipeline.orchestration.orchestrate.repro_flow's name: `prefect deployment run repro/<deployment>`


@dataclass(frozen=True)
class Deployment:
    name: str
    cron: str
    timezone: str
    pool: str
    parameters: dict = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{FLOW}/{self.name}"


def load(name: str | None = None, path: Path = DEPLOYMENT_FILE) -> Deployment:
    """The deployment `name` of prefect.yaml (the first when None), with its one cron schedule."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found (the scheduled runs are declared there)")
    data = yaml.safe_load(path.read_text()) or {}
    deployments = data.get("deployments") or []
    if name is not None:
        deployments = [d for d in deployments if d.get("name") == name]
    if not deployments:
        known = ", ".join(str(d.get("name")) for d in data.get("deployments") or []) or "none"
        raise ConfigError(f"{path}: deployments: no deployment {name!r} (known: {known})")
    d = deployments[0]
    schedules = d.get("schedules") or []
    if len(schedules) != 1 or "cron" not in schedules[0]:
        raise ConfigError(f"{path}: deployments.{d.get('name')}.schedules: one cron schedule expected")
    pool = (d.get("work_pool") or {}).get("name")
    if not pool:
        raise ConfigError(f"{path}: deployments.{d.get('name')}.work_pool.name: missing")
    return Deployment(name=d["name"], cron=schedules[0]["cron"],
                      timezone=schedules[0].get("timezone", "UTC"), pool=pool, parameters=d.get("parameters") or {})


def serve(d: Deployment) -> None:
    """Serve the deployment from this process: its schedule and parameters as prefect.yaml declares them."""
    from prefect.schedules import Cron

    from pipeline.orchestration.orchestrate import repro_flow

    repro_flow.serve(name=d.name, schedules=[Cron(d.cron, timezone=d.timezone)], parameters=d.parameters)


def ensure_pool(pool: str, pool_type: str = "process") -> bool:
    """Create the work pool when the server has none of that name; True when it was created."""
    prefect = [sys.executable, "-m", "prefect"]
    if subprocess.run([*prefect, "work-pool", "inspect", pool], capture_output=True, text=True).returncode == 0:
        return False
    proc = subprocess.run([*prefect, "work-pool", "create", pool, "--type", pool_type], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"prefect work-pool create {pool} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return True


def worker(d: Deployment, pool_type: str = "process") -> None:
    """Make the deployment's work pool if it is missing, then run a worker on it (until stopped)."""
    if ensure_pool(d.pool, pool_type):
        print(f"work pool {d.pool!r} created ({pool_type})", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Replaced by the worker (same PID), so a signal to this command reaches the worker itself.
    os.execv(sys.executable, [sys.executable, "-m", "prefect", "worker", "start", "--pool", d.pool])
