"""The Chain-of-Functions dataset: rows per split and generation stats.

    rows, stats = generate_dataset(SynthesizeConfig(seed=0))   # rows["train"][0]["question"]

Each table gets up to TRIES_PER_TABLE chain attempts and yields at most one
question, so no table is shared by two rows (tables are deduplicated by the hash
of their JSON). A chain whose length is in the ood range, or that feeds one
function into another as in a held-out pair "f>g" (`cfg.ood_held_out_pairs`), is
out-of-domain; the split of every other question is a hash of its text, so one
question string never lands in two splits. Answer types follow
`cfg.answer_type_weights` by quota, and binary answers are balanced Yes/No per
final function. Everything is drawn from one `random.Random(cfg.seed)`: the same
seed gives the same rows.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter

from pipeline.cof.core import FUNCTIONS, Reject
from pipeline.cof.explorer import Step, explore
from pipeline.cof.tables import TableContext, random_table
from pipeline.cof.verbalize import format_prompt, verbalize
from pipeline.config import SynthesizeConfig

SPLITS = ("train", "val", "test", "ood")
IN_DOMAIN = ("train", "val", "test")
# Chains tried on one table before drawing a new one: a table is cheap to reuse,
# while one that suits few chains (one series, tied values) is soon dropped.
TRIES_PER_TABLE = 4
# Plain numbers in a question: "above 20", "top 3", "2019", not the 1 of "Q1".
_QUESTION_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")


def parse_held_out(pairs: list[str]) -> set[tuple[str, str]]:
    """{("f", "g")} from ["f>g"]; unknown function names fail loudly."""
    out = set()
    for pair in pairs:
        f, sep, g = pair.partition(">")
        if not sep or f not in FUNCTIONS or g not in FUNCTIONS:
            raise ValueError(f"synthesize.ood_held_out_pairs: {pair!r} is not 'f>g' with known functions")
        out.add((f, g))
    return out


def bigrams(steps: list[Step]) -> set[tuple[str, str]]:
    """Function pairs (producer, consumer) along the chain's data flow."""
    return {(steps[i].fn, s.fn) for s in steps for i in s.inputs}


def task_type(functions: list[str], answer_type: str) -> str:
    """The question's task, from its functions: what a reader is asked to do."""
    groups = {FUNCTIONS[f].group for f in functions}
    if answer_type == "text":
        return "text_information"
    if functions[-1] in ("consistently_increasing", "consistently_decreasing"):
        return "trend"
    if answer_type == "binary":
        return "comparison"
    if "arithmetic" in groups:
        return "arithmetic"
    if groups & {"statistics", "min_max_diff"}:
        return "statistics"
    if "count" in groups:
        return "counting"
    if "min_max" in groups:
        return "extreme_value"
    return "data_retrieval"


def _in_domain_split(question: str, wanted: dict[str, int]) -> str:
    """train/val/test from a hash of the question, in proportion to the requested sizes."""
    u = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") / 2**64
    total = sum(wanted[s] for s in IN_DOMAIN)
    edge = 0.0
    for split in IN_DOMAIN:
        edge += wanted[split] / total
        if u < edge:
            return split
    return IN_DOMAIN[-1]


def _answer_in_question(answer: str, answer_type: str, question: str) -> bool:
    if answer_type == "number":
        return any(float(m) == float(answer) for m in _QUESTION_NUMBER.findall(question))
    if answer_type == "text":
        return re.search(rf"\b{re.escape(answer.lower())}\b", question.lower()) is not None
    return False


def _next_answer_type(counts: Counter, weights: dict[str, float]) -> str:
    """The answer type furthest below its quota (ties: alphabetical)."""
    n, total = sum(counts.values()) + 1, sum(weights.values())
    return max(sorted(weights), key=lambda t: weights[t] * n / total - counts[t])


