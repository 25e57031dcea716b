"""Grade-school word problems in GSM8K's format, generated: the offline stand-in for `openai/gsm8k`.

    python -m pipeline.data.wordproblems --out examples/gsm8k   # writes train.jsonl and test.jsonl

Each problem starts from a quantity and applies 2 to 4 operations (addition, subtraction,
multiplication, division with a whole result), every value a whole number from 1 to 1,000. A row
is ``{"question": ..., "answer": ...}`` as in GSM8K: the answer is the rationale, one sentence per
operation with a calculator annotation ``<<a*b=c>>``, then ``#### n``. The story frames (the
things counted and the sentences that move them) are split: test problems come only from frames
that no training problem uses, so a test score is about the arithmetic, not the wording.
The same seed and sizes give byte-identical files (tests/unit/test_wordproblems.py checks the
committed ones).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

MAX_VALUE = 1000
OPS = ("add", "sub", "mul", "div")
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


@dataclass(frozen=True)
class Frame:
    """A story: what is counted, who counts it, one sentence per operation and the question.

    Sentences see {name}, {item}, {x} (the operand); the rationale's see {a} and {r} too."""

    item: str
    names: tuple[str, ...]
    start: str
    moves: dict[str, tuple[str, str]]  # op -> (question sentence, rationale sentence)
    question: str


FRAMES: dict[str, Frame] = {
    "orchard": Frame(
        "apples", ("Ava", "Liam", "Noah"), "{name} picks {a} apples.",
        {"add": ("Then {name} picks {x} more apples.", "After picking {x} more, {name} has {a} + {x} = {calc} apples."),
         "sub": ("{name} eats {x} of the apples.", "After eating {x}, {a} - {x} = {calc} apples are left."),
         "mul": ("A neighbour gives {name} enough to have {x} times as many apples.",
                 "{x} times as many is {a} * {x} = {calc} apples."),
         "div": ("{name} puts the apples into {x} equal baskets and keeps one basket.",
                 "One of {x} equal baskets holds {a} / {x} = {calc} apples.")},
        "How many apples does {name} have now?"),
    "library": Frame(
        "books", ("Mia", "Omar", "Zoe"), "A shelf in {name}'s library holds {a} books.",
        {"add": ("{name} adds {x} new books to the shelf.", "Adding {x} gives {a} + {x} = {calc} books."),
         "sub": ("Readers borrow {x} books from the shelf.", "Borrowing {x} leaves {a} - {x} = {calc} books."),
         "mul": ("{name} fills more shelves until there are {x} times as many books.",
                 "{x} times as many books is {a} * {x} = {calc}."),
         "div": ("The books are split evenly over {x} shelves; {name} counts one shelf.",
                 "One of {x} shelves has {a} / {x} = {calc} books.")},
        "How many books does {name} count at the end?"),
    "bakery": Frame(
        "cookies", ("Ella", "Sam", "Ivy"), "{name} bakes {a} cookies.",
        {"add": ("{name} bakes another batch of {x} cookies.", "Another {x} makes {a} + {x} = {calc} cookies."),
         "sub": ("{name} sells {x} cookies.", "Selling {x} leaves {a} - {x} = {calc} cookies."),
         "mul": ("An order asks for {x} times that many, and {name} bakes them all.",
                 "{x} times as many is {a} * {x} = {calc} cookies."),
         "div": ("{name} packs the cookies equally into {x} boxes and looks at one box.",
                 "Each of {x} boxes gets {a} / {x} = {calc} cookies.")},
        "How many cookies is that?"),
    "farm": Frame(
        "eggs", ("Leo", "Ruby", "Ezra"), "{name}'s hens lay {a} eggs.",
        {"add": ("The next morning they lay {x} more.", "With {x} more there are {a} + {x} = {calc} eggs."),
         "sub": ("{name} cracks {x} eggs for breakfast.", "Cracking {x} leaves {a} - {x} = {calc} eggs."),
         "mul": ("By the end of the month {name} has {x} times as many eggs.",
                 "{x} times as many is {a} * {x} = {calc} eggs."),
         "div": ("{name} splits the eggs evenly into {x} cartons and sells all but one carton.",
                 "One carton of {x} holds {a} / {x} = {calc} eggs.")},
        "How many eggs does {name} keep?"),
    "savings": Frame(
        "dollars", ("Nora", "Kai", "Aria"), "{name} has saved {a} dollars.",
        {"add": ("{name} earns {x} dollars mowing lawns.", "Earning {x} makes {a} + {x} = {calc} dollars."),
         "sub": ("{name} spends {x} dollars on a game.", "Spending {x} leaves {a} - {x} = {calc} dollars."),
         "mul": ("An investment makes the savings {x} times as large.",
                 "{x} times as much is {a} * {x} = {calc} dollars."),
         "div": ("{name} splits the money equally between {x} jars and takes one jar.",
                 "One of {x} jars holds {a} / {x} = {calc} dollars.")},
        "How many dollars does {name} have?"),
    "garden": Frame(
        "seeds", ("Finn", "Lily", "Theo"), "{name} has a packet of {a} seeds.",
        {"add": ("A friend gives {name} {x} more seeds.", "With {x} more, {name} has {a} + {x} = {calc} seeds."),
         "sub": ("{name} plants {x} seeds.", "Planting {x} leaves {a} - {x} = {calc} seeds."),
         "mul": ("{name} harvests {x} times as many seeds as there were.",
                 "{x} times as many is {a} * {x} = {calc} seeds."),
         "div": ("{name} shares the seeds equally among {x} pots and looks at one pot.",
                 "Each of {x} pots gets {a} / {x} = {calc} seeds.")},
        "How many seeds are there now?"),
    # Test-only frames: other things counted, other verbs.
    "stadium": Frame(
        "fans", ("Coach Reed", "Coach Diaz"), "At the start of the match, {a} fans are in the stands.",
        {"add": ("At half time {x} latecomers take their seats.", "{x} latecomers make {a} + {x} = {calc} fans."),
         "sub": ("{x} fans leave before the final whistle.", "{x} leaving means {a} - {x} = {calc} fans remain."),
         "mul": ("For the final, the crowd grows to {x} times its size.",
                 "{x} times the crowd is {a} * {x} = {calc} fans."),
         "div": ("The fans are seated evenly in {x} sections, and {name} watches one section.",
                 "One of {x} sections seats {a} / {x} = {calc} fans.")},
        "How many fans does {name} see?"),
    "aquarium": Frame(
        "fish", ("Dr. Hale", "Dr. Park"), "{name}'s tank holds {a} fish.",
        {"add": ("A delivery brings {x} more fish.", "The delivery makes {a} + {x} = {calc} fish."),
         "sub": ("{x} fish are moved to another tank.", "Moving {x} leaves {a} - {x} = {calc} fish."),
         "mul": ("After breeding season there are {x} times as many fish.",
                 "{x} times as many is {a} * {x} = {calc} fish."),
         "div": ("{name} divides the fish equally into {x} tanks and keeps one.",
                 "One of {x} tanks holds {a} / {x} = {calc} fish.")},
        "How many fish does {name} look after?"),
}
TEST_FRAMES = ("stadium", "aquarium")
TRAIN_FRAMES = tuple(name for name in FRAMES if name not in TEST_FRAMES)


