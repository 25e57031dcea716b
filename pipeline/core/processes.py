"""Which processes still run, and stopping a process with everything it started (psutil)."""

from __future__ import annotations


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed process its dead parent left for init to reap,
    which DVC's own check and `os.kill(pid, 0)` still count as running)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:  # another user's process
        return True
    except psutil.Error:
        return False


def stop_tree(pid: int, grace: float = 10.0, include_root: bool = True) -> None:
    """SIGTERM to process `pid` and every process under it, SIGKILL to those still there after `grace` s
    (`include_root` False: only those under it, as a process stopping what it started)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [*([root] if include_root else []), *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in tree:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
