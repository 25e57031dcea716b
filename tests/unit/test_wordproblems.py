"""The committed GSM8K-format example data (examples/gsm8k) is what pipeline/data/wordproblems.py writes, and sound."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.data.params import DatasetConfig
from pipeline.data.task_data import read_task_dataset
from pipeline.data.wordproblems import FRAMES, MAX_VALUE, TEST_FRAMES, TRAIN_FRAMES, write

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "gsm8k"
CALC = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>(\d+)")


def test_the_generator_reproduces_the_committed_files(tmp_path):
    write(tmp_path)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (EXAMPLES / f"{split}.jsonl").read_bytes(), split


def rows(split):
    return [json.loads(line) for line in (EXAMPLES / f"{split}.jsonl").read_text().splitlines()]


def frame_of(question: str) -> str:
    """The one frame whose opening sentence starts `question`."""
    found = [name for name, frame in FRAMES.items()
             if re.match(re.escape(frame.start).replace(r"\{name\}", ".+").replace(r"\{a\}", r"\d+"), question)]
    assert len(found) == 1, (question, found)
    return found[0]


def test_every_rationale_computes_its_answer_in_2_to_4_whole_operations():
    for split in ("train", "test"):
        for row in rows(split):
            calcs = CALC.findall(row["answer"])
            assert 2 <= len(calcs) <= 4, row
            for a, op, b, c, shown in calcs:
                a, b, c = int(a), int(b), int(c)
                assert c == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] and shown == str(c), row
                assert op != "/" or a % b == 0, row
                assert 1 <= c <= MAX_VALUE and a <= MAX_VALUE and b <= MAX_VALUE, row
            assert row["answer"].endswith(f"#### {calcs[-1][3]}"), row


def test_test_problems_come_only_from_frames_no_training_problem_uses():
    train_frames = {frame_of(r["question"]) for r in rows("train")}
    test_frames = {frame_of(r["question"]) for r in rows("test")}
    assert train_frames == set(TRAIN_FRAMES) and test_frames == set(TEST_FRAMES)
    assert not train_frames & test_frames


def test_the_dataset_reader_takes_every_row():
    splits, quarantine = read_task_dataset(DatasetConfig(path=str(EXAMPLES), answer_extraction="gsm8k"), "line")
    assert quarantine == []
    assert len(splits["test"]) == 300 and len(splits["train"]) + len(splits["val"]) == 2000
    assert all(row["answer_type"] == "number" and 2 <= len(row["steps"]) <= 4 for row in splits["test"])
