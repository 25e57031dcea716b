"""Decoding strategies at one sample budget N, each graded beside its cost, and the faithfulness probe.

Strategies (DecodingConfig.strategies): `greedy`; `maj_at_n` (majority vote over
N samples); `prm_best_of_n` (the sample the PRM scores highest, lines
aggregated by min / last / mean); `prm_weighted_vote` (the majority vote with
each sample weighted by its PRM score); `prm_beam` (step-level beam search);
`prm_mcts` (MCTS with the PRM in place of rollouts). Each reports accuracy,
accuracy by task type, policy tokens, PRM tokens and seconds per question
(accuracy beside cost, as MedAgentsBench argues), and every strategy but greedy
its difference from greedy on the same questions with the paired standard error
(`vs_greedy`); best-of-N and the weighted vote also their difference from a
random pick among the same N samples (`vs_random`), best-of-N its ceilings.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from contextlib import contextmanager

from pipeline.data import task as tasks
from pipeline.data.grading import yes_no
from pipeline.evaluation.metrics import accuracy_by, accuracy_of, majority_vote, score, weighted_majority
from pipeline.evaluation.params import DecodingConfig
from pipeline.evaluation.search import StepPolicy, beam_search, prm_mcts
from pipeline.prm.model import aggregate, is_terminal, line_labels, scored_lines
from pipeline.rl.rewards import is_correct

PRM_STRATEGIES = ("prm_best_of_n", "prm_weighted_vote", "prm_beam", "prm_mcts")


def strategy_metrics(graded: Sequence[dict], *, tokens: float, seconds: float, prm_tokens: float = 0) -> dict:
    """Accuracy (overall and by task type) of one graded completion per question (`evaluation.score` records),
    with the strategy's cost per question."""
    n = max(len(graded), 1)
    return {
        "questions": len(graded),
        "accuracy": accuracy_of(graded),
        "by_task_type": accuracy_by(graded, "task_type"),
        "tokens_per_question": round(tokens / n, 1),
        "prm_tokens_per_question": round(prm_tokens / n, 1),
        "seconds_per_question": round(seconds / n, 4),
    }


def paired_difference(right: Sequence[bool], baseline: Sequence[bool]) -> dict:
    """Accuracy minus the baseline's on the same questions, with the standard error of that difference.

    Paired: the spread of the per-question differences, not of two independent accuracies. A question both
    get right (or both wrong) adds no noise, so on 200 questions a few points can be told from chance where
    two separate standard errors (about 3.4 points each at 0.6) could not.
    """
    diffs = [float(a) - float(b) for a, b in zip(right, baseline, strict=True)]
    n = len(diffs)
    if not n:
        return {"difference": None, "standard_error": None}
    mean = sum(diffs) / n
    if n == 1:  # one question: a difference, but no spread to measure
        return {"difference": round(mean, 4), "standard_error": None}
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return {"difference": round(mean, 4), "standard_error": round(math.sqrt(variance / n), 4)}


