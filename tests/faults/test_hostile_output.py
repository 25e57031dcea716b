"""No code runs from data, and hostile model output is graded in bounded time by every grader and reward.

Each case is a completion a broken or adversarial policy can write. The bound is pytest-timeout's (a hang
fails the test); a quadratic scan once took 9 minutes on the unclosed `\\boxed{` case.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.data import answers, grading
from pipeline.data.answers import ANSWER_FORMATS, GRADERS
from pipeline.rl.params import RewardsConfig
from pipeline.rl.rewards import REWARDS, build_rewards

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = {
    "a 1 MB line": "x" * (1 << 20),
    "a 200,000-digit number": "Step 1: 2 = " + "9" * 200_000 + "\nAnswer: " + "9" * 200_000,
    "deeply nested brackets": "\\boxed{" + "{" * 100_000 + "(" * 100_000 + "}" * 100_000,
    "control characters": "Step 1: \x00\x1b[2J\x07\r\x0b x = 3\nAnswer: \x00 3\x1b\x7f",
    "a \\boxed{ that never closes": "\\boxed{" * 50_000 + "12",
    "an answer that never ends": "The answer is \\boxed{12" + " 3" * 300_000,
    "thousands of commas": "Answer: " + "1," * 200_000 + "1",
    "a 200,000-digit GSM8K answer": "#### " + "1" * 200_000,
    "unclosed think tags": "<think>" * 100_000 + "Answer: 3",
    "100,000 steps": "Step 1: a = 1\n" * 100_000 + "Answer: 1",
    "separators only": " is " * 200_000,
}
GOLD = {"number": "12", "text": "red", "binary": "Yes"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_every_extractor_and_grader_answers_hostile_output(case):
    text = HOSTILE[case]
    for answer_format, pattern in [*((f, None) for f in ANSWER_FORMATS), ("answer_line", r"answer is (\S+)")]:
        prediction = answers.extract(text, answer_format, pattern)
        assert prediction is None or isinstance(prediction, str)
        for grader in GRADERS:
            for answer_type, gold in GOLD.items():
                graded = answers.grade_with(grader, prediction if prediction is not None else text, gold, answer_type)
                assert isinstance(graded, bool)
    assert grading.grade(grading.extract_answer(text), "12", "number") in (True, False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_every_reward_scores_hostile_output(case):
    cfg = RewardsConfig(weights={name: 1.0 for name in REWARDS})
    funcs, _ = build_rewards(cfg)
    columns = {"answer": ["12"], "answer_type": ["number"], "step_values": [["3", "12"]]}
    for reward in funcs:
        scores = reward(prompts=["q"], completions=[HOSTILE[case]], **columns)
        assert len(scores) == 1 and (scores[0] is None or isinstance(scores[0], float))


def test_a_huge_number_is_not_a_right_answer():
    assert not answers.grade_with("exact", "9" * 200_000, "9" * 200_000 + "1", "number")
    assert grading.parse_number("9" * 200_000) is None  # overflows to infinity: not a number a grader compares


def sources() -> list[Path]:
    return sorted(p for folder in ("pipeline", "stages") for p in (ROOT / folder).rglob("*.py"))


def test_no_grader_or_reward_evaluates_text():
    """No eval/exec/compile of strings and no pickle anywhere in the project's code."""
    for path in sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "compile"), f"{path}:{node.lineno}: {node.func.id}()"
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "dill", "cloudpickle", "marshal"} & set(names), f"{path}:{node.lineno}"


def test_weights_load_through_safetensors_and_remote_code_stays_off():
    """Every `torch.load` reads tensors only; model folders are written as safetensors; trust_remote_code is
    never switched on by the project's code."""
    for path in sources():
        text = path.read_text()
        for match in re.finditer(r"torch\.load\(([^)]*)\)", text):
            assert "weights_only=True" in match.group(1), f"{path}: torch.load without weights_only=True"
        assert not re.search(r"trust_remote_code\s*=\s*True", text), f"{path}: trust_remote_code=True"
    from pipeline.modeling.models import load_kwargs

    assert load_kwargs()["use_safetensors"] is True and load_kwargs()["trust_remote_code"] is False


def test_a_pickled_checkpoint_is_refused(tmp_path):
    """A model folder whose weights are a pickle (pytorch_model.bin) does not load: the error names the folder."""
    import torch

    from pipeline.core.io import InputError
    from pipeline.modeling.models import build_student, load_model, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    tokenizer = train_tokenizer(["Step 1: 1 + 1 = 2\nAnswer: 2"] * 4, 100)
    model = build_student(BaseModelConfig(seed=0, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=100), tokenizer)
    save_model(model, tokenizer, tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    load_model(tmp_path)  # loads as saved
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(InputError, match=str(tmp_path)):
        load_model(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing"])
def test_a_damaged_checkpoint_fails_naming_its_folder(tmp_path, damage):
    """A model folder whose weights are cut short, overwritten or gone: InputError (exit 2 in a stage) naming it."""
    from pipeline.core.io import InputError
    from pipeline.modeling.models import build_student, load_model, save_model, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    tokenizer = train_tokenizer(["Step 1: 1 + 1 = 2\nAnswer: 2"] * 4, 100)
    model = build_student(BaseModelConfig(seed=0, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=100), tokenizer)
    save_model(model, tokenizer, tmp_path)
    weights = tmp_path / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"not a checkpoint" * 64)
    else:
        weights.unlink()
    with pytest.raises(InputError, match=f"{tmp_path}: cannot load model"):
        load_model(tmp_path)
