"""Verifiable rewards for GRPO, all built on `pipeline.data.grading`, in TRL's reward-function signature.

    from pipeline.core.params import load_section
    from pipeline.rl.params import RewardsConfig
    from pipeline.rl.rewards import build_rewards
    funcs, weights = build_rewards(load_section("rewards", RewardsConfig))
    GRPOTrainer(..., reward_funcs=funcs, args=GRPOConfig(..., reward_weights=weights))

Each reward is called as ``f(prompts=..., completions=..., completion_ids=..., answer=[...],
answer_type=[...], step_values=[...], **other_columns)`` and returns one value per completion.
A reward that needs the gold answer returns None where that gold cannot be parsed: TRL turns None
into NaN and leaves it out of the weighted sum, whereas 1.0 would reward a broken row. Nothing here
raises on a completion: a model's output is untrusted input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pipeline.data import grading
from pipeline.data import task as tasks
from pipeline.rl.params import RewardsConfig, import_reward

ANSWER_TYPES = ("number", "binary", "text")


def completion_text(completion: object) -> str:
    """The text of one completion: a str as is, a conversation's last message content, else ""."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # multimodal content parts: [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _column(columns: dict[str, Any], name: str, i: int) -> Any:
    """Row i of a dataset column, None when the column is missing or too short."""
    values = columns.get(name)
    return values[i] if isinstance(values, Sequence) and not isinstance(values, str) and i < len(values) else None


def gold_is_valid(answer: object, answer_type: object) -> bool:
    """Can a prediction be graded against this gold at all? A gold that cannot match itself cannot."""
    if answer_type not in ANSWER_TYPES or not grading.grade(answer, answer, answer_type):
        return False  # not a str, blank, or a "number" that does not parse
    return answer_type != "binary" or grading.infer_answer_type(answer) == "binary"


def gold_steps(step_values: object) -> list[str] | None:
    """The gold intermediate values, or None when there are none or one is not a non-blank str."""
    if not isinstance(step_values, Sequence) or isinstance(step_values, str) or not step_values:
        return None
    if not all(isinstance(v, str) and v.strip() for v in step_values):
        return None
    return list(step_values)


def is_correct(text: str, answer: str, answer_type: str) -> bool:
    """The completion's answer, read and graded as the active task says (`pipeline.data.task`)."""
    return tasks.active().is_correct(text, answer, answer_type)


class Reward:
    """Base of every reward: TRL's call convention in `__call__`, one row scored by `score`."""

    name: ClassVar[str]

    def __init__(self, options: RewardsConfig | None = None) -> None:
        self.options = options or RewardsConfig()
        self.__name__ = self.name  # TRL logs rewards/<__name__>/mean; a class instance has none of its own

    def __call__(self, prompts: object = None, completions: object = None, **columns: Any) -> list[float | None]:
        rows = list(completions) if isinstance(completions, Sequence) and not isinstance(completions, str) else []
        return [self.score(completion_text(c), i, columns) for i, c in enumerate(rows)]

    def score(self, text: str, i: int, columns: dict[str, Any]) -> float | None:
        raise NotImplementedError

    def length(self, text: str, i: int, columns: dict[str, Any]) -> int:
        """Completion length: its token count when TRL passes `completion_ids`, else its word count."""
        ids = _column(columns, "completion_ids", i)
        return len(ids) if isinstance(ids, Sequence) else len(text.split())


class GoldReward(Reward):
    """A reward that grades against the gold answer: None for a row whose gold cannot be parsed."""

    def score(self, text: str, i: int, columns: dict[str, Any]) -> float | None:
        answer, answer_type = _column(columns, "answer", i), _column(columns, "answer_type", i)
        if not gold_is_valid(answer, answer_type):
            return None
        return self.score_gold(text, answer, answer_type, i, columns)

    def score_gold(self, text: str, answer: str, answer_type: str, i: int, columns: dict[str, Any]) -> float:
        raise NotImplementedError


class Accuracy(GoldReward):
    """1 if the "Answer:" line grades correct, else 0."""

    name = "accuracy"

    def score_gold(self, text: str, answer: str, answer_type: str, i: int, columns: dict[str, Any]) -> float:
        return float(is_correct(text, answer, answer_type))


class Format(Reward):
    """1 for the task's shape (chart task: "Step 1..n" lines then one "Answer:" line and nothing else; a dataset:
    steps, then the one stating the answer, last); needs no gold."""

    name = "format"

    def score(self, text: str, i: int, columns: dict[str, Any]) -> float:
        return float(tasks.active().is_formatted(text))


class StepCorrectness(Reward):
    """Share of gold intermediate values matched by the predicted step at the same position (a dense reward)."""

    name = "step_correctness"

    def score(self, text: str, i: int, columns: dict[str, Any]) -> float | None:
        steps = gold_steps(_column(columns, "step_values", i))
        if steps is None:
            return None  # nothing to check; 0 would punish and 1 would pay for a row without steps
        matched, total = grading.step_accuracy(text, steps)
        return matched / total


def _parts(text: str) -> list[str]:
    return list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


