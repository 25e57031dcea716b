"""A fork server for stage processes: torch, transformers and Prefect imported once per `python -m pipeline repro`.

Why: every stage is its own process (`python -m stages.<name>`, run by DVC), and each one spent about 4 s
importing torch, transformers' model classes, TRL and Prefect before doing any work: about a minute of the
quick default's 19 stage runs (study `quick-default-in-ten-minutes`). `python -m pipeline repro` starts this
server beside `dvc repro` (`serving`); it imports those libraries once and waits. A stage process that finds
`PIPELINE_FORK_SERVER` in its environment (`stages/__init__.py` asks `delegate` before anything else) sends
the server its module, arguments, working directory, environment and its stdin, stdout and stderr; the server
forks, and the fork joins the stage process's process group, takes its signal dispositions (what `nohup` or a
script's `&` ignore stays ignored) and runs the stage as `python -m` would, on those streams. The stage process
waits, passes on SIGTERM and SIGHUP (a Ctrl-C reaches the fork itself, in the same foreground group), and exits
as the fork did (its code, or killed by the same signal), so DVC sees what it would have seen; a signal to the
whole group (a scheduler killing the job, a Ctrl-C, the fault hook's `kill`) reaches both. Killed alone, even
by SIGKILL, it takes the fork with it: the fork watches its connection and kills itself when the stage process
is gone. A fork's resource limits, niceness, CPU affinity and umask are the server's, so a stage process whose
own differ (a `cmd:` that runs it under `nice`, `taskset` or `ulimit`) runs itself.

What the fork inherits is third-party code (`PRELOAD`) and, of this repository, only the docstrings of
`pipeline/__init__.py` and `pipeline/core/__init__.py`: a stage imports its own modules fresh, so an edit between
two stages counts as it would without the server. The server runs a
stage only when the stage's environment is the one the server imported its libraries under (DVC's own
`DVC_*` variables aside), since some libraries read theirs at import (Prefect's settings, the Hugging Face
offline switches); anything else, and the stage runs itself, as before. `PIPELINE_FORK_SERVER=0` in the
environment of `python -m pipeline repro` turns it off; plain `dvc repro` never uses it.

The server lives as long as the `serving` block: it reads its stdin, a pipe whose other end the starter
holds, and stops (its running forks with it) when that ends, SIGKILL of the starter included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Iterator

SWITCH = "PIPELINE_FORK_SERVER"  # the server's socket path in a stage's environment; "0" turns the server off
FORKED = "PIPELINE_FORKED"  # set in a fork: a stage run there never delegates again
# What a stage's environment may differ in from the server's: DVC names the stage and the repository per command,
# and the shell that DVC runs it through keeps its own bookkeeping (`_` is the last command, under make too).
PER_STAGE = ("DVC_STAGE", "DVC_ROOT", "_", "PWD", "OLDPWD", "SHLVL")
# Passed on by the stage process to its fork: what kills a process, DVC's stop_tree included, is sent to it alone.
# SIGINT is not: a Ctrl-C reaches the whole foreground group, the fork included, and sent twice it would interrupt
# the stage's own handling of the first.
FORWARDED = (signal.SIGTERM, signal.SIGHUP)
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # their dispositions, ignored or not, go to the fork
_HEADER = struct.Struct("!I")  # payload length in bytes


# --- The stage's side: standard library only, since it runs before the stage imports anything ---

def stage_module(argv: list[str]) -> str | None:
    """The module of a plain `python -m stages.<name> ...` command line (what dvc.yaml runs), or None for any other
    form: interpreter options (-X, -W, -O, ...) change the interpreter itself, which a fork could not honour."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith("stages."):
        return argv[2]
    return None


def process_limits() -> dict:
    """What a fork would take from the server rather than from the stage process: niceness, CPU affinity, umask,
    resource limits."""
    import resource

    mask = os.umask(0)
    os.umask(mask)
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in
              ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK")
              if hasattr(resource, name)}
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "affinity": sorted(os.sched_getaffinity(0)), "umask": mask,
            "rlimits": {name: list(value) for name, value in limits.items()}}


