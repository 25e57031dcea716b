"""A user's dataset read into the example contract (pipeline/data/task_data.py), on hand-written files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.core.io import ConfigError, InputError
from pipeline.core.params import parse_section
from pipeline.data.params import DatasetConfig
from pipeline.data.task_data import extract_gold, read_task_dataset, split_steps

GSM8K_ROWS = [
    {"question": "Tom has 3 bags of 4 apples. How many apples?",
     "answer": "3 bags * 4 = <<3*4=12>>12 apples.\n#### 12"},
    {"question": "A pen costs $2. How much do 500 pens cost?", "answer": "500 * 2 = <<500*2=1000>>1000\n#### 1,000"},
    {"question": "Broken row", "answer": "no final mark"},
]
MATH_ROWS = [
    {"problem": "What is $1/2 + 1/4$?", "solution": "We add: $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$."},
    {"problem": "Simplify $\\sqrt{8}$.", "solution": "$\\sqrt{8} = \\boxed{2\\sqrt{2}}$"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_answers_and_rationales():
    cfg = DatasetConfig(path="x.jsonl", answer_extraction="gsm8k")
    assert extract_gold(GSM8K_ROWS[0]["answer"], cfg) == ("12", "3 bags * 4 = <<3*4=12>>12 apples.")
    assert extract_gold(GSM8K_ROWS[1]["answer"], cfg)[0] == "1000"
    assert extract_gold("no final mark", cfg)[0] is None


def test_math_answers_keep_nested_braces():
    cfg = DatasetConfig(path="x.jsonl", answer_extraction="boxed")
    assert extract_gold(MATH_ROWS[0]["solution"], cfg)[0] == "\\frac{3}{4}"
    assert extract_gold(MATH_ROWS[1]["solution"], cfg)[0] == "2\\sqrt{2}"


def test_a_regex_takes_its_first_group():
    cfg = DatasetConfig(path="x.csv", answer_extraction="regex", answer_regex=r"ANS=(\w+)")
    assert extract_gold("work ANS=7 then ANS=8", cfg)[0] == "8"


def test_a_regex_extraction_needs_a_valid_regex():
    with pytest.raises(ConfigError, match="answer_regex"):
        parse_section("dataset", DatasetConfig, {"path": "x", "answer_extraction": "regex"})
    with pytest.raises(ConfigError, match="answer_regex"):
        parse_section("dataset", DatasetConfig, {"path": "x", "answer_extraction": "regex", "answer_regex": "("})


def test_split_keys_are_ours_at_validation():
    """Checked with the params, before `dvc repro` deletes the data stage's outputs to run it."""
    with pytest.raises(ConfigError, match=r"dataset: Value error, splits: validation: not one of our splits"):
        parse_section("dataset", DatasetConfig, {"path": "x", "splits": {"train": "train", "validation": "dev"}})
    assert parse_section("dataset", DatasetConfig, {"path": "x", "splits": {"val": "dev"}}).splits == {"val": "dev"}


def test_steps_are_paragraphs_or_lines():
    text = "First we add.\nThen carry.\n\n  Finally   divide.\n"
    assert split_steps(text, "paragraph") == ["First we add. Then carry.", "Finally divide."]
    assert split_steps(text, "line") == ["First we add.", "Then carry.", "Finally divide."]


def test_a_gsm8k_file_becomes_train_val_and_test_with_a_quarantine(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K_ROWS)
    cfg = DatasetConfig(path=str(path), answer_extraction="gsm8k", test_fraction=0.0, val_fraction=0.0,
                        max_unextractable=0.5)
    splits, quarantine = read_task_dataset(cfg, step_split="line")
    assert list(splits) == ["train", "val", "test"] and splits["val"] == splits["test"] == []
    first = splits["train"][0]
    assert first["answer"] == "12" and first["answer_type"] == "number" and first["split"] == "train"
    assert first["steps"] == ["3 bags * 4 = 12 apples."]  # the calculator annotation dropped
    assert len(first["id"]) == 16
    assert quarantine == [{"split": "train", "row": 2, "reason": "no answer by gsm8k", "value": "no final mark"}]


