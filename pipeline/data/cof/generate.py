"""The Chain-of-Functions dataset: rows per split and generation stats.

    rows, stats = generate_dataset(SynthesizeConfig(seed=0))   # rows["train"][0]["question"]

Each table gets up to TRIES_PER_TABLE chain attempts and yields at most one
question, so no table is shared by two rows (tables are deduplicated by the hash
of their JSON). A chain whose length is in the ood range, or that feeds one
function into another as in a held-out pair "f>g" (`cfg.ood_held_out_pairs`), is
out-of-domain; the split of every other question is a hash of its text, in
proportion to the requested split sizes, so one question string never lands in
two splits. Answer types follow `cfg.answer_type_weights` by quota, and binary
answers are balanced Yes/No per final function, in each block.

The request is cut into blocks of at most `cfg.block_size` questions (how many
depends on the params alone), each drawn from its own quota, attempt budget and
`random.Random(f"{seed}:{stream}")`, so that blocks run on `cfg.workers`
processes in any order. Three rounds, each merged in block order, where a row
whose split is full or whose table an earlier row has is dropped: blocks of
in-domain and ood questions (stream "b"; the hash picks each text's split, so a
split's count strays from its size); blocks that draw what each split lacks
("fill:b"); a sequential repair pass ("repair"), on the tables left unused, for
what a block out of budget or a table drawn twice left missing. The same params
give the same rows, whatever the number of workers.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import re
import tempfile
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import orjson

from pipeline.data.cof.core import FUNCTIONS, Reject, parse_held_out
from pipeline.data.cof.explorer import Step, explore
from pipeline.data.cof.tables import TableContext, random_table
from pipeline.data.cof.verbalize import format_prompt, verbalize
from pipeline.data.params import SynthesizeConfig

SPLITS = ("train", "val", "test", "ood")
IN_DOMAIN = ("train", "val", "test")
# Chains tried on one table before drawing a new one: a table is cheap to reuse,
# while one that suits few chains (one series, tied values) is soon dropped.
TRIES_PER_TABLE = 4
# A first-round block's quota counts in-domain questions together, whichever split
# the hash of a text picks: a block held to each split's share wastes the texts of
# a full split until its smallest split fills (about a quarter more attempts for
# the default's 7,100 questions in blocks of 1,000).
IN_DOMAIN_QUOTA = "in_domain"
# Plain numbers in a question: "above 20", "top 3", "2019", not the 1 of "Q1".
_QUESTION_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")


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


def table_key(table_json: str) -> str:
    return hashlib.sha256(table_json.encode()).hexdigest()


def _rng(seed: int, stream: str) -> random.Random:
    """The RNG of a block ("3"), a fill block ("fill:3") or the repair pass ("repair"): a str seed is hashed
    with SHA-512, the same in every process (unlike hash())."""
    return random.Random(f"{seed}:{stream}")


def _sizes(cfg: SynthesizeConfig) -> dict[str, int]:
    return {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test, "ood": cfg.n_ood}


def block_count(cfg: SynthesizeConfig) -> int:
    """Blocks of at most `cfg.block_size` questions: a function of the request, never of the workers."""
    return -(-sum(_sizes(cfg).values()) // cfg.block_size)  # ceil


def spread(counts: dict[str, int], blocks: int) -> list[dict[str, int]]:
    """`counts` cut into `blocks` quotas that sum to them, each count's parts differing by at most one.

    A count's larger parts start where the previous count's ended, so block totals differ by at most one.
    """
    quotas: list[dict[str, int]] = [{} for _ in range(blocks)]
    offset = 0
    for key, n in counts.items():
        base, extra = divmod(n, blocks)
        for b, quota in enumerate(quotas):
            quota[key] = base + ((b - offset) % blocks < extra)
        offset = (offset + n) % blocks
    return quotas


def block_quotas(cfg: SynthesizeConfig) -> list[dict[str, int]]:
    """The first round's quotas: in-domain questions (IN_DOMAIN_QUOTA) and ood ones per block."""
    in_domain = cfg.n_train + cfg.n_val + cfg.n_test
    return spread({IN_DOMAIN_QUOTA: in_domain, "ood": cfg.n_ood}, block_count(cfg))


