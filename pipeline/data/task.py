"""The task as every stage sees it: how a completion states its answer, how it is graded, what its steps are.

    from pipeline.data.task import active
    task = active()                      # the `task` section of params.yaml (the chart task without one)
    task.is_correct(completion, row["answer"], row["answer_type"])
    task.steps(completion)               # the steps a PRM scores, the last one the answer's when there is one
    task.target(rationale, answer)       # an SFT completion that states `answer` the way the task reads it

One object serves evaluation, rewards, distillation, mining, step labels, the PRM and search, so a
completion is read the same way everywhere. For the chart task (`kind: cof`) nothing changes: steps
are the `Step k:` lines, then the `Answer:` line, graded by `pipeline.data.grading`'s relaxed match. For a
dataset, a step is a line or a paragraph (`step_split`) and the answer is read by `answer_format` and
graded by `grader` (`pipeline.data.answers`).

The task is process-wide, like params.yaml itself: `active()` reads it once; stages that grade list
`task` among their DVC params, so a change of grader re-runs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.data import answers, grading
from pipeline.core.params import given
from pipeline.data.params import TaskConfig

# How the gold answer ends an SFT completion, per answer format; the readers in pipeline.data.answers read it back.
_ANSWER_ENDINGS = {
    "answer_line": "Answer: {}",
    "gsm8k": "#### {}",
    "boxed": "The answer is \\boxed{{{}}}.",
    "last_number": "The answer is {}.",
}
PARAGRAPH_BREAK = grading.PARAGRAPH_BREAK


@dataclass(frozen=True)
class Task:
    kind: str = "cof"
    answer_format: str = "answer_line"
    grader: str = "relaxed"
    step_split: str = "line"

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> "Task":
        return cls(cfg.kind, cfg.answer_format, cfg.grader, cfg.step_split)

    @property
    def is_cof(self) -> bool:
        """The chart task: its gold step values, tables, drills and probes exist."""
        return self.kind == "cof"

    @property
    def has_gold_step_values(self) -> bool:
        """Each question carries the value every gold step computes (the chart task): steps can be graded one by
        one against them; a dataset's steps are labelled by rollouts instead."""
        return self.is_cof

    @property
    def step_break(self) -> str:
        """What ends one step in a completion: a newline, or a blank line between paragraphs."""
        return "\n\n" if self.step_split == "paragraph" else "\n"

    def extract(self, completion: object) -> str | None:
        return answers.extract(completion, self.answer_format)

    def grade(self, prediction: object, answer: object, answer_type: str) -> bool:
        return answers.grade_with(self.grader, prediction, answer, answer_type)

    def is_correct(self, completion: object, answer: object, answer_type: str) -> bool:
        predicted = self.extract(completion)
        return predicted is not None and self.grade(predicted, answer, answer_type)

    def is_terminal(self, step: str) -> bool:
        """Does this step state an answer? (`last_number`: does it hold a number; the PRM reads a path's last step
        as its answer when it does.) A line or a raw paragraph: an `Answer:` line anywhere in it counts."""
        if self.answer_format == "answer_line":
            return any(line.strip().startswith(grading.ANSWER_PREFIX) for line in step.splitlines() or [""])
        if self.answer_format == "last_number":
            return answers.last_number(answers.strip_reasoning(step)) is not None
        return self.extract(step) is not None

    def ends_path(self, step: str) -> bool:
        """Does a path end with this step (step-level search stops here)? `last_number` paths end at EOS only, since
        every step may hold a number."""
        return self.answer_format != "last_number" and self.is_terminal(step)

    def steps(self, completion: object) -> list[str]:
        """The steps a PRM scores, in order, up to and including the first that states the answer.

        cof: every `Step` line, then the `Answer:` line (other lines are not steps). A dataset: every
        non-blank line or paragraph, whitespace collapsed within a paragraph.
        """
        if not isinstance(completion, str):
            return []
        if self.is_cof:
            return _cof_steps(completion)
        out = []
        for raw in self._raw_parts(completion):
            out.append(self.normalize(raw))
            if self.ends_path(raw):  # decided on the raw text: a paragraph's `Answer:` line is still a line
                break
        return out

    def _raw_parts(self, completion: str) -> list[str]:
        """Every non-blank line, or paragraph as written, of a dataset completion."""
        parts = PARAGRAPH_BREAK.split(completion) if self.step_split == "paragraph" else completion.splitlines()
        return [p.strip() for p in parts if p.strip()]

    def _parts(self, completion: str) -> list[str]:
        """Every non-blank line or paragraph (whitespace collapsed) of a dataset completion."""
        return [self.normalize(p) for p in self._raw_parts(completion)]

    def normalize(self, step: str) -> str:
        """A step as `steps` gives it: a paragraph's whitespace collapsed, a line stripped."""
        return " ".join(step.split()) if self.step_split == "paragraph" else step.strip()

    def first_step(self, text: str) -> tuple[str, bool]:
        """(the first step of a sampled continuation, stripped; did a step break end it), for step-level search.

        A line ends at its newline; a paragraph at a blank line after some text (whitespace before it is not a
        break: `generation.BlankLineStop` reads it the same way).
        """
        if self.step_split != "paragraph":
            line, newline, _ = text.partition("\n")
            return line.strip(), bool(newline)
        parts = PARAGRAPH_BREAK.split(text.lstrip(), maxsplit=1)
        return parts[0].strip(), len(parts) > 1

    def join(self, steps: list[str] | tuple[str, ...]) -> str:
        """Steps back into completion text, each ended by the step break (what the policy continues)."""
        return "".join(step + self.step_break for step in steps)

    def is_formatted(self, completion: str) -> bool:
        """The task's shape: cof `Step 1..n` then `Answer:`; a dataset at least one step before a last step that
        states the answer, and nothing after it."""
        if self.is_cof:
            return _cof_formatted(completion)
        parts = self._parts(completion)
        if len(parts) < 2 or self.steps(completion) != parts:  # no step before the answer, or text after it
            return False
        return self.is_terminal(self._raw_parts(completion)[-1])

    def target(self, rationale: str, answer: str) -> str:
        """An SFT completion: the rationale's steps, then the answer as `answer_format` states it (a rationale
        that already states it, as MATH's solutions do in \\boxed{}, is kept as it is)."""
        body = rationale.strip()
        if body and self.answer_format != "last_number" and answers.grade_exact(self.extract(body), answer):
            return body
        ending = _ANSWER_ENDINGS[self.answer_format].format(answer)
        return f"{body}{self.step_break}{ending}" if body else ending


