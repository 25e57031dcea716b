"""How a completion states its answer, and the graders beyond the chart task's relaxed match.

    from pipeline.data.answers import extract, grade_with
    grade_with("math_verify", extract(completion, "boxed") or "", gold, "number")

Answer formats (`task.answer_format`):

- ``answer_line``: the text after the last line starting with ``Answer:`` (the chart task);
- ``boxed``: the contents of the last ``\\boxed{...}`` or ``\\fbox{...}``, nested braces kept (MATH);
- ``gsm8k``: the text after the last ``####`` (GSM8K's rationales end ``#### 72``);
- ``last_number``: the last number written anywhere in the text.

Reasoning in ``<think>...</think>`` is dropped before any of them reads the text, so a number
thought aloud is never taken for the answer; a ``<think>`` that never closes leaves no answer.

Graders (`task.grader`):

- ``relaxed``: `pipeline.data.grading.grade` (numbers within 5%, text after case folding; ChartQA);
- ``exact``: numbers equal (``72``, ``72.0`` and ``72,000``/``72000`` agree), else the same text
  after case folding and whitespace collapsing;
- ``math_verify``: Hugging Face's math-verify (LaTeX and symbolic equivalence: ``\\frac{1}{2}``
  and ``0.5``). Plain numbers are compared here first; anything else runs in one long-lived worker
  process, because math-verify bounds its own time with signals, which work only on a main thread
  (TRL's reward workers and Prefect's task threads are not one). Inputs longer than
  `MATH_VERIFY_MAX_CHARS` are wrong without a try, and a call that takes longer than
  `MATH_VERIFY_SECONDS` is wrong and its worker is replaced.

Nothing here raises on a completion: a model's output is untrusted input.
"""

from __future__ import annotations

import atexit
import json
import re
import select
import subprocess
import sys
import threading

from pipeline.data import grading

ANSWER_FORMATS = ("answer_line", "boxed", "gsm8k", "last_number")
GRADERS = ("relaxed", "exact", "math_verify")
# Longer answers are not expressions a grader should parse (characters, each side).
MATH_VERIFY_MAX_CHARS = 1000
# One verification's wall-clock bound in the worker, seconds (math-verify's own default is 5).
MATH_VERIFY_SECONDS = 10.0
_INNER_SECONDS = 3  # math-verify's own parse and compare timeouts in the worker, seconds each

_THINK_CLOSE = re.compile(r"</think\s*>", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think\s*>", re.IGNORECASE)
_BOX_HEAD = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_GSM8K_MARK = "####"
# A number as people write it in a rationale: sign, thousands commas, decimals ("-1,234.5", ".5").
_ANY_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")


def strip_reasoning(text: str) -> str:
    """The text after the last ``</think>``; "" when a ``<think>`` opens and never closes."""
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        return text[closes[-1].end():]
    return "" if _THINK_OPEN.search(text) else text


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces balance, else None.

    One pass matches every brace after the first head, so a completion of thousands of heads that never
    close costs linear time (scanning from each head would be quadratic: minutes for a 400 kB output).
    """
    heads = list(_BOX_HEAD.finditer(text))
    if not heads:
        return None
    closing: dict[int, int] = {}  # position of a "{" -> position of the "}" that closes it
    opened: list[int] = []
    for brace in _BRACE.finditer(text, heads[0].end() - 1):
        if brace.group() == "{":
            opened.append(brace.start())
        elif opened:
            closing[opened.pop()] = brace.start()
    for head in reversed(heads):
        end = closing.get(head.end() - 1)
        if end is not None:
            return text[head.end():end].strip()
    return None


def gsm8k_answer(text: str) -> str | None:
    """The text after the last ``####`` up to the end of its line, stripped; None without one."""
    cut = text.rfind(_GSM8K_MARK)
    if cut < 0:
        return None
    value = text[cut + len(_GSM8K_MARK):].strip().splitlines()
    return value[0].strip() if value and value[0].strip() else None


def last_number(text: str) -> str | None:
    """The last number in the text as written ("1,234"), or None."""
    found = _ANY_NUMBER.findall(text)
    return found[-1] if found else None


def extract(completion: object, answer_format: str, pattern: str | None = None) -> str | None:
    """The answer `completion` states in `answer_format` (or with `pattern`'s first group), else None."""
    if not isinstance(completion, str):
        return None
    text = strip_reasoning(completion)
    if pattern is not None:
        matches = list(re.finditer(pattern, text))
        if not matches:
            return None
        match = matches[-1]
        return (match.group(1) if match.groups() else match.group(0)).strip() or None
    if answer_format == "answer_line":
        return grading.extract_answer(text)
    if answer_format == "boxed":
        return last_boxed(text)
    if answer_format == "gsm8k":
        return gsm8k_answer(text)
    if answer_format == "last_number":
        return last_number(text)
    raise ValueError(f"unknown answer format {answer_format!r}: one of {', '.join(ANSWER_FORMATS)}")


def _plain_number(text: str) -> float | None:
    """A number without LaTeX: "72", "-1,234.5", "$5", "50%" (the `grading` reading), else None."""
    return grading.parse_number(text.strip().strip("$").strip())


def _same_number(prediction: str, answer: str) -> bool | None:
    """Equal as plain numbers (up to float noise); None when either is not a plain number."""
    pred, gold = _plain_number(prediction), _plain_number(answer)
    if pred is None or gold is None:
        return None
    return abs(pred - gold) <= 1e-9 * max(1.0, abs(gold))


def grade_exact(prediction: object, answer: object) -> bool:
    """Equal numbers, or the same text after case folding and whitespace collapsing."""
    if not isinstance(prediction, str) or not isinstance(answer, str) or not answer.strip():
        return False
    same = _same_number(prediction, answer)
    if same is not None:
        return same
    return " ".join(prediction.split()).casefold().rstrip(".") == " ".join(answer.split()).casefold().rstrip(".")


def _verify(prediction: str, answer: str) -> bool:
    """math-verify on one pair; runs in the worker process, on its main thread, where its signal
    timeouts work."""
    from math_verify import parse, verify  # the worker's import, not every stage's

    def parsed(text: str):
        # Bare text gets $...$ so that LaTeX without delimiters (\frac12) is read as LaTeX too.
        return parse(text if "$" in text or "\\boxed" in text else f"${text}$",
                     parsing_timeout=_INNER_SECONDS)

    try:
        gold, pred = parsed(answer), parsed(prediction)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=_INNER_SECONDS))
    except Exception:  # a grader never raises on a model's output
        return False