class _Drawn(NamedTuple):
    """What one block (or the repair pass) drew: its rows per split and its counters."""

    rows: dict[str, list[dict]]
    attempts: int
    rejected: Counter


class _Generator:
    """Rows drawn from one RNG until the quota is met or the budget is spent: one block, or the repair pass.

    `quota` counts rows per split ("train", "val", "test", "ood"), or in-domain
    rows together (IN_DOMAIN_QUOTA) and "ood"; `seen_tables` are table keys not to
    use again.
    """

    def __init__(self, cfg: SynthesizeConfig, rng: random.Random, quota: dict[str, int], budget: int,
                 seen_tables: set[str] = frozenset()) -> None:
        self.cfg, self.rng, self.quota, self.budget = cfg, rng, quota, budget
        # The hash's split edges: the whole request's sizes, in every block.
        self.shares = _sizes(cfg)
        self.held_out = parse_held_out(cfg.ood_held_out_pairs)
        self.rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
        self.filled: Counter = Counter()  # rows per quota key
        self.rejected: Counter = Counter()
        self.answer_types = {False: Counter(), True: Counter()}  # accepted types, by "aimed at ood"
        self.yes_no: Counter = Counter()  # (final function, bool answer) of accepted binary rows
        self.seen_tables = set(seen_tables)
        self.attempts = 0

    def missing(self, keys: tuple[str, ...] = ()) -> int:
        return sum(self.quota[k] - self.filled[k] for k in keys or self.quota)

    def _quota_key(self, split: str) -> str:
        return split if split in self.quota else IN_DOMAIN_QUOTA

    def _reject(self, reason: str) -> bool:
        self.rejected[reason] += 1
        return False

    def attempt(self, ctx: TableContext, table_json: str) -> bool:
        """One chain on this table; True when it became a row."""
        cfg, rng = self.cfg, self.rng
        want_ood = rng.random() < self.missing(("ood",)) / self.missing()
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
        split = "ood" if ood else _in_domain_split(text.question, self.shares)
        if _answer_in_question(text.answer, answer_type, text.question):
            return self._reject("answer_in_question")
        key = self._quota_key(split)
        if self.filled[key] >= self.quota[key]:
            return self._reject("split_full")
        if answer_type == "binary":
            self.yes_no[(last.fn, last.value)] += 1
        self.answer_types[want_ood][answer_type] += 1
        self.filled[key] += 1
        functions = [s.fn for s in steps]
        self.rows[split].append(
            {
                "id": "",  # numbered once the blocks are merged
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

    def run(self) -> _Drawn:
        """Draw until the quota is met or `budget` attempts are spent."""
        while self.missing() and self.attempts < self.budget:
            table = random_table(self.rng, self.cfg)
            table_json = json.dumps(table, sort_keys=True, separators=(",", ":"))
            key = table_key(table_json)
            if key in self.seen_tables:
                # Counted as an attempt: a tiny table space must exhaust the budget, not loop.
                self.attempts += 1
                self.rejected["duplicate_table"] += 1
                continue
            ctx = TableContext(table)
            for _ in range(min(TRIES_PER_TABLE, self.budget - self.attempts)):
                self.attempts += 1
                if self.attempt(ctx, table_json):
                    self.seen_tables.add(key)
                    break
        return _Drawn(self.rows, self.attempts, self.rejected)


def _draw_block(cfg: SynthesizeConfig, stream: str, quota: dict[str, int], budget: int) -> _Drawn:
    return _Generator(cfg, _rng(cfg.seed, stream), quota, budget).run()


# In a worker process: the current round's [front, back) of unclaimed blocks, shared with the caller (set by
# the pool's initializer: a shared array passes to a process only as it starts).
_EDGES = None


def _share_edges(edges) -> None:
    global _EDGES
    _EDGES = edges


def _claim(edges, front: bool) -> int | None:
    """The next unclaimed block, from the front (a worker) or the back (the caller); None when they have met."""
    with edges.get_lock():
        lo, hi = edges[0], edges[1]
        if lo >= hi:
            return None
        if front:
            edges[0] = lo + 1
            return lo
        edges[1] = hi - 1
        return hi - 1


def _block_file(folder: str, i: int) -> Path:
    return Path(folder, f"{i}.json")


def _draw_blocks_to_files(cfg: SynthesizeConfig, jobs: list[tuple[str, dict[str, int], int]], folder: str) -> None:
    """A worker's round: claim blocks from the front and write each draw to its file as JSON, renamed into place
    when whole (the caller reads a file once it exists). Through the pool's pipe, a block's rows (about 0.75 MB
    a thousand) would hold the worker until the caller, busy with blocks of its own, read them. JSON, not
    pickle: nothing in the pipeline unpickles a file (tests/faults/test_hostile_output.py); through orjson,
    which writes and reads a block in a third of the json module's time or less."""
    while (i := _claim(_EDGES, front=True)) is not None:
        drawn = _draw_block(cfg, *jobs[i])
        part = Path(folder, f"{i}.part")
        part.write_bytes(orjson.dumps({"rows": drawn.rows, "attempts": drawn.attempts, "rejected": drawn.rejected}))
        part.replace(_block_file(folder, i))


def _read_block(path: Path) -> _Drawn:
    data = orjson.loads(path.read_bytes())
    return _Drawn(data["rows"], data["attempts"], Counter(data["rejected"]))


class _Blocks:
    """Draws blocks on `workers` processes, this one among them, and hands the draws back in block order."""

    def __init__(self, workers: int) -> None:
        self.pool = self.folder = None
        self.workers, self.rounds = workers - 1, 0
        if workers > 1:
            # forkserver, not fork: the caller may hold threads (Prefect's). A worker re-runs the caller's
            # main module (multiprocessing's rule), then imports this one: 0.3 s or more to its first block.
            context = multiprocessing.get_context("forkserver")
            self.edges = context.Array("q", 2)
            self.pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_share_edges,
                                            initargs=(self.edges,))
            self.folder = tempfile.TemporaryDirectory(prefix="synthesize-")

    def draw(self, cfg: SynthesizeConfig, jobs: list[tuple[str, dict[str, int], int]]) -> list[_Drawn]:
        """`_draw_block(cfg, stream, quota, budget)` of each job (stream, quota, budget).

        The workers claim blocks from the front, this process from the back, until they meet: it draws while
        the workers start, and each side's last block ends about when the other's does. The claims go through
        a shared counter, not the pool's queue, which would hold a block ahead for each worker that this
        process could no longer take (a wait of 0.1 s a block at the end). Between its own blocks this process
        reads the workers' finished ones (10 ms or so each), so that they move the meeting point rather than
        make a wait of their own at the end.
        """
        if self.pool is None:
            return [_draw_block(cfg, *job) for job in jobs]
        self.rounds += 1
        folder = Path(self.folder.name, str(self.rounds))  # a round's own files: block i again in the next
        folder.mkdir()
        with self.edges.get_lock():
            self.edges[0], self.edges[1] = 0, len(jobs)
        workers = [self.pool.submit(_draw_blocks_to_files, cfg, jobs, str(folder)) for _ in range(self.workers)]
        done: dict[int, _Drawn] = {}
        while (i := _claim(self.edges, front=False)) is not None:
            done[i] = _draw_block(cfg, *jobs[i])
            for j in range(self.edges[0]):
                if j not in done and _block_file(str(folder), j).exists():
                    done[j] = _read_block(_block_file(str(folder), j))
        for future in workers:
            future.result()  # a worker's error surfaces here
        return [done[i] if i in done else _read_block(_block_file(str(folder), i)) for i in range(len(jobs))]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.folder.cleanup()


class _Dataset:
    """The rows kept so far, in the order the blocks are merged, and the counters of every block."""

    def __init__(self, cfg: SynthesizeConfig) -> None:
        self.sizes = _sizes(cfg)
        self.rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
        self.tables: set[str] = set()
        self.rejected: Counter = Counter()
        self.attempts = 0

    def missing(self) -> dict[str, int]:
        return {s: n - len(self.rows[s]) for s, n in self.sizes.items()}

    def take(self, drawn: Iterable[_Drawn]) -> None:
        """Blocks in order: a row is dropped when its split is full or an earlier row has its table."""
        for block in drawn:
            self.attempts += block.attempts
            self.rejected.update(block.rejected)
            for split in SPLITS:
                for row in block.rows[split]:
                    key = table_key(row["table"])
                    if key in self.tables:
                        self.rejected["duplicate_table"] += 1
                    elif len(self.rows[split]) >= self.sizes[split]:
                        self.rejected["split_full"] += 1
                    else:
                        self.tables.add(key)
                        self.rows[split].append(row)

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
    """Rows per split ("train", "val", "test", "ood") and stats; raises when attempts run out.

    In rounds of blocks (the module's docstring). With workers > 1, a caller's script needs the
    `if __name__ == "__main__":` guard: multiprocessing re-runs it in each worker.
    """
    data = _Dataset(cfg)
    budget = cfg.max_attempts_factor * sum(data.sizes.values())  # attempts, for the whole request
    n = block_count(cfg)
    blocks = _Blocks(min(cfg.workers, n))
    try:
        # Each block's budget: in proportion to its own quota.
        first = [(str(b), q, cfg.max_attempts_factor * sum(q.values())) for b, q in enumerate(block_quotas(cfg))]
        data.take(blocks.draw(cfg, first))
        if any(data.missing().values()):
            # Each split's shortfall, spread as the first round's quotas are; and what is left of the budget.
            share = (budget - data.attempts) // n
            data.take(blocks.draw(cfg, [(f"fill:{b}", q, share) for b, q in enumerate(spread(data.missing(), n))]))
    finally:
        blocks.close()
    if any(data.missing().values()):
        data.take([_Generator(cfg, _rng(cfg.seed, "repair"), data.missing(), budget - data.attempts,
                              data.tables).run()])
    if any(data.missing().values()):
        raise RuntimeError(
            f"synthesize: gave up after {data.attempts} attempts (max_attempts_factor={cfg.max_attempts_factor}); "
            f"still missing {data.missing()}; top rejections: {dict(data.rejected.most_common(5))}"
        )
    for split in SPLITS:
        for i, row in enumerate(data.rows[split]):
            row["id"] = f"{split}-{i:06d}"
    return data.rows, data.stats()


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
    # One process: the rows do not depend on the workers, and a worker would re-import the caller's main module
    # (the PRM data stage's imports torch: seconds per worker for a draw of under a second).
    scaled = cfg.model_copy(update={"seed": seed, "n_train": cfg.n_train * factor, "n_val": cfg.n_val * factor,
                                    "n_test": cfg.n_test * factor, "n_ood": 0, "render_charts": 0, "workers": 1})
    rows = generate_dataset(scaled)[0][split][:n]
    return [{**row, "id": f"{prefix}-{i:06d}"} for i, row in enumerate(rows)]


def more_train_questions(cfg: SynthesizeConfig, n: int, seed: int, prefix: str = "more") -> list[dict]:
    """`n` new training-split questions on new tables (`more_questions`): no text of val or test among them."""
    return more_questions(cfg, n, seed, "train", prefix)