_STEP_LINE = re.compile(rf"^{re.escape(grading.STEP_PREFIX)}([1-9]\d*):(.*)$")


def _cof_formatted(text: str) -> bool:
    """Lines "Step 1: ..." .. "Step n: ..." (n >= 1, each with a body), then one "Answer: <x>"; blank lines ignored."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[-1].startswith(grading.ANSWER_PREFIX):
        return False
    if not lines[-1][len(grading.ANSWER_PREFIX) :].strip():
        return False
    for k, line in enumerate(lines[:-1], start=1):
        match = _STEP_LINE.match(line)
        if not match or int(match.group(1)) != k or not match.group(2).strip():
            return False
    return True


def _cof_steps(completion: str) -> list[str]:
    lines = []
    for line in (raw.strip() for raw in completion.splitlines()):
        if line.startswith(grading.STEP_PREFIX):
            lines.append(line)
        elif line.startswith(grading.ANSWER_PREFIX):
            lines.append(line)
            break
    return lines


COF = Task()
_override: Task | None = None


def active() -> Task:
    """The task of this run: set by `use`, else built from the `task` section the stage handed over
    (`pipeline.core.params.given`), else the chart task."""
    return _override if _override is not None else _built(given(TaskConfig))


_last: tuple[TaskConfig, Task] | None = None


def _built(cfg: TaskConfig) -> Task:
    """Built once per section handed over: `active()` is called for every completion graded and every line
    searched."""
    global _last
    if _last is None or _last[0] is not cfg:
        _last = (cfg, Task.from_config(cfg))
    return _last[1]


def use(task: Task | None) -> None:
    """Make `task` the active one (None: back to the `task` section handed over); tests and experiments call this."""
    global _override
    _override = task