class Decoder:
    """Runs the configured strategies on one split's questions, given its greedy and sampled completions.

    `samples` are N (or more) sampled completions per question, with the tokens
    and seconds they took; `scorer` is a PRMScorer (None: the PRM strategies
    are skipped); `policy` a StepPolicy on the same model (None: an API
    policy, beam search and PRM-MCTS are skipped).
    """

    def __init__(self, cfg: DecodingConfig, scorer=None, policy: StepPolicy | None = None) -> None:
        self.cfg, self.scorer, self.policy = cfg, scorer, policy
        self._scores = None  # (line scores per candidate, PRM tokens, seconds) of the split being run

    def run(self, rows: Sequence[dict], greedy: Sequence[tuple[str, int]], greedy_seconds: float,
            samples: Sequence[Sequence[tuple[str, int]]], sample_seconds: float) -> dict:
        cfg, out = self.cfg, {}
        self._scores = None
        n_drawn = max((len(s) for s in samples), default=1)
        # Seconds of N samples when more were drawn together: their share of the sampling time.
        share = sample_seconds * min(cfg.n, n_drawn) / n_drawn
        sample_tokens = sum(t for s in samples for _, t in s[: cfg.n])
        prompts = [r["prompt"] for r in rows]
        graded: dict[str, list[dict]] = {}  # each strategy's graded completions, once: metrics and vs_greedy
        for strategy in cfg.strategies:
            if strategy in PRM_STRATEGIES and self.scorer is None:
                continue
            if strategy in ("prm_beam", "prm_mcts") and self.policy is None:
                continue
            texts, extra = None, {}  # each branch sets texts: one that did not would fail below, not reuse another's
            if strategy == "greedy":
                texts = [t for t, _ in greedy]
                cost = {"tokens": sum(k for _, k in greedy), "seconds": greedy_seconds}
            elif strategy == "maj_at_n":
                texts = [_voted(row, [t for t, _ in s[: cfg.n]]) for row, s in zip(rows, samples)]
                cost = {"tokens": sample_tokens, "seconds": share}
            elif strategy in ("prm_best_of_n", "prm_weighted_vote"):
                candidates = [[t for t, _ in s[: cfg.n]] for s in samples]
                lines, prm_tokens, prm_seconds = self._line_scores(prompts, candidates)
                # each strategy's cost is the samples' and the whole scoring's, whichever strategy scored them
                cost = {"tokens": sample_tokens, "seconds": share + prm_seconds, "prm_tokens": prm_tokens}
                if strategy == "prm_best_of_n":
                    scores = [[aggregate(s, cfg.aggregation) for s in group] for group in lines]
                    # ties: the first sample
                    texts = [drawn[group.index(max(group))] if group else ""
                             for drawn, group in zip(candidates, scores)]
                else:
                    texts = [weighted_vote(row, drawn, [aggregate(s, cfg.vote_aggregation) for s in group])
                             for row, drawn, group in zip(rows, candidates, lines)]
                extra = {"vs_random": versus_random(rows, candidates, texts)}
                if strategy == "prm_best_of_n":
                    extra["ceilings"] = ceilings(rows, candidates, scores)
            elif strategy == "prm_beam":
                with self._cost() as cost:
                    texts = beam_search(prompts[: cfg.search_questions], self.policy, self.scorer.score, n=cfg.n,
                                        width=cfg.beam_width, max_steps=cfg.max_steps, how=cfg.aggregation)
            elif strategy == "prm_mcts":
                with self._cost() as cost:
                    texts = prm_mcts(prompts[: cfg.search_questions], self.policy, self.scorer.score,
                                     iterations=cfg.mcts_iterations, children=cfg.mcts_children, c=cfg.ucb_c,
                                     max_steps=cfg.max_steps)
            # the searches may run on the first `search_questions` only: every strategy is graded on its own rows
            graded[strategy] = [score(row, text, 0) for row, text in zip(rows, texts)]
            out[strategy] = {**strategy_metrics(graded[strategy], **cost), **extra}
        if "greedy" in graded:
            baseline = [g["correct"] for g in graded["greedy"]]
            for strategy, records in graded.items():
                if strategy != "greedy":  # paired on the strategy's questions, the first len(records) of greedy's
                    out[strategy]["vs_greedy"] = paired_difference([g["correct"] for g in records],
                                                                   baseline[: len(records)])
        return out

    def _line_scores(self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
                     ) -> tuple[list[list[list[float]]], int, float]:
        """Every candidate's PRM line scores grouped by question, with the PRM tokens and seconds that took: scored
        once per split, as best-of-N and the weighted vote read the same."""
        if self._scores is None:
            tokens, start = self.scorer.tokens, time.perf_counter()
            flat_prompts = [p for p, texts in zip(prompts, candidates) for _ in texts]
            flat = self.scorer.score(flat_prompts, [scored_lines(t) for texts in candidates for t in texts])
            lines, i = [], 0
            for texts in candidates:
                lines.append(flat[i : i + len(texts)])
                i += len(texts)
            self._scores = (lines, self.scorer.tokens - tokens, time.perf_counter() - start)
        return self._scores

    @contextmanager
    def _cost(self):
        """The cost of the `with` block (a search: policy tokens, PRM tokens, seconds) as strategy_metrics'
        keywords, filled in on exit."""
        policy_before = self.policy.tokens if self.policy else 0
        prm_before = self.scorer.tokens
        start = time.perf_counter()
        cost: dict = {}
        yield cost
        cost["seconds"] = time.perf_counter() - start
        cost["tokens"] = (self.policy.tokens - policy_before) if self.policy else 0
        cost["prm_tokens"] = self.scorer.tokens - prm_before