def _divisors(value: int) -> list[int]:
    return [d for d in range(2, 13) if value % d == 0]


def feasible(op: str, value: int) -> bool:
    """Can `op` apply to `value` with a whole result in 1..MAX_VALUE?"""
    return {"add": value < MAX_VALUE, "sub": value > 1, "mul": value * 2 <= MAX_VALUE,
            "div": bool(_divisors(value))}[op]


def _operand(op: str, value: int, rng: random.Random) -> int:
    """An operand for a feasible `op` on `value` (additions by at most 200, factors 2 to 9, divisors 2 to 12)."""
    if op == "add":
        return rng.randint(1, min(MAX_VALUE - value, 200))
    if op == "sub":
        return rng.randint(1, value - 1)
    if op == "mul":
        return rng.randint(2, min(9, MAX_VALUE // value))
    return rng.choice(_divisors(value))


def apply(op: str, a: int, x: int) -> int:
    return {"add": a + x, "sub": a - x, "mul": a * x, "div": a // x}[op]


def problem(frame: Frame, rng: random.Random) -> dict:
    """One problem from `frame`: {"question", "answer"} in GSM8K's format."""
    name = rng.choice(frame.names)
    value = rng.randint(2, 120)
    question, rationale = [frame.start.format(name=name, a=value)], []
    for _ in range(rng.randint(2, 4)):
        op = rng.choice([op for op in OPS if feasible(op, value)])
        x = _operand(op, value, rng)
        result = apply(op, value, x)
        calc = f"<<{value}{SYMBOL[op]}{x}={result}>>{result}"
        said, worked = frame.moves[op]
        question.append(said.format(name=name, x=x))
        rationale.append(worked.format(name=name, a=value, x=x, calc=calc))
        value = result
    question.append(frame.question.format(name=name))
    return {"question": " ".join(question), "answer": "\n".join(rationale) + f"\n#### {value}"}


def generate(n: int, frames: tuple[str, ...], seed: int) -> list[dict]:
    """`n` distinct problems from `frames` (round robin over a shuffled order), reproducible by `seed`."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        row = problem(FRAMES[frames[len(rows) % len(frames)]], rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows


def write(out: Path, n_train: int = 2000, n_test: int = 300, seed: int = 0) -> None:
    """train.jsonl from the training frames and test.jsonl from the test frames, under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for split, n, frames, split_seed in (("train", n_train, TRAIN_FRAMES, seed),
                                         ("test", n_test, TEST_FRAMES, seed + 1)):
        rows = generate(n, frames, split_seed)
        (out / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples/gsm8k"))
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write(args.out, args.train, args.test, args.seed)


if __name__ == "__main__":
    main()
