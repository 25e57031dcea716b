"""pipeline.data.task: one reading of a completion (answer, grade, steps, shape, SFT target) per task, on hand-written
completions; and the `task` params section's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.io import ConfigError
from pipeline.core.params import parse_section
from pipeline.data import task as tasks
from pipeline.data.params import NO_DATA_DEPENDENCY, TaskConfig
from pipeline.data.task import COF, Task

GSM8K = Task("dataset", "gsm8k", "math_verify", "line")
BOXED = Task("dataset", "boxed", "math_verify", "paragraph")
LAST = Task("dataset", "last_number", "exact", "line")
COF_TEXT = "Step 1: The value of Tigers is 19.\nStep 2: 19 - 6 = 13.\nAnswer: 13\nStep 3: ignored"


def test_the_chart_task_reads_step_lines_and_the_answer_line_as_before():
    assert COF.steps(COF_TEXT) == ["Step 1: The value of Tigers is 19.", "Step 2: 19 - 6 = 13.", "Answer: 13"]
    assert COF.extract(COF_TEXT) == "13"
    assert COF.is_correct(COF_TEXT, "13.5", "number")  # relaxed: within 5%
    assert not COF.is_correct(COF_TEXT, "15", "number")
    assert COF.is_terminal("Answer: 4") and not COF.is_terminal("Step 1: x is 4.")
    assert COF.is_formatted("Step 1: a is 1.\nAnswer: 1") and not COF.is_formatted("Answer: 1")
    assert COF.target("Step 1: a is 1.", "1") == "Step 1: a is 1.\nAnswer: 1"


def test_a_gsm8k_completion_ends_at_its_answer_line():
    text = "Tom has 3 + 4 = <<3+4=7>>7 apples.\nHe gives 2 away: 7 - 2 = 5.\n#### 5\nleftover text"
    assert GSM8K.steps(text) == ["Tom has 3 + 4 = <<3+4=7>>7 apples.", "He gives 2 away: 7 - 2 = 5.", "#### 5"]
    assert GSM8K.extract(text) == "5"
    assert GSM8K.is_correct(text, "5", "number") and not GSM8K.is_correct(text, "6", "number")
    assert not GSM8K.is_formatted(text)  # text after the answer
    assert GSM8K.is_formatted(text.rsplit("\n", 1)[0])
    assert not GSM8K.is_formatted("#### 5")  # no step before the answer
    assert GSM8K.target("a\nb", "5") == "a\nb\n#### 5"
    assert GSM8K.extract(GSM8K.target("a\nb", "1,000")) == "1,000"


def test_paragraph_steps_and_a_boxed_answer():
    text = "First we halve it:\n$x = \\frac{1}{2}$.\n\nThen the answer is \\boxed{\\frac{1}{2}}.\n\nExtra."
    assert BOXED.steps(text) == ["First we halve it: $x = \\frac{1}{2}$.", "Then the answer is \\boxed{\\frac{1}{2}}."]
    assert BOXED.step_break == "\n\n"
    assert BOXED.is_correct(text, "0.5", "text")  # math-verify: \frac{1}{2} is 0.5
    assert BOXED.join(["a", "b"]) == "a\n\nb\n\n"
    assert BOXED.target("a", "\\frac{1}{2}") == "a\n\nThe answer is \\boxed{\\frac{1}{2}}."
    assert BOXED.target("so $\\boxed{3}$.", "3") == "so $\\boxed{3}$."  # MATH's solution states it already


def test_last_number_never_ends_a_path_early_and_reasoning_tags_are_skipped():
    text = "<think>maybe 99</think>\n2 + 3 = 5\nSo 5 in all."
    assert LAST.steps(text) == ["<think>maybe 99</think>", "2 + 3 = 5", "So 5 in all."]
    assert LAST.extract(text) == "5"
    assert LAST.is_formatted(text) and not LAST.is_formatted("So 5 in all.")
    assert not LAST.ends_path("2 + 3 = 5")


def test_non_text_completions_are_wrong_not_errors():
    for task in (COF, GSM8K, BOXED, LAST):
        assert task.steps(None) == [] and task.extract(None) is None
        assert not task.is_correct(None, "5", "number")


def test_active_follows_use_then_the_section_handed_over(monkeypatch, tmp_path):
    from pipeline.core.params import giving

    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text("task: {grader: exact}\n")  # the library never reads it: a stage hands it over
    exact = Task("cof", "answer_line", "exact", "line")
    try:
        assert tasks.active() == COF  # nothing handed over: the chart task
        with giving(TaskConfig(grader="exact")):
            assert tasks.active() == exact
            assert tasks.active() is tasks.active()  # built once per section handed over
            tasks.use(LAST)
            assert tasks.active() == LAST
    finally:
        tasks.use(None)
    assert tasks.active() == COF


def test_the_task_section_checks_kind_dataset_and_its_dependency():
    dataset = {"path": "examples/gsm8k", "answer_extraction": "gsm8k"}
    ok = parse_section("task", TaskConfig, {"kind": "dataset", "dataset": dataset, "data_dependency": "examples/gsm8k",
                                            "answer_format": "gsm8k"})
    assert ok.dataset.path == "examples/gsm8k"
    hub = parse_section("task", TaskConfig, {"kind": "dataset", "dataset": {"path": "openai/gsm8k", "name": "main"}})
    assert hub.data_dependency == NO_DATA_DEPENDENCY  # a Hub id: nothing local to watch
    with pytest.raises(ConfigError, match="dataset: required for kind dataset"):
        parse_section("task", TaskConfig, {"kind": "dataset"})
    with pytest.raises(ConfigError, match="data_dependency: must be 'examples/gsm8k'"):
        parse_section("task", TaskConfig, {"kind": "dataset", "dataset": dataset})
    with pytest.raises(ConfigError, match="answer_format must be answer_line"):
        parse_section("task", TaskConfig, {"answer_format": "boxed"})
    with pytest.raises(ConfigError, match="must be null for kind cof"):
        parse_section("task", TaskConfig, {"dataset": dataset})


def test_an_answer_line_inside_a_paragraph_ends_it_and_a_different_stated_answer_gets_the_gold_ending():
    para = Task("dataset", "answer_line", "exact", "paragraph")
    text = "First 2 + 3 = 5.\n\nSo it is 5.\nAnswer: 5\n\nmore"
    assert para.steps(text) == ["First 2 + 3 = 5.", "So it is 5. Answer: 5"]
    assert para.is_formatted(text.rsplit("\n\n", 1)[0])
    # A worked solution that states another answer than the gold one is not an SFT target as it is.
    assert BOXED.target("so $\\boxed{3}$.", "5") == "so $\\boxed{3}$.\n\nThe answer is \\boxed{5}."


def test_last_number_steps_state_answers_but_only_eos_ends_a_search_path():
    assert LAST.is_terminal("2 + 3 = 5") and not LAST.ends_path("2 + 3 = 5")
    assert GSM8K.ends_path("#### 5") and not GSM8K.ends_path("3 + 2 = 5")


def test_the_task_must_fit_the_prm_params():
    from pipeline.orchestration.checks import check_task_fit
    from pipeline.prm.params import PRMConfig

    dataset = TaskConfig(kind="dataset", dataset={"path": "openai/gsm8k"})
    with pytest.raises(ConfigError, match="prm.sources: gold labels need the chart task"):
        check_task_fit(dataset, prm=PRMConfig())
    check_task_fit(dataset, prm=PRMConfig(sources=["mc", "mcts"]))
    # paragraph steps serve every search: MCTS labels and PRM beam search and MCTS step one paragraph at a time
    check_task_fit(dataset.model_copy(update={"step_split": "paragraph"}), prm=PRMConfig(sources=["mc", "mcts"]))
    check_task_fit(TaskConfig(), PRMConfig())  # the chart task: all of it


def test_the_task_must_fit_the_rewards():
    """step_correctness would score nothing on a dataset task (no gold step values): refused, with what to set."""
    from pipeline.orchestration.checks import check_task_fit
    from pipeline.rl.params import RewardsConfig

    dataset = TaskConfig(kind="dataset", dataset={"path": "openai/gsm8k"})
    with pytest.raises(ConfigError, match=r"rewards.weights: step_correctness matches the chart task's gold step "
                                          r"values, .*: set rewards.weights: \{accuracy: 1.0, format: 0.1\}$"):
        check_task_fit(dataset, rewards=RewardsConfig())  # the default: accuracy 1.0, format 0.1, step_correctness
    with pytest.raises(ConfigError, match=r"set rewards.weights: \{accuracy: 1.0\}$"):
        check_task_fit(dataset, rewards=RewardsConfig(weights={"step_correctness": 1.0}))
    check_task_fit(dataset, rewards=RewardsConfig(weights={"accuracy": 1.0, "rule_shaping": 0.5}))
    check_task_fit(TaskConfig(), rewards=RewardsConfig())


def test_a_local_dataset_that_is_not_there_fails_validation(tmp_path, monkeypatch):
    """DVC watches a local dataset (task.data_dependency): missing, `dvc repro` would fail on it after deleting
    the data stage's outputs, so validation names it first. A Hub id is not a path, and a present one passes."""
    from pipeline.data.params import data_dependency_for
    from pipeline.orchestration.checks import check_task_fit
    from pipeline.prm.params import PRMConfig

    def task(path: str) -> TaskConfig:
        return TaskConfig(kind="dataset", dataset={"path": path}, data_dependency=data_dependency_for(path))

    mc = PRMConfig(sources=["mc", "mcts"])
    (tmp_path / "examples").mkdir()
    monkeypatch.chdir(tmp_path)
    # a mistyped folder under one that exists, and a path no Hub id can be (two /), are local: named at once,
    # not looked up on the Hub (half a minute of retries offline, then "not loadable from the Hub")
    for path in (str(tmp_path / "absent"), "./absent", "absent.jsonl", "examples/gsm8kk", "data/my/set"):
        with pytest.raises(ConfigError, match=rf"task.dataset.path: {path}: no such file or folder"):
            check_task_fit(task(path), prm=mc)
    (tmp_path / "there.jsonl").write_text("")
    check_task_fit(task(str(tmp_path / "there.jsonl")), prm=mc)
    check_task_fit(task("openai/gsm8k"), prm=mc)  # no folder openai/ here: a Hub id
    check_task_fit(task("gsm8k"), prm=mc)