def test_too_many_unextractable_answers_fail_naming_the_rows(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K_ROWS + [{"question": f"q{i}", "answer": "?"} for i in range(6)])
    with pytest.raises(InputError, match=r"7 of 9 rows have no answer.*the first 5 \(rows count from 0\): split "
                                         r"train, row 2: no answer by gsm8k; split train, row 3: .*row 6: [^;]*$"):
        read_task_dataset(DatasetConfig(path=str(path), answer_extraction="gsm8k", max_unextractable=0.1))


def test_a_single_file_gets_test_and_val_cut_by_independent_hashes_of_the_prompt(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(1000)]
    path = write_jsonl(tmp_path / "all.jsonl", rows)
    heard = []
    splits, _ = read_task_dataset(DatasetConfig(path=str(path), test_fraction=0.2, val_fraction=0.1), log=heard.append)
    sizes = {split: len(rows) for split, rows in splits.items()}
    assert sum(sizes.values()) == 1000 and 160 <= sizes["test"] <= 240 and 55 <= sizes["val"] <= 105
    prompts = {split: {r["prompt"] for r in rows} for split, rows in splits.items()}
    assert not prompts["test"] & (prompts["train"] | prompts["val"])
    assert heard == [f"task.dataset: no test split: {sizes['test']} of train's 1000 rows cut by "
                     "task.dataset.test_fraction = 0.2",
                     f"task.dataset: no val split: {sizes['val']} of train's {1000 - sizes['test']} rows cut by "
                     "task.dataset.val_fraction = 0.1"]
    # the val cut is the one it would be without a test cut, less the test rows: the draws are independent
    no_test, _ = read_task_dataset(DatasetConfig(path=str(path), test_fraction=0.0, val_fraction=0.1))
    assert prompts["val"] == {r["prompt"] for r in no_test["val"]} - prompts["test"]


def test_files_are_splits_by_the_words_in_their_names(tmp_path):
    write_jsonl(tmp_path / "gsm8k-train.jsonl", [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}])
    write_jsonl(tmp_path / "train-00000-of-00002.jsonl", [{"question": "c", "answer": "3"}])
    write_jsonl(tmp_path / "train-00001-of-00002.jsonl", [{"question": "d", "answer": "4"}])
    write_jsonl(tmp_path / "dev.jsonl", [{"question": "e", "answer": "5"}, {"question": "a", "answer": "1"}])
    write_jsonl(tmp_path / "gsm8k-eval.jsonl", [{"question": "f", "answer": "6"}])
    write_jsonl(tmp_path / "notes.jsonl", [{"question": "g", "answer": "7"}])
    heard = []
    splits, _ = read_task_dataset(DatasetConfig(path=str(tmp_path)), log=heard.append)
    prompts = {split: [r["prompt"] for r in rows] for split, rows in splits.items()}
    # "a" is in val (dev) and train: it stays in val only, and the log counts what it dropped
    assert prompts == {"train": ["c", "d", "b"], "val": ["e", "a"], "test": ["f"]} or \
        prompts == {"train": ["b", "c", "d"], "val": ["e", "a"], "test": ["f"]}
    assert "task.dataset: not read: notes (no split of ours; map them with task.dataset.splits)" in heard
    assert "task.dataset: 1 train rows dropped: their prompt is in train already or in a split evaluated before " \
        "it (test, ood, val, train)" in heard
    # a file stem maps as it is (the shards are one split, named without their shard numbers)
    mapped, _ = read_task_dataset(DatasetConfig(path=str(tmp_path), splits={"train": "train", "test": "notes"}))
    assert [r["prompt"] for r in mapped["train"]] == ["c", "d"] and [r["prompt"] for r in mapped["test"]] == ["g"]
    with pytest.raises(InputError, match=r"none of its splits \(main\) is named train, val or test; map them"):
        (tmp_path / "only").mkdir()
        write_jsonl(tmp_path / "only" / "main.jsonl", [{"question": "a", "answer": "1"}])
        read_task_dataset(DatasetConfig(path=str(tmp_path / "only")))