class _Generator:
    """The running state of one generate_dataset call."""

    def __init__(self, cfg: SynthesizeConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.wanted = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test, "ood": cfg.n_ood}
        self.held_out = parse_held_out(cfg.ood_held_out_pairs)
        self.rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
        self.rejected: Counter = Counter()
        self.answer_types = {False: Counter(), True: Counter()}  # accepted types, by "aimed at ood"
        self.yes_no: Counter = Counter()  # (final function, bool answer) of accepted binary rows
        self.seen_tables: set[str] = set()
        self.attempts = 0

    def missing(self, splits: tuple[str, ...] = SPLITS) -> int:
        return sum(self.wanted[s] - len(self.rows[s]) for s in splits)

    def _reject(self, reason: str) -> bool:
        self.rejected[reason] += 1
        return False

    def attempt(self, ctx: TableContext, table_json: str) -> bool:
        """One chain on this table; True when it became a row."""
        cfg, rng = self.cfg, self.rng
        ood_missing = self.missing(("ood",))
        want_ood = rng.random() < ood_missing / self.missing()
        if want_ood:
            lo, hi = cfg.ood_min_chain_length, cfg.ood_max_chain_length
        else:
            lo, hi = cfg.min_chain_length, cfg.max_chain_length
        # Quotas per kind: ood questions (long chains) must follow the weights too.
        answer_type = _next_answer_type(self.answer_types[want_ood], cfg.answer_type_weights)
        try:
            steps = explore(rng, ctx, answer_type, rng.randint(lo, hi), cfg.max_subchains, self.rejected)
        except Reject as r:
            return self._reject(r.reason)
        last = steps[-1]
        if answer_type == "binary" and self.yes_no[(last.fn, last.value)] > self.yes_no[(last.fn, not last.value)]:
            # Trends and equal values are mostly "No": keep each final function 50/50.
            return self._reject("binary_balance")
        text = verbalize(rng, ctx, steps)
        ood = want_ood or bool(bigrams(steps) & self.held_out)
        split = "ood" if ood else _in_domain_split(text.question, self.wanted)
        if _answer_in_question(text.answer, answer_type, text.question):
            return self._reject("answer_in_question")
        if len(self.rows[split]) >= self.wanted[split]:
            return self._reject("split_full")
        if answer_type == "binary":
            self.yes_no[(last.fn, last.value)] += 1
        self.answer_types[want_ood][answer_type] += 1
        functions = [s.fn for s in steps]
        self.rows[split].append(
            {
                "id": f"{split}-{len(self.rows[split]):06d}",
                "split": split,
                "chart_type": ctx.table["chart_type"],
                "table": table_json,
                "question": text.question,
                "prompt": format_prompt(ctx.table, text.question),
                "answer": text.answer,
                "answer_type": answer_type,
                "functions": functions,
                "groups": list(dict.fromkeys(FUNCTIONS[f].group for f in functions)),
                "steps": text.steps,
                "rationale": text.rationale,
                "chain_length": len(steps),
                "task_type": task_type(functions, answer_type),
                "image_path": None,
            }
        )
        return True

    def run(self) -> None:
        budget = self.cfg.max_attempts_factor * sum(self.wanted.values())
        while self.missing():
            table = random_table(self.rng, self.cfg)
            table_json = json.dumps(table, sort_keys=True, separators=(",", ":"))
            key = hashlib.sha256(table_json.encode()).hexdigest()
            if key in self.seen_tables:
                # Counted as an attempt: a tiny table space must exhaust the budget, not loop.
                self._count_attempt(budget)
                self.rejected["duplicate_table"] += 1
                continue
            ctx = TableContext(table)
            for _ in range(TRIES_PER_TABLE):
                self._count_attempt(budget)
                if self.attempt(ctx, table_json):
                    self.seen_tables.add(key)
                    break

    def _count_attempt(self, budget: int) -> None:
        if self.attempts >= budget:
            missing = {s: self.wanted[s] - len(self.rows[s]) for s in SPLITS}
            raise RuntimeError(
                f"synthesize: gave up after {self.attempts} attempts (max_attempts_factor="
                f"{self.cfg.max_attempts_factor}); still missing {missing}; "
                f"top rejections: {dict(self.rejected.most_common(5))}"
            )
        self.attempts += 1

    def stats(self) -> dict:
        def by_split(column: str) -> dict[str, dict[str, int]]:
            return {s: dict(sorted(Counter(str(r[column]) for r in self.rows[s]).items())) for s in SPLITS}

        accepted = sum(len(r) for r in self.rows.values())
        return {
            "attempts": self.attempts,
            "accepted": accepted,
            "acceptance_rate": round(accepted / max(self.attempts, 1), 4),
            "rejected": dict(sorted(self.rejected.items())),
            "splits": {s: len(self.rows[s]) for s in SPLITS},
            "answer_type": by_split("answer_type"),
            "task_type": by_split("task_type"),
            "chain_length": by_split("chain_length"),
            "chart_type": by_split("chart_type"),
        }


def generate_dataset(cfg: SynthesizeConfig) -> tuple[dict[str, list[dict]], dict]:
    """Rows per split ("train", "val", "test", "ood") and stats; raises when attempts run out."""
    gen = _Generator(cfg)
    gen.run()
    return gen.rows, gen.stats()


def more_questions(cfg: SynthesizeConfig, n: int, seed: int, split: str, prefix: str) -> list[dict]:
    """`n` new questions of one in-domain split on new tables: the generator again, with another seed.

    Every split size is scaled by one whole factor, so the question-to-split hash
    keeps its edges: a question text that `cfg` puts in another split is never
    among these (and none is out-of-domain). Ids are `<prefix>-000000`..., apart
    from the dataset's own.
    """
    if split not in IN_DOMAIN:
        raise ValueError(f"more_questions: split must be one of {IN_DOMAIN}, got {split!r}")
    size = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}[split]
    factor = -(-n // size)  # ceil
    scaled = cfg.model_copy(update={"seed": seed, "n_train": cfg.n_train * factor, "n_val": cfg.n_val * factor,
                                    "n_test": cfg.n_test * factor, "n_ood": 0, "render_charts": 0})
    rows = generate_dataset(scaled)[0][split][:n]
    return [{**row, "id": f"{prefix}-{i:06d}"} for i, row in enumerate(rows)]


def more_train_questions(cfg: SynthesizeConfig, n: int, seed: int, prefix: str = "more") -> list[dict]:
    """`n` new training-split questions on new tables (`more_questions`): no text of val or test among them."""
    return more_questions(cfg, n, seed, "train", prefix)
