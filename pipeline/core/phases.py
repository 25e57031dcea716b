"""What a stage's library code tells the orchestration: which stage runs, its phases, its logger.

The ground floor under every training, sampling and evaluation module: a phase runs as a Prefect task inside a
stage's flow and as a plain call anywhere else, and the logger is the flow run's when there is one. Nothing here
starts a flow or a server (`pipeline.orchestration.flows` does).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from pipeline.core.io import DISK_FULL, ConfigError, InputError, StageFailed

# The stage this process runs (run_stage's name): run directly (python -m stages.sft), without DVC's DVC_STAGE, a
# stage still goes by its own name (its checkpoints' folder, which a dvc repro run then resumes; "sft: training
# diverged", not "run:").
current_stage: str | None = None


def is_expected(exc: BaseException) -> bool:
    """Bad params or input, a full disk, a stage that names why it failed: `expected_errors` turns each into a
    message and an exit code; none is a crash."""
    if isinstance(exc, OSError):
        return exc.errno in DISK_FULL
    return isinstance(exc, (ConfigError, InputError, StageFailed))


def phase(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated function as the Prefect task `name` when it is called inside a flow run (a stage's
    phases, load, train, sample, evaluate, save, then show in the UI with their times and where a failure
    happened), and as a plain call anywhere else (unit tests, benches).

    No Prefect result caching or persistence (DVC is the one cache) and no retries (a phase is not safe to
    repeat); its arguments are passed quoted, so Prefect does not walk a list of thousands of rows or a model
    to record them. A task runs in the flow's own thread: the same arithmetic as a plain call.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        made: list[Any] = []
        expected: list[Exception] = []

        def reasoned(*args: Any, **kwargs: Any) -> Any:
            from prefect.states import Failed

            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_expected(exc):
                    raise
                expected.append(exc)  # a reason, not a crash: Failed with the message, no traceback logged
                return Failed(message=str(exc))

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if "prefect" not in sys.modules:
                return fn(*args, **kwargs)
            from prefect.context import FlowRunContext, TaskRunContext

            if FlowRunContext.get() is None or TaskRunContext.get() is not None:  # outside a flow, or nested
                return fn(*args, **kwargs)
            from prefect import task
            from prefect.cache_policies import NO_CACHE
            from prefect.utilities.annotations import quote

            if not made:
                _quiet_failed_states()
                functools.update_wrapper(reasoned, fn)
                made.append(task(reasoned, name=name, cache_policy=NO_CACHE, persist_result=False, retries=0))
            state = made[0](*map(quote, args), **{k: quote(v) for k, v in kwargs.items()}, return_state=True)
            if expected:
                raise expected.pop()
            return state.result()

        return call

    return wrap


def _no_empty_traceback(record: logging.LogRecord) -> bool:
    """Keep the record, without an exc_info that holds no exception (Prefect logs a task's Failed *state* with
    exc_info=True, which prints a stray `NoneType: None` line under every expected error)."""
    if record.exc_info and record.exc_info[0] is None:
        record.exc_info = None
    return True


def _quiet_failed_states() -> None:
    task_runs = logging.getLogger("prefect.task_runs")
    if _no_empty_traceback not in task_runs.filters:
        task_runs.addFilter(_no_empty_traceback)


def stage_logger():
    """The flow run's logger inside a flow, a plain logger outside one (unit tests)."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("pipeline")
