"""generate_dataset: exact counts, determinism, split hygiene, lengths, answer-type shares, blocks and workers."""

import json
import random
from collections import Counter

import pytest

from pipeline.core.io import EXAMPLE_SCHEMA, ConfigError, write_rows
from pipeline.data.cof import generate
from pipeline.data.cof.core import FUNCTIONS, parse_held_out
from pipeline.data.cof.generate import (
    SPLITS,
    block_count,
    block_quotas,
    generate_dataset,
    more_questions,
    more_train_questions,
    spread,
    task_type,
)
from pipeline.data.cof.tables import random_table
from pipeline.data.grading import extract_answer, grade, step_accuracy
from pipeline.data.params import SynthesizeConfig
from tests.conftest import FULL_SYNTHESIS

SMALL = SynthesizeConfig(seed=3, n_train=60, n_val=10, n_test=10, n_ood=10, **FULL_SYNTHESIS)
LARGE = SynthesizeConfig(seed=11, n_train=1200, n_val=100, n_test=100, n_ood=200, **FULL_SYNTHESIS)
BLOCKS = SMALL.model_copy(update={"block_size": 25})  # 90 questions in 4 blocks
# Line charts of 2 points valued 0 to 2: a few thousand tables, so blocks draw the same ones.
TINY_TABLES = SynthesizeConfig(seed=0, n_train=120, n_val=15, n_test=15, n_ood=15, block_size=30,
                               chart_types=["line"], min_categories=2, max_categories=2, value_min=0, value_max=2)
COLUMNS = {
    "id": str, "split": str, "chart_type": str, "table": str, "question": str, "prompt": str, "answer": str,
    "answer_type": str, "functions": list, "groups": list, "steps": list, "rationale": str, "chain_length": int,
    "task_type": str, "image_path": type(None),
}


@pytest.fixture(scope="module")
def small():
    return generate_dataset(SMALL)


@pytest.fixture(scope="module")
def large():
    return generate_dataset(LARGE)


def all_rows(rows):
    return [r for split in SPLITS for r in rows[split]]


def test_counts_are_exact(small):
    rows, stats = small
    assert {s: len(rows[s]) for s in SPLITS} == {"train": 60, "val": 10, "test": 10, "ood": 10}
    assert stats["splits"] == {"train": 60, "val": 10, "test": 10, "ood": 10}
    assert stats["accepted"] == 90 and stats["attempts"] >= 90
    assert [r["id"] for r in rows["val"]] == [f"val-{i:06d}" for i in range(10)]


def test_every_row_has_every_column(small):
    rows, _ = small
    for split in SPLITS:
        for r in rows[split]:
            assert set(r) == set(COLUMNS)
            for column, typ in COLUMNS.items():
                assert isinstance(r[column], typ), (column, r[column])
            assert r["split"] == split
            assert r["chain_length"] == len(r["functions"]) == len(r["steps"])
            assert r["answer_type"] in ("number", "binary", "text")
            assert r["prompt"].endswith(f"Question: {r['question']}\n")
            assert json.loads(r["table"])["chart_type"] == r["chart_type"]
            assert r["groups"] == list(dict.fromkeys(FUNCTIONS[f].group for f in r["functions"]))
            for step in r["steps"]:
                assert set(step) == {"function", "text", "value"} and all(isinstance(v, str) for v in step.values())
            assert grade(extract_answer(r["rationale"]), r["answer"], r["answer_type"])
            n = len(r["steps"])
            assert step_accuracy(r["rationale"], [s["value"] for s in r["steps"]]) == (n, n)


def test_same_seed_same_rows_and_another_seed_differs(small):
    again = generate_dataset(SMALL)
    assert again == small
    other, _ = generate_dataset(SMALL.model_copy(update={"seed": 4}))
    assert [r["question"] for r in other["train"]] != [r["question"] for r in small[0]["train"]]


def test_no_question_or_table_is_shared_across_splits(large):
    rows, _ = large
    for column in ("question", "table"):
        owner = {}
        for split in SPLITS:
            for r in rows[split]:
                assert owner.setdefault(r[column], split) == split, (column, r[column])
    tables = [r["table"] for r in all_rows(rows)]
    assert len(set(tables)) == len(tables)  # one question per table