def delegate() -> None:
    """Run this stage in the fork server and exit as the fork did; return (run it here) when there is none, or it
    declines. Called by `stages/__init__.py`, before the stage module loads."""
    path = os.environ.get(SWITCH)
    if not path or path == "0" or os.environ.get(FORKED):
        return
    module = stage_module(list(getattr(sys, "orig_argv", [])))
    if module is None:
        return
    try:  # a closed standard stream: the socket would take its number and the fork its place
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return
    ignored = [int(sig) for sig in HANDLED if signal.getsignal(sig) is signal.SIG_IGN]  # nohup, a script's `&`
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
    except OSError:
        return  # no server (gone, or never started here): the stage runs itself
    request = json.dumps({"module": module, "argv": sys.orig_argv[2:], "cwd": os.getcwd(), "env": dict(os.environ),
                          "group": os.getpgrp(), "session": os.getsid(0), "ignored": ignored,
                          "limits": process_limits()}).encode()
    with conn:
        try:
            socket.send_fds(conn, [_HEADER.pack(len(request))], [0, 1, 2])
            conn.sendall(request)
            reader = conn.makefile("r")
            reply = json.loads(reader.readline() or "{}")
        except (OSError, ValueError):  # a standard stream closed, the server gone: run here
            return
        if "pid" not in reply:  # declined (another environment) or failed to fork: run here
            if "declined" in reply:
                print(f"fork server: {reply['declined']}; the stage runs in its own process", file=sys.stderr)
            return
        pid = reply["pid"]

        def forward(signum: int, frame: object) -> None:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

        for signum in HANDLED:
            if signum not in ignored:
                signal.signal(signum, forward if signum in FORWARDED else signal.SIG_IGN)
        status = json.loads(reader.readline() or "{}").get("status")
    if status is None:  # the server died before the fork ended: stop the fork, fail
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        print("error: the fork server stopped while the stage ran", file=sys.stderr, flush=True)
        os._exit(1)
    if os.WIFSIGNALED(status):  # die of the same signal, as the stage process itself would have
        signum = os.WTERMSIG(status)
        for handled in HANDLED:
            signal.signal(handled, signal.SIG_DFL)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 1)


# --- The server's side ---

# Imported once by the server: what the stages import at their top or in their first phase. Third-party only.
PRELOAD = ("numpy", "pyarrow.parquet", "yaml", "pydantic", "tqdm.auto", "torch", "transformers",
           "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2", "datasets",
           "accelerate", "peft", "trl", "dvclive", "psutil", "prefect", "prefect.flows", "prefect.flow_engine",
           "prefect.states")
# Quiet, offline defaults for Prefect, which reads them when it loads: set before that by
# pipeline.orchestration.flows in a stage process, and by the server before its imports (a user's environment wins).
PREFECT_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
                    "DO_NOT_TRACK": "1"}


def _differences(env: dict[str, str], own: dict[str, str]) -> list[str]:
    keys = (set(env) | set(own)) - {*PER_STAGE, SWITCH}
    return sorted(k for k in keys if env.get(k) != own.get(k))


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the stage process closed its connection")
        data += chunk
    return bytes(data)