class DynamicProportionalAccuracy(GoldReward):
    """HCM-GRPO's DPA: |P ∩ G| / |G| when the predicted set P ⊆ the gold set G, else 0."""

    name = "dpa"

    def score_gold(self, text: str, answer: str, answer_type: str, i: int, columns: dict[str, Any]) -> float:
        # A number or yes/no is one part ("1,234" is a number, not two); only text golds are lists.
        gold = _parts(answer) if answer_type == "text" else [answer]
        if len(gold) <= 1:
            return float(is_correct(text, answer, answer_type))  # a single part: exactly accuracy
        task = tasks.active()
        predicted = task.extract(text)
        if predicted is None:
            return 0.0
        types = [grading.infer_answer_type(g) for g in gold]
        hits = [[task.grade(p, g, t) for g, t in zip(gold, types)] for p in _parts(predicted)]
        if not all(any(row) for row in hits):
            return 0.0  # a predicted part outside G: guessing extra parts must not pay
        matched = sum(any(row[j] for row in hits) for j in range(len(gold)))
        return matched / len(gold)


class RuleShaping(GoldReward):
    """TaoSR-AGRL: gate · (accuracy + Σ_k w_k · 1[step k matches]), w_k = rule_step_weight / #steps."""

    name = "rule_shaping"

    def score_gold(self, text: str, answer: str, answer_type: str, i: int, columns: dict[str, Any]) -> float:
        task = tasks.active()
        if not task.is_formatted(text) or not self.obeys_rule(task.extract(text) or "", answer_type):
            return 0.0
        shaped = float(is_correct(text, answer, answer_type))
        steps = gold_steps(_column(columns, "step_values", i))
        if steps is not None:  # matched/total · weight == Σ_k (weight / total) · 1[step k matched]
            matched, total = grading.step_accuracy(text, steps)
            shaped += self.options.rule_step_weight * matched / total
        return shaped

    @staticmethod
    def obeys_rule(predicted: str, answer_type: str) -> bool:
        """The answer has the gold's kind: a number for number questions, yes/no for binary ones."""
        if answer_type == "number":
            return grading.parse_number(predicted) is not None
        if answer_type == "binary":
            return grading.infer_answer_type(predicted) == "binary"
        return True


class Cosine(GoldReward):
    """open-r1 cosine scaling: short correct answers score highest, long wrong ones are penalised least."""

    name = "cosine"

    def score_gold(self, text: str, answer: str, answer_type: str, i: int, columns: dict[str, Any]) -> float:
        o = self.options
        progress = min(self.length(text, i, columns) / o.cosine_max_len, 1.0)
        if is_correct(text, answer, answer_type):
            lo, hi = o.cosine_min_correct, o.cosine_max_correct
        else:
            lo, hi = o.cosine_max_wrong, o.cosine_min_wrong
        return lo + 0.5 * (hi - lo) * (1.0 + math.cos(progress * math.pi))


class Repetition(Reward):
    """open-r1 n-gram repetition penalty: (1 − unique/total n-grams) · repetition_max_penalty, in [penalty, 0]."""

    name = "repetition"

    def score(self, text: str, i: int, columns: dict[str, Any]) -> float:
        n = self.options.repetition_ngram
        words = text.lower().split()
        if len(words) < n:
            return 0.0
        ngrams = list(zip(*(words[k:] for k in range(n))))
        return (1.0 - len(set(ngrams)) / len(ngrams)) * self.options.repetition_max_penalty


class Overlong(Reward):
    """DAPO soft overlong punishment: 0 up to L − c tokens, linear to −1 at L, −1 beyond."""

    name = "overlong"

    def score(self, text: str, i: int, columns: dict[str, Any]) -> float:
        limit, buffer = self.options.overlong_max_len, self.options.overlong_buffer
        length = self.length(text, i, columns)
        if length <= limit - buffer:
            return 0.0
        if length <= limit:
            return (limit - buffer - length) / buffer
        return -1.0


class NoThinking(GoldReward):
    """CLS-RL No-Thinking: 1 only if the whole completion is the answer (no steps, no "Answer:")."""

    name = "no_thinking"

    def score_gold(self, text: str, answer: str, answer_type: str, i: int, columns: dict[str, Any]) -> float:
        return float(tasks.active().grade(text.strip(), answer, answer_type))


REWARDS: dict[str, type[Reward]] = {
    cls.name: cls
    for cls in (Accuracy, Format, StepCorrectness, DynamicProportionalAccuracy, RuleShaping, Cosine, Repetition,
                Overlong, NoThinking)
}


def build_rewards(cfg: RewardsConfig) -> tuple[list[Callable[..., list[float | None]]], list[float]]:
    """The reward callables and their weights: the built-ins in the order of `cfg.weights`, then `cfg.custom`."""
    funcs: list[Callable[..., list[float | None]]] = [REWARDS[name](cfg) for name in cfg.weights]
    weights = [float(w) for w in cfg.weights.values()]
    for name, spec in cfg.custom.items():
        funcs.append(_named(name, import_reward(spec.function)))
        weights.append(float(spec.weight))
    return funcs, weights


def _named(name: str, function: Callable[..., Any]) -> Callable[..., list[float | None]]:
    """`function` under its params name (TRL logs rewards/<__name__>/mean)."""

    def reward(*args: Any, **kwargs: Any) -> list[float | None]:
        return function(*args, **kwargs)

    reward.__name__ = name
    return reward


def total_reward(cfg: RewardsConfig, completions: Sequence[object], **columns: Any) -> list[float | None]:
    """The weighted sum per completion, skipping None terms as TRL's nansum does; None if every term is None."""
    funcs, weights = build_rewards(cfg)
    per_func = [f(completions=completions, **columns) for f in funcs]
    totals: list[float | None] = []
    for terms in zip(*per_func):
        scored = [w * r for w, r in zip(weights, terms) if r is not None]
        totals.append(sum(scored) if scored else None)
    return totals