def _serve() -> None:
    """The worker's loop: one JSON [prediction, answer] per stdin line, one "1" or "0" per stdout line."""
    for line in sys.stdin:
        try:
            prediction, answer = json.loads(line)
            ok = _verify(str(prediction), str(answer))
        except Exception:
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


class _Worker:
    """One `python -m pipeline.data.answers` process for math-verify, replaced after a timeout or a crash.

    A plain subprocess rather than a multiprocessing pool: it imports nothing of the caller's main
    module, and a hung call is ended with a kill."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def _get(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "pipeline.data.answers"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, bufsize=1)
        return self._process

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def verify(self, prediction: str, answer: str) -> bool:
        with self._lock:
            try:
                process = self._get()
                process.stdin.write(json.dumps([prediction, answer]) + "\n")
                process.stdin.flush()
                ready, _, _ = select.select([process.stdout], [], [], MATH_VERIFY_SECONDS)
                reply = process.stdout.readline() if ready else ""
                if reply.strip() not in ("0", "1"):
                    raise TimeoutError
                return reply.strip() == "1"
            except Exception:  # a timeout or a dead worker: wrong, and a fresh worker next time
                self._kill()
                return False

    def close(self) -> None:
        with self._lock:
            self._kill()


_WORKER = _Worker()
atexit.register(_WORKER.close)


def grade_math_verify(prediction: object, answer: object) -> bool:
    """math-verify's equivalence, plain numbers compared without it; bounded in length and time."""
    if not isinstance(prediction, str) or not isinstance(answer, str):
        return False
    prediction, answer = prediction.strip(), answer.strip()
    if not prediction or not answer or max(len(prediction), len(answer)) > MATH_VERIFY_MAX_CHARS:
        return False
    same = _same_number(prediction, answer)
    return same if same is not None else _WORKER.verify(prediction, answer)


def grade_with(grader: str, prediction: object, answer: object, answer_type: str) -> bool:
    """Is `prediction` right for gold `answer` under `grader`? Never raises on a prediction."""
    if grader == "relaxed":
        return grading.grade(prediction, answer, answer_type)
    if grader == "exact":
        return grade_exact(prediction, answer)
    if grader == "math_verify":
        return grade_math_verify(prediction, answer)
    raise ValueError(f"unknown grader {grader!r}: one of {', '.join(GRADERS)}")


if __name__ == "__main__":
    _serve()
