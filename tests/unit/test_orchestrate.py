"""How `python -m pipeline repro` reads a failed `dvc repro` (pipeline/orchestrate.py): the stage, its exit code
and its own reason, from the stderr it passed through."""

from __future__ import annotations

import io
import os
import threading

from pipeline.orchestrate import STAGE_FAILED, TEE_TAIL, _pass_through, failure_code, stage_failure

# What DVC 3 and a stage print when the stage refuses its input (flows.fail, then DVC's verdict)
BAD_INPUT = """Running stage 'synthesize':
> python -m stages.synthesize
09:26:27.379 | INFO    | Flow run 'x' - Finished in state Failed('task.dataset.path: d.jsonl: empty file')
error: task.dataset.path: d.jsonl: empty file
ERROR: failed to reproduce 'synthesize': failed to run: python -m stages.synthesize, exited with 2
"""


def test_a_stage_that_exits_2_is_named_with_its_reason_and_code_2():
    assert stage_failure(BAD_INPUT, 255) == ("stage synthesize failed (exit 2): task.dataset.path: d.jsonl: empty file",
                                             2)
    assert failure_code(STAGE_FAILED + stage_failure(BAD_INPUT, 255)[0]) == 2


def test_another_failure_is_code_1_and_reads_only_the_failed_stages_reason():
    # an earlier stage's error line (it passed on a retry, say) is not this failure's reason
    text = ("error: an old reason\nRunning stage 'evaluate@sft':\nTraceback (most recent call last):\n"
            "ValueError: boom\nERROR: failed to reproduce 'evaluate@sft': failed to run: python -m stages.evaluate "
            "--model sft, exited with 1\n")
    message, code = stage_failure(text, 255)
    assert code == 1 and message == "stage evaluate@sft failed (exit 1): its log is above"
    killed = stage_failure("ERROR: failed to reproduce 'sft': failed to run: python -m stages.sft, exited with -9\n",
                           255)
    assert killed == ("stage sft failed (exit -9): its log is above", 1)
    # DVC failing before any stage (a broken dvc.yaml, a lock): its own message is above
    assert stage_failure("ERROR: unable to read 'dvc.yaml'\n", 255) == (
        "dvc repro failed with exit code 255 (its message is above)", 1)
    assert failure_code(STAGE_FAILED + killed[0]) == 1
    assert failure_code("the gate stopped this version; nothing recorded or pushed: sft fell") == 1


def test_the_pass_through_copies_everything_and_keeps_the_tail():
    read, write = os.pipe()
    payload = b"progress 10%\r" * 10_000 + b"error: the end\n"

    def writer() -> None:  # as DVC would be, on the pipe's other end
        with os.fdopen(write, "wb") as fh:
            fh.write(payload)

    thread = threading.Thread(target=writer)
    thread.start()
    sink = io.StringIO()
    with os.fdopen(read, "rb") as source:
        tail = _pass_through(source, sink)
    thread.join()
    assert sink.getvalue() == payload.decode()
    assert len(tail) == TEE_TAIL and tail.endswith("error: the end\n")