def weighted_vote(row: dict, texts: Sequence[str], scores: Sequence[float]) -> str:
    """The PRM-weighted majority vote (Math-Shepherd's weighted self-consistency) among sampled completions: the
    best-scored sample of the answer whose samples' scores sum highest ("" when no sample has an answer). Scores
    are probabilities, so no vote counts against an answer."""
    task = tasks.active()
    picked = weighted_majority([task.extract(text) for text in texts], scores, row["answer_type"])
    return "" if picked is None else texts[picked]


def versus_random(rows: Sequence[dict], candidates: Sequence[Sequence[str]], picked: Sequence[str]) -> dict:
    """The pick against a random pick among the same N candidates, paired on the question.

    A random pick is right with probability (right candidates) / N, so its accuracy is the mean of that
    share; the difference is the pick's 0 or 1 minus the share, question by question, with its standard
    error. Above zero, the selector knows something the sampler's own frequencies do not.
    """
    share = [sum(is_correct(t, row["answer"], row["answer_type"]) for t in texts) / max(len(texts), 1)
             for row, texts in zip(rows, candidates)]
    right = [bool(text) and is_correct(text, row["answer"], row["answer_type"]) for row, text in zip(rows, picked)]
    return {"random_pick": round(sum(share) / max(len(share), 1), 4), **paired_difference(right, share)}


def steps_right(row: dict, completion: str) -> bool:
    """Every `Step` line of the completion matches the gold chain (and there is at least one); chart task only."""
    lines = [line for line in scored_lines(completion) if not is_terminal(line)]
    return bool(lines) and all(label >= 0.5 for label in line_labels(lines, row))


def ceilings(rows: Sequence[dict], candidates: Sequence[Sequence[str]], scores: Sequence[Sequence[float]]) -> dict:
    """How far best-of-N could go on these N candidates, beside what the PRM's pick reached.

    - `pass_at_n`: some candidate's answer is right (a perfect outcome verifier's accuracy);
    - `step_oracle`: a perfect *step* verifier's accuracy: it picks a candidate whose
      every Step line matches the gold chain (ties and the rest by the PRM's score);
    - `all_steps_right`: the share of candidates whose Step lines all match.
    A step verifier cannot beat `step_oracle`: when it is below greedy, step labels are the limit, not the PRM.
    """
    n_questions = max(len(rows), 1)
    right = [[is_correct(text, row["answer"], row["answer_type"]) for text in texts]
             for row, texts in zip(rows, candidates)]
    if not tasks.active().has_gold_step_values:  # only the outcome ceiling
        return {"pass_at_n": round(sum(any(ok) for ok in right) / n_questions, 4), "step_oracle": None,
                "all_steps_right": None}
    clean = [[steps_right(row, text) for text in texts] for row, texts in zip(rows, candidates)]
    oracle = 0
    for ok, good, group in zip(right, clean, scores):
        if ok:
            oracle += ok[max(range(len(ok)), key=lambda i: (good[i], group[i], -i))]
    total = sum(len(texts) for texts in candidates)
    return {
        "pass_at_n": round(sum(any(ok) for ok in right) / n_questions, 4),
        "step_oracle": round(oracle / n_questions, 4),
        "all_steps_right": round(sum(map(sum, clean)) / max(total, 1), 4),
    }


