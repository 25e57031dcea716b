"""Monte-Carlo step labels (pipeline/prm/step_labels.py) on a scripted policy, and the sampler on a tiny model."""

from __future__ import annotations

import pytest

from pipeline.data.answers import extract
from pipeline.prm.step_labels import monte_carlo_labels, step_prefix

PROMPT = "Tom has 3 bags of 4 apples and eats 2. How many apples?\n"
GOOD = ["3 * 4 = 12 apples.", "12 - 2 = 10 apples.", "#### 10"]
BAD = ["3 + 4 = 7 apples.", "7 - 2 = 5 apples.", "#### 5"]


def reward(i: int, completion: str) -> float:
    return float(extract(completion, "gsm8k") == "10")


def scripted(prefixes, n):
    """After a right first step, 3 of 4 rollouts reach 10; after a wrong one, none; after two right, all."""
    out = []
    for prefix in prefixes:
        if "12 - 2 = 10" in prefix:
            rests = ["#### 10"] * n
        elif "3 * 4 = 12" in prefix:
            rests = (["12 - 2 = 10.\n#### 10"] * 3 + ["12 + 2 = 14.\n#### 14"])[:n]
        else:
            rests = ["#### 5"] * n
        out.append(rests)
    return out


def test_labels_are_the_share_of_rollouts_that_reach_the_answer():
    calls = []

    def sample(prefixes, n):
        calls.append((list(prefixes), n))
        return scripted(prefixes, n)

    labels = monte_carlo_labels([PROMPT, PROMPT], [GOOD, BAD], sample, reward, rollouts=4)
    assert labels == [[0.75, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # one batched call; no rollouts for a last step (its path holds the answer)
    assert len(calls) == 1 and calls[0][1] == 4
    assert calls[0][0] == [step_prefix(PROMPT, GOOD, 0), step_prefix(PROMPT, GOOD, 1),
                           step_prefix(PROMPT, BAD, 0), step_prefix(PROMPT, BAD, 1)]
    assert calls[0][0][1] == PROMPT + "3 * 4 = 12 apples.\n12 - 2 = 10 apples.\n"


def test_a_one_step_path_needs_no_rollouts_and_zero_rollouts_are_refused():
    def never(prefixes, n):
        assert not prefixes
        return []

    assert monte_carlo_labels([PROMPT], [["#### 10"]], never, reward, rollouts=2) == [[1.0]]
    assert monte_carlo_labels([PROMPT], [[]], never, reward, rollouts=2) == [[]]
    with pytest.raises(ValueError, match="rollouts"):
        monte_carlo_labels([PROMPT], [GOOD], scripted, reward, rollouts=0)


def test_the_step_policy_samples_n_reproducible_continuations():
    import torch

    from pipeline.evaluation.search import StepPolicy
    from pipeline.modeling.models import build_student, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    texts = [f"{a} + {b} = {a + b}\n#### {a + b}" for a in range(10) for b in range(10)]
    tok = train_tokenizer(texts, 200)
    cfg = BaseModelConfig(seed=0, vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    torch.manual_seed(0)
    model = build_student(cfg, tok)
    policy = StepPolicy(model, tok, completion_tokens=8, temperature=0.8, seed=3)
    first = policy.sample(["1 + 2 = ", "4 + 4 = "], 3)
    again = StepPolicy(model, tok, completion_tokens=8, temperature=0.8, seed=3).sample(["1 + 2 = ", "4 + 4 = "], 3)
    assert [len(rests) for rests in first] == [3, 3] and first == again
    assert policy.tokens > 0
    assert all(isinstance(text, str) for rests in first for text in rests)


def test_paragraph_steps_are_continued_after_a_blank_line():
    seen = []

    def sample(prefixes, n):
        seen.extend(prefixes)
        return [["#### 3"] * n for _ in prefixes]

    def reward(i, text):
        return float(text.endswith("#### 3"))

    labels = monte_carlo_labels(["Q\n"], [["a b", "c d", "#### 3"]], sample, reward, rollouts=2, step_break="\n\n")
    assert seen == ["Q\na b\n\n", "Q\na b\n\nc d\n\n"]
    assert labels == [[1.0, 1.0, 1.0]]
