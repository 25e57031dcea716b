"""The explorer: type rules, lengths, sub-chain joining and counted rejections."""

import random
from collections import Counter

import pytest

from pipeline.data.cof import explorer
from pipeline.data.cof.core import BOOL, FUNCTIONS, NUM, OBJS, TEXT, Reject
from pipeline.data.cof.explorer import (
    BANNED_PAIRS,
    BOOL_JOINERS,
    NUM_JOINERS,
    SELECTIONS,
    TABLE,
    _apply,
    _plan,
    can_finish,
    explore,
)
from pipeline.data.cof.tables import TableContext, random_table
from pipeline.data.params import SynthesizeConfig
from tests.conftest import FULL_SYNTHESIS

# Multi-series tables of every chart type, so that every function gets explored.
CFG = SynthesizeConfig(**FULL_SYNTHESIS)
END = {"number": NUM, "binary": BOOL, "text": TEXT}


def chains(n, seed=0, lengths=range(2, 9), max_subchains=3, answer_types=("number", "binary", "text")):
    """(answer_type, length, steps) for n successful explorations on random tables."""
    rng, rejected, out = random.Random(seed), Counter(), []
    while len(out) < n:
        ctx = TableContext(random_table(rng, CFG))
        answer_type, length = rng.choice(answer_types), rng.choice(list(lengths))
        try:
            out.append((answer_type, length, explore(rng, ctx, answer_type, length, max_subchains, rejected)))
        except Reject:
            pass
    return out


@pytest.fixture(scope="module")
def sample():
    return chains(600)


def test_every_step_type_checks(sample):
    for answer_type, length, steps in sample:
        assert len(steps) == length
        assert steps[0].fn in SELECTIONS and steps[0].inputs == ()
        assert steps[-1].out_type == END[answer_type]
        for i, step in enumerate(steps):
            in_types = tuple(steps[j].out_type for j in step.inputs)
            assert all(j < i for j in step.inputs)
            assert FUNCTIONS[step.fn].signature.get(in_types) == step.out_type, (step.fn, in_types)
            assert (step.fn in SELECTIONS) == (step.inputs == ())


def test_unary_steps_take_the_previous_step_and_each_result_is_used_once(sample):
    for _, _, steps in sample:
        consumers = Counter(j for s in steps for j in s.inputs)
        assert all(consumers[i] == 1 for i in range(len(steps) - 1))
        assert consumers[len(steps) - 1] == 0
        for i, step in enumerate(steps):
            if len(step.inputs) == 1 and step.fn not in ("multiply_by_constant",):
                assert step.inputs == (i - 1,)


def test_no_walk_step_repeats_its_input_function_or_follows_a_banned_one(sample):
    for _, _, steps in sample:
        for step in steps:
            if len(step.inputs) == 1:  # joiners may nest: (a * b) * c is fine
                prev = steps[step.inputs[0]].fn
                assert prev != step.fn
                assert (prev, step.fn) not in BANNED_PAIRS


def test_subchains_are_joined_left_to_right():
    seen = Counter()
    for answer_type, _length, steps in chains(300, seed=1, lengths=[5, 8], answer_types=("number", "binary")):
        starts = [i for i, s in enumerate(steps) if s.inputs == ()]
        joiners = [s for s in steps if len(s.inputs) == 2]
        assert len(joiners) == len(starts) - 1 and len(starts) <= 3
        seen[len(starts)] += 1
        first_joiner = steps.index(joiners[0]) if joiners else len(steps)
        ends = [b - 1 for b in starts[1:]] + [first_joiner - 1]  # the last step of each sub-chain
        for k, joiner in enumerate(joiners):
            assert joiner.fn in (BOOL_JOINERS if joiner is steps[-1] and answer_type == "binary" else NUM_JOINERS)
            left = ends[0] if k == 0 else steps.index(joiners[k - 1])  # ((a op b) op c)
            assert joiner.inputs == (left, ends[k + 1])
    assert seen[1] and seen[2] and seen[3]  # length 8 admits three sub-chains of 2 plus 2 joiners


def test_lengths_outside_the_type_graph_are_rejected():
    assert not can_finish(None, TABLE, 1, NUM)  # a selection yields objects, never a number
    assert can_finish(None, TABLE, 2, NUM) and can_finish(None, TABLE, 2, BOOL) and can_finish(None, TABLE, 2, TEXT)
    with pytest.raises(Reject) as info:
        _plan(random.Random(0), NUM, 1, 3)
    assert info.value.reason == "no_plan"


def test_a_failed_application_is_counted_and_abandons_after_the_tries():
    bar = TableContext(
        {"chart_type": "bar", "title": "T", "unit": "u", "categories": ["A", "B", "C"], "series": ["V"],
         "values": [[1], [2], [3]], "colours": ["red", "red", "blue"], "colour_by": "category"}
    )
    rejected = Counter()
    with pytest.raises(Reject) as info:
        _apply(random.Random(0), bar, (("series_selection", OBJS), ("category_selection", OBJS)), (), [], rejected)
    assert info.value.reason == "dead_end"
    assert rejected == Counter(not_applicable=2)


def test_identical_operands_are_rejected(monkeypatch):
    monkeypatch.setattr(explorer, "_plan", lambda rng, end, length, max_subchains: ([2, 2], 0))
    bar = TableContext(
        {"chart_type": "bar", "title": "T", "unit": "u", "categories": ["A", "B", "C"], "series": ["V"],
         "values": [[1], [2], [3]], "colours": ["red", "red", "red"], "colour_by": "category"}
    )
    rng, reasons = random.Random(0), Counter()
    for _ in range(200):
        try:
            steps = explore(rng, bar, "number", 5, 2, Counter())
        except Reject as r:
            reasons[r.reason] += 1
            continue
        assert [(s.fn, s.args) for s in steps[:2]] != [(s.fn, s.args) for s in steps[2:4]]
    assert reasons["identical_operands"] > 0


def test_rejections_are_counted_by_reason():
    rng, rejected = random.Random(3), Counter()
    for _ in range(400):
        try:
            explore(rng, TableContext(random_table(rng, CFG)), rng.choice(list(END)), rng.randint(2, 8), 3, rejected)
        except Reject as r:
            rejected["chain:" + r.reason] += 1
    for reason in ("not_applicable", "too_few", "empty", "no_op", "tie", "chain:dead_end"):
        assert rejected[reason] > 0, reason


def test_same_seed_same_chain():
    def one(seed):
        return [(s.fn, s.args, s.inputs, s.value) for _, _, steps in chains(20, seed=seed) for s in steps]

    assert one(5) == one(5)
    assert one(5) != one(6)