@pytest.mark.parametrize("name, content, cause", [
    ("train.jsonl", b"", "empty file"),
    ("train.jsonl", b'{"question": "a", "answer": "1"}\n{"question": "caf\xe9", "answer": "1"}\n',
     r"line 2: not UTF-8 \(byte 0xe9 at column 18\)"),
    ("train.jsonl", b'{"question": "a", "answer": "1"}\n{"question": "b", "ans', "line 2: not JSON"),
    ("train.csv", b"question,answer\ncaf\xe9,1\n", "line 2: not UTF-8"),
    ("train.csv", b"question,answer\n", "no rows"),
])
def test_an_unreadable_file_is_named_with_its_cause(tmp_path, name, content, cause):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError, match=rf"task.dataset.path: {tmp_path / name}: .*{cause}"):
        read_task_dataset(DatasetConfig(path=str(tmp_path)))


def test_a_folder_gives_its_splits_deduplicated_with_a_stable_val_cut(tmp_path):
    train = [{"problem": f"p{i}", "solution": f"\\boxed{{{i}}}"} for i in range(200)]
    test = [{"problem": "p5", "solution": "\\boxed{5}"}, {"problem": "q", "solution": "\\boxed{1}"}]
    write_jsonl(tmp_path / "train.jsonl", train + [train[7]])  # p7 twice
    write_jsonl(tmp_path / "test.jsonl", test)
    cfg = DatasetConfig(path=str(tmp_path), prompt_field="problem", answer_field="solution",
                        answer_extraction="boxed", val_fraction=0.25)
    splits, _ = read_task_dataset(cfg)
    assert list(splits) == ["train", "val", "test"]
    prompts = {s: [r["prompt"] for r in rows] for s, rows in splits.items()}
    assert prompts["test"] == ["p5", "q"]
    assert "p5" not in prompts["train"] + prompts["val"]  # a test prompt is never trained on
    assert sorted(prompts["train"] + prompts["val"]) == sorted(f"p{i}" for i in range(200) if i != 5)
    assert 25 <= len(prompts["val"]) <= 75  # about a quarter, by hash
    again, _ = read_task_dataset(cfg)
    assert again == splits  # the cut is a function of the prompts


def test_split_names_map_to_ours(tmp_path):
    write_jsonl(tmp_path / "main.jsonl", [{"q": "a", "a": "1"}, {"q": "b", "a": "2"}])
    write_jsonl(tmp_path / "holdout.jsonl", [{"q": "c", "a": "yes"}])
    cfg = DatasetConfig(path=str(tmp_path), prompt_field="q", answer_field="a",
                        splits={"train": "main", "test": "holdout"}, val_fraction=0.0)
    splits, _ = read_task_dataset(cfg)
    assert [r["prompt"] for r in splits["test"]] == ["c"] and splits["test"][0]["answer_type"] == "binary"
    with pytest.raises(InputError, match="'dev' is not a split of .*its splits: holdout, main"):
        read_task_dataset(cfg.model_copy(update={"splits": {"train": "main", "val": "dev"}}))