def test_more_train_questions_keep_the_question_split_and_new_tables(small):
    """The PRM's new questions: another seed, so new tables, and never a question text of val, test or ood."""
    rows, _ = small
    more = more_train_questions(SMALL, 150, seed=4, prefix="prm")  # 150 of 60: the sizes scaled by 3
    assert len(more) == 150 and [r["id"] for r in more[:2]] == ["prm-000000", "prm-000001"]
    assert {r["split"] for r in more} == {"train"} and max(r["chain_length"] for r in more) <= SMALL.max_chain_length
    scaled, _ = generate_dataset(SMALL.model_copy(update={"n_train": 180, "n_val": 30, "n_test": 30, "n_ood": 0}))
    # Same question texts in the same split: hash edges unmoved by a whole scale factor.
    held_out = {r["question"] for split in ("val", "test") for r in rows[split] + scaled[split]}
    assert not held_out & {r["question"] for r in more}
    assert not {r["table"] for r in all_rows(rows)} & {r["table"] for r in more}


def test_more_questions_of_a_held_out_split_keep_its_texts_and_draw_new_tables(small):
    """A bigger val or test (experiments/prm_selection.py --fresh-seed): only texts the hash puts in that split."""
    rows, _ = small
    fresh = more_questions(SMALL, 25, seed=4, split="test", prefix="fresh")  # 25 of 10: the sizes scaled by 3
    assert len(fresh) == 25 and fresh[0]["id"] == "fresh-000000" and {r["split"] for r in fresh} == {"test"}
    scaled, _ = generate_dataset(SMALL.model_copy(update={"n_train": 180, "n_val": 30, "n_test": 30, "n_ood": 0}))
    elsewhere = {r["question"] for split in ("train", "val") for r in rows[split] + scaled[split]}
    assert not elsewhere & {r["question"] for r in fresh}
    assert not {r["table"] for r in all_rows(rows)} & {r["table"] for r in fresh}
    with pytest.raises(ValueError, match="ood"):
        more_questions(SMALL, 5, seed=4, split="ood", prefix="x")


def test_more_train_questions_in_blocks_keep_the_question_split():
    """The guarantee holds whichever block draws a text: 270 scaled questions in 11 blocks of 25."""
    more = more_train_questions(BLOCKS, 150, seed=4, prefix="prm")
    assert len(more) == 150 and {r["split"] for r in more} == {"train"}
    scaled, _ = generate_dataset(BLOCKS.model_copy(update={"n_train": 180, "n_val": 30, "n_test": 30, "n_ood": 0}))
    rows, _ = generate_dataset(BLOCKS)
    held_out = {r["question"] for split in ("val", "test") for r in rows[split] + scaled[split]}
    assert not held_out & {r["question"] for r in more}


def test_a_table_is_used_once_even_when_drawn_again(monkeypatch):
    pool = [random_table(random.Random(i), SMALL) for i in range(30)]
    monkeypatch.setattr(generate, "random_table", lambda rng, cfg: pool[rng.randrange(len(pool))])
    rows, stats = generate_dataset(SMALL.model_copy(update={"n_train": 8, "n_val": 1, "n_test": 1, "n_ood": 1}))
    tables = [r["table"] for r in all_rows(rows)]
    assert len(set(tables)) == len(tables) == 11
    assert stats["rejected"]["duplicate_table"] > 0


def test_quotas_spread_over_blocks_sum_to_the_request():
    cfg = SMALL.model_copy(update={"n_ood": 3, "block_size": 7})  # 83 questions: 12 blocks, 3 with ood
    quotas = block_quotas(cfg)
    assert len(quotas) == block_count(cfg) == 12
    assert sum(q["in_domain"] for q in quotas) == 80 and sum(q["ood"] for q in quotas) == 3
    assert {sum(q.values()) for q in quotas} == {6, 7}  # the larger parts of each count follow on
    assert quotas == block_quotas(cfg.model_copy(update={"workers": 5}))
    parts = spread({"train": 10, "val": 2, "test": 0, "ood": 1}, 4)
    assert [sum(q[s] for q in parts) for s in SPLITS] == [10, 2, 0, 1]
    # train 3, 3, 2, 2: val's larger parts start at block 2, then ood's at block 0.
    assert [q["val"] for q in parts] == [0, 0, 1, 1] and [q["ood"] for q in parts] == [1, 0, 0, 0]