def _voted(row: dict, texts: Sequence[str]) -> str:
    """A completion whose answer is the majority answer (the vote's winner, as an Answer line)."""
    task = tasks.active()
    winner = majority_vote([task.extract(t) for t in texts], row["answer_type"])
    return "" if winner is None else task.target("", winner)


# "Is <a> greater than <b>?" and its three siblings (pipeline/data/cof/verbalize.BOOL_QUESTIONS).
_RELATION = re.compile(r" (greater|larger|less|smaller) than ")
_COMPARISON_FUNCTIONS = ("A_greater_B", "A_less_B")


def swapped(question: str) -> str | None:
    """"Is A larger than B?" -> "Is B larger than A?"; None unless the relation occurs exactly once."""
    if not (question.startswith("Is ") and question.endswith("?")):
        return None
    body = question[3:-1]
    matches = list(_RELATION.finditer(body))
    if len(matches) != 1:
        return None  # an operand that itself says "greater than" would make the split ambiguous
    m = matches[0]
    return f"Is {body[m.end():]} {m.group(1)} than {body[: m.start()]}?"


# "Are the bars strictly increasing from left to right?" and its siblings (pipeline/data/cof/verbalize.BOOL_QUESTIONS).
_DIRECTION = re.compile(r"\b(increase|increasing|decrease|decreasing)\b")
_OPPOSITE = {"increase": "decrease", "increasing": "decreasing", "decrease": "increase", "decreasing": "increasing"}
_TREND_FUNCTIONS = ("consistently_increasing", "consistently_decreasing")
PROBE_KINDS = ("order", "trend")


def reversed_trend(question: str) -> str | None:
    """"Are X strictly increasing ...?" -> "Are X strictly decreasing ...?"; None unless one direction word occurs."""
    matches = list(_DIRECTION.finditer(question))
    if len(matches) != 1:
        return None
    m = matches[0]
    return question[: m.start()] + _OPPOSITE[m.group(1)] + question[m.end() :]


def faithfulness_probes(rows: Sequence[dict], kind: str = "order") -> list[tuple[dict, str]]:
    """(row, its twin's prompt) for each binary question of one probe kind that has a twin.

    `order`: a comparison with its operands swapped (X larger than Y; Y larger than X).
    `trend`: a strict trend with its direction reversed (strictly increasing; strictly
    decreasing). Trend questions occur at training's chain lengths, comparisons of two
    values only in longer chains.
    """
    functions, twin = {"order": (_COMPARISON_FUNCTIONS, swapped), "trend": (_TREND_FUNCTIONS, reversed_trend)}[kind]
    probes = []
    for row in rows:
        if row["answer_type"] != "binary" or row["functions"][-1] not in functions:
            continue
        question = twin(row["question"])
        if question is not None and row["question"] in row["prompt"]:
            probes.append((row, row["prompt"].replace(row["question"], question)))
    return probes


def inconsistency(answers: Sequence[tuple[str | None, str | None]], kind: str = "order") -> dict:
    """The share of answered pairs whose two answers contradict each other; a pair without two yes/no answers is
    unanswered.

    `order`: answering both orders alike (Yes/Yes or No/No) contradicts a strict comparison.
    `trend`: only Yes/Yes does (3 or more values cannot both rise and fall strictly; No/No is consistent).
    """
    if kind not in PROBE_KINDS:
        raise ValueError(f"unknown faithfulness probe kind {kind!r}; expected one of {PROBE_KINDS}")
    answered = [(yes_no(a), yes_no(b)) for a, b in answers]
    both = [(a, b) for a, b in answered if a is not None and b is not None]
    bad = sum((a == b) if kind == "order" else (a == b == "yes") for a, b in both)
    return {
        "pairs": len(answers),
        "answered": len(both),
        "inconsistent": bad,
        "inconsistency_rate": round(bad / len(both), 4) if both else None,
    }
