"""Answer and step grading, shared by rewards and evaluation.

    from pipeline.data.grading import grade, extract_answer
    grade(extract_answer(completion) or "", row["answer"], row["answer_type"])

A completion is lines ``Step k: <sentence ending in its value>.`` followed by one
final line ``Answer: <answer>``. A step's value is the text after the last of a
small fixed set of separators (``": "``, ``" is "``, ``" are "``, ``" = "``), so
``"Step 7: 15 - 6 = 9."`` has the value ``"9"``. Numbers are correct within 5%
relative error; binary and text answers by case-insensitive exact match after
trimming. Nothing here raises on garbage: a model's output is untrusted input.
"""

from __future__ import annotations

import math
import re

RELATIVE_TOLERANCE = 0.05
# A gold answer of 0 has no relative scale; this absolute slack only absorbs
# float noise (a prediction of "0.0" or "-0" is right, "0.01" is wrong).
ZERO_TOLERANCE = 1e-9
STEP_SEPARATORS = (": ", " is ", " are ", " = ")
ANSWER_PREFIX = "Answer:"
# What ends a paragraph: a blank line (whitespace allowed on it). A dataset's paragraph steps, the step search
# that samples them and the dataset reader all split on it.
PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
STEP_PREFIX = "Step "

# Optional sign, optional currency, digits with optional thousands commas, optional
# decimals, optional percent: "1,234", "-3.5", "$12", "50%". Commas must group by
# three so that a list "15, 11" or "1,2" is not read as a number.
_NUMBER = re.compile(r"^([+-]?)\$?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)%?$")
_STEP_HEAD = re.compile(r"^Step\s+\d+\s*:\s?")


def parse_number(text: object) -> float | None:
    """The number written in `text`, or None: "1,234" -> 1234.0, "50%" -> 50.0, "abc" -> None."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    if s.endswith("."):
        s = s[:-1]  # a sentence-final period: "Answer: 9."
    match = _NUMBER.match(s)
    if not match:
        return None
    value = float(match.group(2).replace(",", ""))
    value = -value if match.group(1) == "-" else value
    return value if math.isfinite(value) else None


def _normalize(text: str) -> str:
    s = " ".join(text.split()).lower()
    return s[:-1].rstrip() if s.endswith(".") else s


def grade(prediction: object, answer: object, answer_type: str) -> bool:
    """Is `prediction` a correct answer for gold `answer` of the given type? Never raises."""
    if not isinstance(prediction, str) or not isinstance(answer, str):
        return False
    if answer_type == "number":
        pred, gold = parse_number(prediction), parse_number(answer)
        if pred is None or gold is None:
            return False
        if gold == 0:
            return abs(pred) <= ZERO_TOLERANCE
        # The 1e-12 slack keeps an exact 5% error correct despite float rounding.
        return abs(pred - gold) <= RELATIVE_TOLERANCE * abs(gold) + 1e-12 * abs(gold)
    pred_n, gold_n = _normalize(prediction), _normalize(answer)
    return bool(gold_n) and pred_n == gold_n


def extract_answer(completion: object) -> str | None:
    """The text after the last line that starts with "Answer:", stripped; None if there is none. Markdown emphasis
    is read through, as instruct models write it ("**Answer:** 60", "Answer: **60**")."""
    if not isinstance(completion, str):
        return None
    for line in reversed(completion.splitlines()):
        line = line.strip().replace("**", "")
        if line.startswith(ANSWER_PREFIX):
            return line[len(ANSWER_PREFIX) :].strip()
    return None


def step_value(line: object) -> str | None:
    """The value of one step line: the text after its last separator, final "." dropped."""
    if not isinstance(line, str):
        return None
    body = _STEP_HEAD.sub("", line.strip(), count=1)
    cut = max((body.rfind(sep) + len(sep) if sep in body else -1) for sep in STEP_SEPARATORS)
    if cut < 0:
        return None
    value = body[cut:].strip()
    # Exactly one sentence-final period goes: "2.5." -> "2.5", while "2.5" stays whole.
    return value[:-1].rstrip() if value.endswith(".") else value


def extract_steps(completion: object) -> list[str]:
    """The value of every line that starts with "Step ", in order ("" where a line has no value)."""
    if not isinstance(completion, str):
        return []
    lines = (line.strip() for line in completion.splitlines())
    return [step_value(line) or "" for line in lines if line.startswith(STEP_PREFIX)]


def yes_no(text: object) -> str | None:
    """"yes" or "no" for a binary answer however written ("Yes.", " NO"), else None."""
    s = _normalize(text) if isinstance(text, str) else None
    return s if s in ("yes", "no") else None


def infer_answer_type(value: str) -> str:
    """"number" if `value` parses as one, "binary" for yes/no, else "text"."""
    if parse_number(value) is not None:
        return "number"
    if yes_no(value) is not None:
        return "binary"
    return "text"


def step_accuracy(completion: object, gold_values: list[str]) -> tuple[int, int]:
    """(matched, total): predicted step i against gold value i; missing steps count as wrong."""
    predicted = extract_steps(completion)
    matched = sum(
        grade(pred, gold, infer_answer_type(gold)) for pred, gold in zip(predicted, gold_values)
    )
    return matched, len(gold_values)


# Every number written in a reply, as `parse_number` reads one ("1,234", "-3.5", "$12", "50%"), not inside a word.
_NUMBERS = re.compile(r"(?<![\w.])[+-]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?(?![\w])")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def lenient_correct(completion: object, answer: object, answer_type: str) -> bool:
    """A reading that ignores the answer format: the last number of the reply (a number answer), its last yes or
    no (binary), or the gold word in its last non-empty line (text). Never raises.

    Beside the task's own grader it tells a model that learned the answer from one that learned the format: an
    instruct model asked to end with `Answer: <answer>` may give the right number in a sentence of its own.
    """
    if not isinstance(completion, str) or not isinstance(answer, str):
        return False
    text = completion.replace("**", "")  # markdown emphasis around an answer
    if answer_type == "number":
        numbers = _NUMBERS.findall(text)
        return bool(numbers) and grade(numbers[-1], answer, "number")
    if answer_type == "binary":
        words = _YES_NO.findall(text)
        return bool(words) and grade(words[-1], answer, "binary")
    lines = [line for line in text.splitlines() if line.strip()]
    gold = _normalize(answer)
    return bool(lines) and bool(gold) and re.search(rf"(?<!\w){re.escape(gold)}(?!\w)", lines[-1].lower()) is not None