def test_a_block_with_an_empty_split_draws_only_the_others():
    rows, attempts, rejected = generate._draw_block(SMALL, "0", {"train": 4, "val": 0, "test": 0, "ood": 2}, 10_000)
    assert {s: len(rows[s]) for s in SPLITS} == {"train": 4, "val": 0, "test": 0, "ood": 2}
    assert attempts >= 6 and rejected["split_full"] > 0  # val and test texts were drawn, and turned away
    # A request whose ood is smaller than the block count: blocks 2 and 3 (of 0 to 3) have no ood quota.
    rows, _ = generate_dataset(BLOCKS.model_copy(update={"n_ood": 2}))
    assert {s: len(rows[s]) for s in SPLITS} == {"train": 60, "val": 10, "test": 10, "ood": 2}


def test_the_rows_are_the_same_whatever_the_workers(tmp_path):
    """Byte for byte, in the stage's parquet files too: the blocks' seeds and merge order depend on the params alone."""

    def parquet_bytes(rows, folder):
        folder.mkdir()
        for split in SPLITS:
            write_rows(folder / f"{split}.parquet", rows[split], schema=EXAMPLE_SCHEMA)
        return [(folder / f"{split}.parquet").read_bytes() for split in SPLITS]

    rows, stats = generate_dataset(BLOCKS)
    assert {s: len(rows[s]) for s in SPLITS} == {"train": 60, "val": 10, "test": 10, "ood": 10}
    assert [r["id"] for r in rows["train"][:2]] == ["train-000000", "train-000001"]
    files = parquet_bytes(rows, tmp_path / "1")
    for workers in (2, 3):
        again, again_stats = generate_dataset(BLOCKS.model_copy(update={"workers": workers}))
        assert json.dumps(again) == json.dumps(rows) and again_stats == stats
        assert parquet_bytes(again, tmp_path / str(workers)) == files
    owner = {}
    for r in all_rows(rows):
        assert owner.setdefault(r["question"], r["split"]) == r["split"]  # the hash of a text is global
    assert rows != generate_dataset(SMALL)[0]  # block_size is part of the seed


def test_a_table_drawn_by_two_blocks_is_kept_once():
    cfg = TINY_TABLES
    owner = {}
    for block, quota in enumerate(block_quotas(cfg)):
        drawn = generate._draw_block(cfg, str(block), quota, 10_000)
        for r in all_rows(drawn.rows):
            owner.setdefault(r["table"], []).append(block)
    assert any(len(set(blocks)) > 1 for blocks in owner.values())  # the case under test happens
    rows, stats = generate_dataset(cfg)
    tables = [r["table"] for r in all_rows(rows)]
    assert len(set(tables)) == len(tables) == 165 and stats["rejected"]["duplicate_table"] > 0
    assert {s: len(rows[s]) for s in SPLITS} == {"train": 120, "val": 15, "test": 15, "ood": 15}
    again = generate_dataset(cfg.model_copy(update={"workers": 2}))
    assert json.dumps(again) == json.dumps((rows, stats))


def test_the_repair_pass_fills_what_shared_tables_left_missing(monkeypatch):
    """14 tables for 11 questions in 4 blocks: blocks and fills share tables; the repair pass takes unused ones."""
    pool = [random_table(random.Random(i), SMALL) for i in range(14)]
    monkeypatch.setattr(generate, "random_table", lambda rng, cfg: pool[rng.randrange(len(pool))])
    streams = []
    rng = generate._rng
    monkeypatch.setattr(generate, "_rng", lambda seed, stream: streams.append(stream) or rng(seed, stream))
    cfg = SMALL.model_copy(update={"n_train": 8, "n_val": 1, "n_test": 1, "n_ood": 1, "block_size": 3})
    rows, stats = generate_dataset(cfg)
    assert streams[:4] == ["0", "1", "2", "3"] and streams[-1] == "repair"
    tables = [r["table"] for r in all_rows(rows)]
    assert len(set(tables)) == len(tables) == 11
    assert generate_dataset(cfg) == (rows, stats)