def serve(path: str) -> None:
    """Import `PRELOAD`, listen on `path`, fork a stage per connection, until stdin ends (the starter is gone)."""
    import importlib
    import select

    own = dict(os.environ)  # as the stages see it: before the defaults below
    limits = process_limits()
    # The starter decides when the server stops (its stdin ends): a signal to the job's group, or the starter's
    # stop_tree, must not end it before it has told each stage process how its fork ended.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    server = os.getpid()
    running: dict[int, socket.socket] = {}
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [], 0.2)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                return
            if listener in ready:
                conn, _ = listener.accept()
                pid = _start(conn, own, limits, listener)
                if pid:
                    running[pid] = conn
            while running:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                conn = running.pop(pid)
                _reply(conn, {"status": status})
                conn.close()
    finally:
        if os.getpid() == server:  # a fork leaving through here runs none of this
            for pid in running:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            listener.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _start(conn: socket.socket, own: dict[str, str], limits: dict, listener: socket.socket) -> int | None:
    """Read one request; fork its stage (the fork runs it and never returns here); the fork's pid, or None."""
    fds: list[int] = []
    try:
        conn.settimeout(10)  # a stage process stopped mid-request holds no other stage up
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        request = json.loads(_recv_exactly(conn, _HEADER.unpack(header)[0]))
        if len(fds) != 3:
            raise ValueError("expected stdin, stdout and stderr")
        if differ := _differences(request["env"], own):
            declined = f"environment differs: {', '.join(differ[:5])}"
        elif request["session"] != os.getsid(0):
            declined = "another session (its fork could not join the stage's process group)"
        elif request["limits"] != limits:
            declined = "other process limits (niceness, CPU affinity, umask or resource limits)"
        else:
            declined = None
        if declined:
            _reply(conn, {"declined": declined})
            raise ValueError("declined")
    except Exception:  # noqa: BLE001 - a request cut short or malformed costs its connection, never the server
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:  # out of memory or processes: the stage runs itself
        pid = None
        _reply(conn, {"declined": f"fork failed: {exc}"})
    if pid == 0:
        listener.close()
        conn.settimeout(None)
        _run_fork(conn, fds, request)  # raises SystemExit: the fork ends as a `python -m` process would
    for fd in fds:
        os.close(fd)
    if pid is None:
        conn.close()
        return None
    if not _reply(conn, {"pid": pid}):  # the stage process is gone already: so is the fork, by its watcher
        conn.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None
    return pid


def _reply(conn: socket.socket, message: dict) -> bool:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
        return True
    except OSError:
        return False


def _run_fork(conn: socket.socket, fds: list[int], request: dict) -> None:
    import random
    import runpy
    import threading

    ignored = set(request.get("ignored", ()))
    for signum in HANDLED:  # as in the stage process: Python's own, or ignored where it ignored them
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, signal.SIG_IGN if int(signum) in ignored else default)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it up
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    try:  # the stage process's group: a signal to the job's group (a scheduler, a Ctrl-C) reaches the fork too
        os.setpgid(0, request["group"])
    except OSError as exc:  # same session, checked: never expected; the server's group is no place to run in
        os.write(2, f"error: the fork server's fork could not join the stage's process group: {exc}\n".encode())
        os._exit(1)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"], **{FORKED: "1"})
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        if hasattr(stream, "reconfigure"):  # as Python would set it up for this stream
            stream.reconfigure(line_buffering=name == "stderr" or os.isatty(stream.fileno()),
                               write_through=bool(os.environ.get("PYTHONUNBUFFERED")))
    sys.stdin = open(0, closefd=False)
    random.seed()  # a fresh process draws its own seed; forks would share the server's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.path[0] = request["cwd"]

    def stage_process_gone() -> None:
        while True:
            try:
                if not conn.recv(4096):
                    break
            except OSError:
                break
        # What the stage started (a launch's ranks, a vLLM server) is no descendant of DVC's stage process, so no
        # stop_tree of DVC's reaches it: stop it here, as that would have, then the fork itself.
        from pipeline.core.processes import stop_tree

        stop_tree(os.getpid(), include_root=False)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=stage_process_gone, daemon=True, name="fork-server-watch").start()
    sys.argv = list(request["argv"])
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


@contextlib.contextmanager
def serving(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A fork server for the block's stage processes, which run with `env`; yields the entries to add to `env`
    that point them at it (none when `PIPELINE_FORK_SERVER` is 0). Not waited for: a stage that starts while
    the server still imports (about 4 s) finds no one listening and runs itself, as it would without one."""
    import subprocess
    import tempfile

    if env.get(SWITCH) == "0":
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-fork-") as folder:
        path = os.path.join(folder, "socket")
        # in this process's group and session, so that each fork can join its stage process's group
        # its output nowhere: Prefect's console handler, set up at import, picks its colours from the server's
        # stderr, and a stage's stderr is DVC's pipe, never a terminal
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.core.forkserver", path], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield {SWITCH: path}
        finally:
            proc.stdin.close()  # the server stops on end-of-file, within its 0.2 s poll ...
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:  # ... unless it is still importing (a run with nothing stale):
                proc.kill()  # no fork is left to stop then (each dies with its stage process, and DVC is done)
                proc.wait()


if __name__ == "__main__":
    serve(sys.argv[1])