def test_csv_and_parquet_read_alike(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.csv").write_text("question,answer\nwhat,4\n")
    pq.write_table(pa.table({"question": ["what"], "answer": ["4"]}), tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        splits, _ = read_task_dataset(DatasetConfig(path=str(tmp_path / name), test_fraction=0.0, val_fraction=0.0))
        assert [(r["prompt"], r["answer"]) for r in splits["train"]] == [("what", "4")]


def test_a_missing_field_is_named_with_the_fields_that_exist(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", MATH_ROWS)
    with pytest.raises(InputError, match=r"task.dataset.prompt_field: 'question' is not a field of .*m.jsonl.*"
                                         r"its fields: problem, solution"):
        read_task_dataset(DatasetConfig(path=str(path), answer_field="solution"))


def test_a_file_beside_the_splits_that_is_not_read_needs_no_fields(tmp_path):
    """A folder's dataset_info.json (or an unlabelled split) is left unread and said so; its fields are not checked."""
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "train.jsonl", MATH_ROWS[1:])
    write_jsonl(tmp_path / "d" / "test.jsonl", MATH_ROWS[:1])
    (tmp_path / "d" / "dataset_info.json").write_text(json.dumps({"description": "x", "license": "y"}))
    said = []
    splits, _ = read_task_dataset(DatasetConfig(path=str(tmp_path / "d"), prompt_field="problem",
                                                answer_field="solution", answer_extraction="boxed", val_fraction=0.0),
                                  log=said.append)
    assert len(splits["train"]) == 1 and len(splits["test"]) == 1
    assert any("not read: dataset_info" in line for line in said)


def test_a_missing_path_and_an_offline_hub_id_fail_clearly(tmp_path):
    with pytest.raises(InputError, match="no such file or folder"):
        read_task_dataset(DatasetConfig(path=str(tmp_path / "absent.jsonl")))
    # huggingface_hub reads HF_HUB_OFFLINE when imported: a fresh process, as a stage would be.
    code = ("from pipeline.data.params import DatasetConfig\nfrom pipeline.data.task_data import read_task_dataset\n"
            "read_task_dataset(DatasetConfig(path='nobody/no-such-dataset'))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "task.dataset.path: nobody/no-such-dataset: not a local path" in done.stderr
    assert "HF_HUB_OFFLINE=1" in done.stderr


def test_the_data_stage_writes_the_contract_with_sft_targets_and_a_quarantine(tmp_path, monkeypatch):
    from pipeline.core.io import read_rows
    from pipeline.data.params import TaskConfig
    from stages import synthesize

    folder = tmp_path / "ds"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", GSM8K_ROWS * 1)
    write_jsonl(folder / "test.jsonl", [{"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}])
    write_jsonl(folder / "validation.jsonl", [{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}])
    monkeypatch.chdir(tmp_path)
    cfg = TaskConfig(kind="dataset", dataset={"path": "ds", "answer_extraction": "gsm8k", "max_unextractable": 0.5},
                     data_dependency="ds", answer_format="gsm8k")
    synthesize.from_dataset(cfg)
    train = read_rows("data/synthesize/train.parquet")
    assert [r["answer"] for r in train] == ["12", "1000"]
    # The SFT completion restores the answer the way the task reads it; the steps drop the calculator notes.
    assert train[0]["rationale"] == "3 bags * 4 = <<3*4=12>>12 apples.\n#### 12"
    assert train[0]["steps"] == [{"function": "", "text": "3 bags * 4 = 12 apples.", "value": ""}]
    assert train[0]["question"] == train[0]["prompt"] and train[0]["table"] is None
    assert [r["answer"] for r in read_rows("data/synthesize/val.parquet")] == ["2"]
    assert read_rows("data/synthesize/ood.parquet") == []  # none in the dataset: an empty file every reader finds
    quarantined = [json.loads(line)
                   for line in (tmp_path / "data/synthesize/quarantine.jsonl").read_text().splitlines()]
    assert quarantined == [{"split": "train", "row": 2, "reason": "no answer by gsm8k", "value": "no final mark"}]
    assert (tmp_path / "data/synthesize/charts/README.txt").exists()
    metrics = json.loads((tmp_path / "metrics/synthesize.json").read_text())
    assert metrics["by_split"] == {"train": 2, "val": 1, "test": 1, "ood": 0} and metrics["quarantined"] == 1


def test_the_rationale_share_is_a_stable_draw_unlike_the_val_cut():
    from pipeline.data.task_data import RATIONALE_SALT, in_share

    prompts = [f"question {k}" for k in range(2000)]
    quarter = [p for p in prompts if in_share(p, 0.25, RATIONALE_SALT)]
    assert 400 < len(quarter) < 600
    assert quarter == [p for p in prompts if in_share(p, 0.25, RATIONALE_SALT)]
    # Independent of the val cut's draw: a share of train is not the prompts the val cut left out.
    val = {p for p in prompts if in_share(p, 0.25)}
    assert 0.15 < len(val.intersection(quarter)) / len(quarter) < 0.35