def test_chain_lengths_per_split(large):
    rows, stats = large
    cfg = LARGE
    for split in ("train", "val", "test"):
        assert all(cfg.min_chain_length <= r["chain_length"] <= cfg.max_chain_length for r in rows[split])
    assert all(cfg.ood_min_chain_length <= r["chain_length"] <= cfg.ood_max_chain_length for r in rows["ood"])
    assert set(stats["chain_length"]["train"]) == {"2", "3", "4", "5"}


def test_answer_types_follow_the_weights(large):
    rows, _ = large
    in_domain = [r for s in ("train", "val", "test") for r in rows[s]]
    for group in (in_domain, rows["ood"]):
        share = Counter(r["answer_type"] for r in group)
        for answer_type, weight in LARGE.answer_type_weights.items():
            assert abs(share[answer_type] / len(group) - weight) < 0.05, (answer_type, share)


def test_binary_answers_are_balanced(large):
    answers = Counter(r["answer"] for r in all_rows(large[0]) if r["answer_type"] == "binary")
    assert abs(answers["Yes"] - answers["No"]) <= 0.1 * sum(answers.values())


def test_a_numeric_answer_never_appears_in_its_question(large):
    for r in all_rows(large[0]):
        if r["answer_type"] == "number":
            assert f" {r['answer']} " not in f" {r['question'][:-1]} "


def test_other_weights_are_followed_too():
    weights = {"number": 0.2, "binary": 0.4, "text": 0.4}
    cfg = SynthesizeConfig(n_train=200, n_val=20, n_test=20, n_ood=20, answer_type_weights=weights)
    rows, _ = generate_dataset(cfg)
    share = Counter(r["answer_type"] for r in all_rows(rows))
    assert abs(share["text"] / 260 - 0.4) < 0.05 and abs(share["number"] / 260 - 0.2) < 0.05


def test_held_out_pairs_only_appear_in_ood():
    cfg = SMALL.model_copy(update={"ood_held_out_pairs": ["select_all>count_objects"], "n_ood": 40})
    rows, _ = generate_dataset(cfg)

    def has_pair(r):
        fns = r["functions"]
        return any(a == "select_all" and b == "count_objects" for a, b in zip(fns, fns[1:]))

    assert not any(has_pair(r) for s in ("train", "val", "test") for r in rows[s])
    assert any(has_pair(r) and r["chain_length"] < cfg.ood_min_chain_length for r in rows["ood"])
    with pytest.raises(ConfigError, match="ood_held_out_pairs"):
        parse_held_out(["select_all>no_such_function"])


def test_running_out_of_attempts_fails_with_a_clear_message():
    with pytest.raises(RuntimeError, match=r"gave up after \d+ attempts \(max_attempts_factor=1\)"):
        generate_dataset(SMALL.model_copy(update={"max_attempts_factor": 1}))


@pytest.mark.parametrize(
    "functions, answer_type, expected",
    [
        (["one_object", "colour_of"], "text", "text_information"),
        (["series_selection", "consistently_increasing"], "binary", "trend"),
        (["one_object", "value_of_objects", "one_object", "value_of_objects", "A_greater_B"], "binary", "comparison"),
        (["select_all", "value_of_objects", "mean", "multiply_by_constant"], "number", "arithmetic"),
        (["select_all", "value_of_objects", "median"], "number", "statistics"),
        (["select_all", "larger_than", "count_objects"], "number", "counting"),
        (["select_all", "max_one_object", "value_of_objects"], "number", "extreme_value"),
        (["one_object", "value_of_objects"], "number", "data_retrieval"),
    ],
)
def test_task_type(functions, answer_type, expected):
    assert task_type(functions, answer_type) == expected


def test_render_is_byte_for_byte_deterministic(small, tmp_path):
    from pipeline.data.cof.render import render_chart

    by_type = {r["chart_type"]: json.loads(r["table"]) for r in all_rows(small[0])}
    assert set(by_type) == set(SMALL.chart_types)
    for chart_type, table in by_type.items():
        a, b = tmp_path / f"{chart_type}-a.png", tmp_path / "x" / f"{chart_type}-b.png"
        render_chart(table, a)
        render_chart(table, b)
        assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert a.read_bytes() == b.read_bytes()
