"""What recording a version and moving it to a remote need, checked before any work (no Prefect here: the CLI
asks before its server starts).

    from pipeline.core.versions import uncommitted_files, missing_remote
    uncommitted_files()  # ['stages/report.py']: a recorded dvc.lock would name code no commit holds
    missing_remote()     # "the default DVC remote 'local' is a folder that does not exist: ..." (or None)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RECORDED = ("dvc.lock", "params.yaml", "metrics")  # what a recorded version commits (orchestrate.record_version)


def uncommitted_files() -> list[str]:
    """Tracked files with changes no commit holds, other than what recording commits: code or data a recorded
    dvc.lock would name while no commit has it (the version could not be reproduced from git)."""
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                          check=False)
    changed = [line[3:].split(" -> ")[-1].strip('"') for line in proc.stdout.splitlines() if line.strip()]
    return [f for f in changed if f not in RECORDED and not f.startswith(tuple(f"{r}/" for r in RECORDED))]


def default_remote() -> tuple[str, str, bool] | None:
    """(name, where, reachable) of the default DVC remote: a local one's folder as an absolute path (a relative url
    is relative to .dvc/, its config) and whether that folder exists; a cloud one's url and True (DVC itself says
    what is wrong with it). None when no default remote is configured."""
    def dvc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dvc", *args], capture_output=True, text=True, check=False)

    asked = dvc("remote", "default")  # exit 1 without one
    default = asked.stdout.strip() if asked.returncode == 0 else ""
    if not default:
        return None
    url = dvc("config", f"remote.{default}.url").stdout.strip()
    if not url or "://" in url:
        return default, url, True
    folder = (Path(".dvc") / Path(url).expanduser()).resolve()
    return default, str(folder), folder.is_dir()


def missing_remote() -> str | None:
    """Why `dvc pull` / `dvc push` cannot work here, before they are tried (and retried): no default remote, or a
    local folder that does not exist (`make remote` makes the default one); None when they can try."""
    remote = default_remote()
    if remote is None:
        return "no default DVC remote (`make remote` makes a folder beside the repository; or `dvc remote add -d`)"
    name, folder, reachable = remote
    if not reachable:
        return f"the default DVC remote {name!r} is a folder that does not exist: {folder} (`make remote` makes it)"
    return None
