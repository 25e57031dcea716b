"""The GRPO reward library on hand-computed cases, garbage completions, pickling and TRL's call convention."""

import math
import pickle
import sys

import pytest

from pipeline.core.io import ConfigError
from pipeline.core.params import parse_section
from pipeline.rl.params import RewardsConfig
from pipeline.rl.rewards import REWARDS, build_rewards, total_reward

GOOD = "Step 1: Select the 2019 point: 2019 16.\nStep 2: Its value is 16.\nStep 3: 2 * 16 = 32.\nAnswer: 32"
STEPS = ["2019 16", "16", "32"]
# Steps 1 and 2 right, step 3 and the answer wrong (|30 - 32| / 32 = 6.25% > 5%).
WRONG_END = "Step 1: Select the 2019 point: 2019 16.\nStep 2: Its value is 16.\nStep 3: 2 * 15 = 30.\nAnswer: 30"
BINARY = "Step 1: Select all bars: Apple 3, Kiwi 5.\nStep 2: Increasing from left to right: Yes.\nAnswer: Yes"
BINARY_STEPS = ["Apple 3, Kiwi 5", "Yes"]
LONG = " ".join(["word"] * 5000)  # 5000 words, no answer line; every 3-gram is "word word word"
GARBAGE = ["", None, "@@@ ###", "no answer line here", 12345, {"weird": 1}, [], [{"role": "assistant"}], LONG]
NUMBER_GOLD = {"answer": "32", "answer_type": "number", "step_values": STEPS}
BAD_GOLDS = [  # golds that cannot be graded: every reward that needs the answer says None, never 1.0
    {"answer": "abc", "answer_type": "number"},
    {"answer": "", "answer_type": "text"},
    {"answer": "  ", "answer_type": "text"},
    {"answer": "maybe", "answer_type": "binary"},
    {"answer": "32", "answer_type": "date"},
    {"answer": None, "answer_type": "number"},
    {"answer_type": "number"},  # no answer column
    {"answer": "32"},  # no answer_type column
]
GOLD_REWARDS = ["accuracy", "dpa", "rule_shaping", "cosine", "no_thinking"]
ALWAYS_SCORED = ["format", "repetition", "overlong"]


def score(name: str, completion: object, cfg: RewardsConfig | None = None, **row: object) -> float | None:
    """One reward on one completion; each row value becomes a one-row column as TRL passes it."""
    reward = REWARDS[name](cfg or RewardsConfig())
    return reward(prompts=["q"], completions=[completion], **{k: [v] for k, v in row.items()})[0]


def check(actual: float | None, expected: float | None) -> None:
    if expected is None:
        assert actual is None
    else:
        assert isinstance(actual, float) and actual == pytest.approx(expected)


@pytest.mark.parametrize(
    "completion, answer, answer_type, expected",
    [
        (GOOD, "32", "number", 1.0),
        ("Answer: 33", "32", "number", 1.0),  # |33 - 32| / 32 = 3.1% <= 5%
        ("Answer: 34", "32", "number", 0.0),  # 6.25% > 5%
        ("Answer: 1,000", "1000", "number", 1.0),
        ("Answer: 1\nAnswer: 32", "32", "number", 1.0),  # the last answer line counts
        ("Answer: yes", "Yes", "binary", 1.0),
        ("Answer: No", "Yes", "binary", 0.0),
        ("Answer: Pink.", "pink", "text", 1.0),
        ("32", "32", "number", 0.0),  # no answer line
        ("", "32", "number", 0.0),
        (None, "32", "number", 0.0),
        ("@@@ ###", "32", "number", 0.0),
        (LONG, "32", "number", 0.0),
    ],
)
def test_accuracy(completion, answer, answer_type, expected):
    check(score("accuracy", completion, answer=answer, answer_type=answer_type), expected)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (GOOD, 1.0),
        ("Step 1: 3 + 4 = 7.\nAnswer: 7", 1.0),
        ("  Step 1: a.\n\n  Step 2: b.\n\nAnswer: x  \n\n", 1.0),  # blank lines and indentation are fine
        ("Answer: 32", 0.0),  # no steps
        ("Step 1: a.\nStep 3: b.\nAnswer: 1", 0.0),  # step 2 skipped
        ("Step 2: a.\nAnswer: 1", 0.0),  # does not start at 1
        ("Step 01: a.\nAnswer: 1", 0.0),
        ("Step 1:\nAnswer: 1", 0.0),  # empty step
        ("Step 1: a.\nAnswer:  ", 0.0),  # empty answer
        ("Step 1: a.", 0.0),  # no answer line
        ("Step 1: a.\nAnswer: 1\nAnswer: 1", 0.0),  # two answer lines
        ("Step 1: a.\nAnswer: 1\nHope that helps", 0.0),  # text after the answer
        ("Let me think.\nStep 1: a.\nAnswer: 1", 0.0),  # text before the steps
        ("Step 1: a.\nAnswer: 1\nStep 2: b.", 0.0),  # a step after the answer
        ("", 0.0),
        (None, 0.0),
        ("@@@ ###", 0.0),
        (LONG, 0.0),
    ],
)
def test_format(completion, expected):
    check(score("format", completion), expected)  # no gold columns at all: format needs none


@pytest.mark.parametrize(
    "completion, step_values, expected",
    [
        (GOOD, STEPS, 1.0),  # 3 of 3
        (WRONG_END, STEPS, 2 / 3),
        ("Step 1: Select the 2019 point: 2019 16.\nAnswer: 32", STEPS, 1 / 3),  # missing steps count as wrong
        ("Answer: 32", STEPS, 0.0),
        ("", STEPS, 0.0),
        (None, STEPS, 0.0),
        ("@@@ ###", STEPS, 0.0),
        (LONG, STEPS, 0.0),
        (GOOD, [], None),  # nothing to check
        (GOOD, None, None),
        (GOOD, "16", None),  # a str is not a list of values
        (GOOD, ["2019 16", None, "32"], None),  # a broken gold step
        (GOOD, ["2019 16", " ", "32"], None),
    ],
)
def test_step_correctness(completion, step_values, expected):
    check(score("step_correctness", completion, step_values=step_values), expected)


def test_step_correctness_without_the_column_is_none():
    check(score("step_correctness", GOOD, answer="32", answer_type="number"), None)


@pytest.mark.parametrize(
    "completion, answer, answer_type, expected",
    [
        # one part: exactly accuracy
        (GOOD, "32", "number", 1.0),
        ("Answer: 34", "32", "number", 0.0),
        ("Answer: 32, 32", "32", "number", 0.0),  # as accuracy: "32, 32" is not a number
        ("Answer: 1234", "1,234", "number", 1.0),  # a number gold is one part, not "1" and "234"
        ("Answer: Yes", "Yes", "binary", 1.0),
        # G = {Apple, Kiwi, Pear}
        ("Answer: Apple, Kiwi, Pear", "Apple, Kiwi, Pear", "text", 1.0),
        ("Answer: pear, apple", "Apple, Kiwi, Pear", "text", 2 / 3),  # P ⊆ G, 2 of 3
        ("Answer: Apple", "Apple, Kiwi, Pear", "text", 1 / 3),
        ("Answer: Apple, Apple", "Apple, Kiwi, Pear", "text", 1 / 3),  # P is a set
        ("Answer: Apple, Mango", "Apple, Kiwi, Pear", "text", 0.0),  # Mango is outside G
        ("Answer: Apple, Kiwi, Pear, Mango", "Apple, Kiwi, Pear", "text", 0.0),
        ("Answer: ", "Apple, Kiwi, Pear", "text", 0.0),  # P empty: 0 / 3
        ("Apple, Kiwi, Pear", "Apple, Kiwi, Pear", "text", 0.0),  # no answer line
        # a numeric element grades as a number: |15.5 - 15| / 15 = 3.3% <= 5%
        ("Answer: 15.5, kiwi", "Kiwi, 15", "text", 1.0),
        ("", "Kiwi, 15", "text", 0.0),
        (None, "Kiwi, 15", "text", 0.0),
        ("@@@ ###", "Kiwi, 15", "text", 0.0),
        (LONG, "Kiwi, 15", "text", 0.0),
    ],
)
def test_dpa(completion, answer, answer_type, expected):
    check(score("dpa", completion, answer=answer, answer_type=answer_type), expected)


@pytest.mark.parametrize(
    "completion, row, expected",
    [
        (GOOD, NUMBER_GOLD, 1.5),  # gate 1 · (1 + 3 · 0.5/3)
        (WRONG_END, NUMBER_GOLD, 1 / 3),  # 0 + 2 · 0.5/3
        ("Answer: 32", NUMBER_GOLD, 0.0),  # right answer, format broken: gate 0
        (GOOD.replace("Answer: 32", "Answer: thirty-two"), NUMBER_GOLD, 0.0),  # not a number: rule broken
        (GOOD, {"answer": "32", "answer_type": "number"}, 1.0),  # no step values: gate · accuracy
        (GOOD, {**NUMBER_GOLD, "step_values": []}, 1.0),
        (BINARY, {"answer": "Yes", "answer_type": "binary", "step_values": BINARY_STEPS}, 1.5),  # 1 + 2 · 0.25
        (BINARY.replace("Answer: Yes", "Answer: No"), {"answer": "Yes", "answer_type": "binary",
                                                         "step_values": BINARY_STEPS}, 0.5),  # 0 + 2 · 0.25
        (BINARY.replace("Answer: Yes", "Answer: maybe"), {"answer": "Yes", "answer_type": "binary",
                                                            "step_values": BINARY_STEPS}, 0.0),  # not yes/no
        ("Step 1: Select the Lions slice: Lions 20.\nStep 2: Its colour is pink.\nAnswer: pink",
         {"answer": "pink", "answer_type": "text", "step_values": ["Lions 20", "pink"]}, 1.5),  # no rule for text
        ("", NUMBER_GOLD, 0.0),
        (None, NUMBER_GOLD, 0.0),
        ("@@@ ###", NUMBER_GOLD, 0.0),
        (LONG, NUMBER_GOLD, 0.0),
    ],
)
def test_rule_shaping(completion, row, expected):
    check(score("rule_shaping", completion, **row), expected)


def test_rule_shaping_step_weight_is_split_over_steps():
    cfg = RewardsConfig(rule_step_weight=0.9)
    check(score("rule_shaping", GOOD, cfg, **NUMBER_GOLD), 1.9)  # 1 + 3 · 0.3
    check(score("rule_shaping", WRONG_END, cfg, **NUMBER_GOLD), 0.6)  # 0 + 2 · 0.3


@pytest.mark.parametrize(
    "completion, length, expected",
    [
        # defaults: max_len 128; correct 1.0 at length 0 -> 0.5 at 128; wrong -1.0 at 0 -> -0.5 at 128
        ("Answer: 32", 0, 1.0),  # cos 0 = 1: hi
        ("Answer: 32", 64, 0.75),  # cos(π/2) = 0: the midpoint 0.5 + 0.25
        ("Answer: 32", 128, 0.5),  # cos π = -1: lo
        ("Answer: 32", 1000, 0.5),  # progress is capped at 1
        ("Answer: 34", 0, -1.0),  # a short wrong answer is penalised most
        ("Answer: 34", 64, -0.75),
        ("Answer: 34", 128, -0.5),
        ("Answer: 34", 1000, -0.5),
        # no completion_ids: length in words; 30 + 2 = 32 words, progress 1/4:
        # 0.5 + 0.25 · (1 + cos(π/4)) = 0.5 + 0.25 · 1.70710678 = 0.92677670
        (" ".join(["w"] * 30) + "\nAnswer: 32", None, 0.9267767),
        ("", None, -1.0),  # 0 words, wrong
        (None, None, -1.0),
        (LONG, None, -0.5),  # 5000 words, wrong, capped
    ],
)
def test_cosine(completion, length, expected):
    ids = {} if length is None else {"completion_ids": [7] * length}
    check(score("cosine", completion, answer="32", answer_type="number", **ids), expected)


def test_cosine_uses_its_options():
    cfg = RewardsConfig(cosine_max_len=10, cosine_min_correct=0.0, cosine_max_correct=2.0)
    check(score("cosine", "Answer: 32", cfg, answer="32", answer_type="number", completion_ids=[1] * 5), 1.0)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("a b c d", 0.0),  # 3-grams abc, bcd: 2 unique of 2
        ("a a a a", -0.5),  # aaa, aaa: 1 unique of 2
        ("the cat the cat the cat", -0.5),  # tct, ctc, tct, ctc: 2 of 4
        ("A b c a B C", -0.25),  # lower-cased: abc, bca, cab, abc: 3 of 4
        ("a b", 0.0),  # fewer words than n
        ("", 0.0),
        (None, 0.0),
        ("@@@ ###", 0.0),
        (LONG, -(1 - 1 / 4998)),  # 4998 3-grams, 1 unique
    ],
)
def test_repetition(completion, expected):
    check(score("repetition", completion), expected)


def test_repetition_uses_its_options():
    cfg = RewardsConfig(repetition_ngram=2, repetition_max_penalty=-0.5)
    check(score("repetition", "a a a a", cfg), -1 / 3)  # aa × 3: (1 - 1/3) · -0.5


@pytest.mark.parametrize(
    "length, expected",
    [
        # defaults: L = 160, c = 32, so no penalty up to 128 tokens
        (0, 0.0),
        (128, 0.0),
        (129, -0.03125),  # (128 - 129) / 32
        (144, -0.5),  # (128 - 144) / 32
        (160, -1.0),
        (161, -1.0),
        (5000, -1.0),
    ],
)
def test_overlong(length, expected):
    check(score("overlong", GOOD, completion_ids=[3] * length), expected)


@pytest.mark.parametrize(
    "completion, cfg, expected",
    [
        (LONG, RewardsConfig(), -1.0),  # no completion_ids: 5000 words > 160
        (None, RewardsConfig(), 0.0),
        (" ".join(["w"] * 8), RewardsConfig(overlong_max_len=10, overlong_buffer=4), -0.5),  # (6 - 8) / 4
    ],
)
def test_overlong_counts_words_without_ids(completion, cfg, expected):
    check(score("overlong", completion, cfg), expected)


@pytest.mark.parametrize(
    "completion, answer, answer_type, expected",
    [
        ("32", "32", "number", 1.0),
        ("  32 \n", "32", "number", 1.0),
        ("32.", "32", "number", 1.0),
        ("yes", "Yes", "binary", 1.0),
        ("Pink", "pink", "text", 1.0),
        ("Answer: 32", "32", "number", 0.0),  # anything beyond the answer is "thinking"
        (GOOD, "32", "number", 0.0),
        ("", "32", "number", 0.0),
        (None, "32", "number", 0.0),
        ("@@@ ###", "32", "number", 0.0),
        (LONG, "32", "number", 0.0),
    ],
)
def test_no_thinking(completion, answer, answer_type, expected):
    check(score("no_thinking", completion, answer=answer, answer_type=answer_type), expected)


@pytest.mark.parametrize("gold", BAD_GOLDS)
@pytest.mark.parametrize("name", GOLD_REWARDS)
def test_unparseable_gold_is_none_never_credit(name, gold):
    check(score(name, GOOD, step_values=STEPS, **gold), None)


@pytest.mark.parametrize("name", ALWAYS_SCORED)
def test_rewards_without_gold_are_never_none(name):
    for gold in BAD_GOLDS:
        assert isinstance(score(name, GOOD, **gold), float)


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_garbage_never_raises(name):
    reward = REWARDS[name](RewardsConfig())
    huge = "Step 1: x = 1.\n" * 20000 + "Answer: 1"
    completions = [*GARBAGE, huge]
    n = len(completions)
    out = reward(prompts=["q"] * n, completions=completions, answer=["32"] * n, answer_type=["number"] * n,
                 step_values=[STEPS] * n)
    assert len(out) == n and all(isinstance(r, float) for r in out)  # the gold is fine: every row has a number
    # columns that are missing, too short or of the wrong shape give None or a number, never an exception
    for columns in [{}, {"answer": ["32"]}, {"answer": "32", "step_values": "16"}, {"completion_ids": [None]}]:
        assert len(reward(completions=completions, **columns)) == n


@pytest.mark.parametrize(
    "completion",
    [
        [{"role": "assistant", "content": GOOD}],
        [{"role": "user", "content": "Answer: 7"}, {"role": "assistant", "content": GOOD}],  # the last message
        [{"role": "assistant", "content": [{"type": "text", "text": GOOD}]}],  # content parts
    ],
)
def test_conversational_completions(completion):
    check(score("accuracy", completion, answer="32", answer_type="number"), 1.0)
    check(score("format", completion), 1.0)
    check(score("rule_shaping", completion, **NUMBER_GOLD), 1.5)


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_rewards_pickle_and_are_named(name):
    reward = REWARDS[name](RewardsConfig(cosine_max_len=64))
    copy = pickle.loads(pickle.dumps(reward))
    assert reward.__name__ == copy.__name__ == name
    columns = {"completion_ids": [[1] * 40, [1] * 3], **{k: [v, v] for k, v in NUMBER_GOLD.items()}}
    assert copy(completions=[GOOD, "Answer: 7"], **columns) == reward(completions=[GOOD, "Answer: 7"], **columns)
    assert copy.options.cosine_max_len == 64


def test_registry_names_match_the_params_schema():
    assert set(REWARDS) == set(RewardsConfig.model_fields["weights"].annotation.__args__[0].__args__)


def test_build_rewards_keeps_the_params_order_and_options():
    cfg = RewardsConfig(weights={"overlong": 0.25, "accuracy": 1, "format": -0.5}, overlong_max_len=10,
                        overlong_buffer=4)
    funcs, weights = build_rewards(cfg)
    assert [f.__name__ for f in funcs] == ["overlong", "accuracy", "format"]
    assert weights == [0.25, 1.0, -0.5] and all(type(w) is float for w in weights)
    assert funcs[0](completions=["x"], completion_ids=[[1] * 8]) == [-0.5]  # (6 - 8) / 4: the options arrived


def test_total_reward_is_the_weighted_sum_skipping_none():
    cfg = RewardsConfig(weights={"accuracy": 1.0, "format": 0.1, "step_correctness": 0.5})
    out = total_reward(
        cfg,
        [GOOD, GOOD, GOOD, "", WRONG_END],
        answer=["32", "32", "abc", "32", "32"],
        answer_type=["number"] * 5,
        step_values=[STEPS, [], [], STEPS, STEPS],
    )
    expected = [
        1.6,  # 1 + 0.1 + 0.5
        1.1,  # step_correctness None is skipped
        0.1,  # accuracy and step_correctness None: format alone
        0.0,
        0.1 + 0.5 * 2 / 3,  # wrong answer, formatted, 2 of 3 steps
    ]
    assert out == pytest.approx(expected)


def test_total_reward_is_none_when_every_term_is_none():
    cfg = RewardsConfig(weights={"accuracy": 1.0, "no_thinking": 1.0})
    assert total_reward(cfg, [GOOD, "32"], answer=["abc", "32"], answer_type=["number", "number"]) == [None, 1.0]


def test_trl_grpo_reward_call_convention():
    # GRPOTrainer._calculate_rewards calls reward_func(prompts=, completions=, completion_ids=, **reward_kwargs), where
    # reward_kwargs are every dataset column as a list plus trainer_state, log_extra and log_metric; it names each
    # reward by getattr(f, "__name__", type(f).__name__) (trl.trainer.utils.get_callable_name). Importing trl takes
    # ~10 s, so the convention is replayed here rather than imported.
    cfg = RewardsConfig(weights={name: 1.0 for name in REWARDS})
    funcs, _ = build_rewards(cfg)
    prompts = [[{"role": "user", "content": "Chart ... What is twice the 2019 value?"}]] * 2
    completions = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": "Answer: 7"}]]
    expected = {
        "accuracy": [1.0, 0.0],
        "format": [1.0, 0.0],
        "step_correctness": [1.0, None],  # the second row has no step values
        "dpa": [1.0, 0.0],
        "rule_shaping": [1.5, 0.0],
        "cosine": [0.75, -1.0],  # 64 of 128 tokens, correct; 0 tokens, wrong
        "repetition": [0.0, 0.0],  # every 3-gram of GOOD is distinct; 2 words < 3
        "overlong": [0.0, 0.0],
        "no_thinking": [0.0, 0.0],
    }
    for f in funcs:
        name = getattr(f, "__name__", type(f).__name__)
        out = f(
            prompts=prompts, completions=completions, completion_ids=[[5] * 64, []], trainer_state=None,
            log_extra=lambda *a: None, log_metric=lambda *a: None, answer=["32", "32"],
            answer_type=["number", "number"], step_values=[STEPS, []], rationale=[GOOD, GOOD], id=["t-0", "t-1"],
        )
        assert len(out) == len(prompts)
        # TRL turns None into NaN before its nansum; everything else must be a real number
        assert all(r is None or (isinstance(r, float) and math.isfinite(r)) for r in out), name
        assert out == pytest.approx(expected[name]), name


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"weights": {"acuracy": 1.0}}, "rewards.weights.acuracy"),
        ({"weights": {"accuracy": "high"}}, "rewards.weights.accuracy"),
        ({"weights": {"accuracy": True}}, "rewards.weights.accuracy"),
        ({"weights": {"accuracy": "0.5"}}, "rewards.weights.accuracy"),  # a number written as a string
        ({"cosine_max_length": 64}, "rewards.cosine_max_length: unknown key"),
    ],
)
def test_bad_rewards_params_name_the_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_section("rewards", RewardsConfig, raw)


def test_a_custom_reward_joins_the_weighted_sum_under_its_name():
    cfg = RewardsConfig(weights={"accuracy": 1.0},
                        custom={"brevity": {"function": "rewards.example:brevity", "weight": 0.5}})
    funcs, weights = build_rewards(cfg)
    assert [f.__name__ for f in funcs] == ["accuracy", "brevity"] and weights == [1.0, 0.5]
    # 7 words: brevity 1 - 7/60; the right answer: accuracy 1 -> 1 + 0.5 * (1 - 7/60)
    completion = "Step 1: x is 4.\nAnswer: 4"
    assert total_reward(cfg, [completion], answer=["4"], answer_type=["number"]) == \
        [pytest.approx(1 + 0.5 * (1 - 7 / 60))]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("rewards.example:nope", "rewards.example has no function nope"),
        ("rewards.absent:f", "cannot import rewards.absent"),
        ("os:getcwd", "must be in the repository's rewards/ package"),
        ("brevity", "write it as module:function"),
    ],
)
def test_a_bad_custom_reward_spec_is_named_at_params_validation(spec, message):
    with pytest.raises(ConfigError, match=r"rewards\.custom\.mine.*") as caught:
        parse_section("rewards", RewardsConfig, {"custom": {"mine": {"function": spec, "weight": 1.0}}})
    assert message in str(caught.value)


def test_a_custom_reward_that_cannot_take_trls_keywords_is_named_at_params_validation(monkeypatch):
    import types

    module = types.ModuleType("rewards.signatures")
    module.positional = lambda completions, answer: [0.0]
    module.keywords = lambda prompts=None, completions=None, **columns: [0.0]
    monkeypatch.setitem(sys.modules, "rewards.signatures", module)
    with pytest.raises(ConfigError, match=r"rewards\.custom\.mine.*'rewards.signatures:positional': "
                                          r"positional\(completions, answer\) cannot take TRL's reward arguments"):
        parse_section("rewards", RewardsConfig, {"custom": {"mine": {"function": "rewards.signatures:positional",
                                                                      "weight": 1.0}}})
    parse_section("rewards", RewardsConfig, {"custom": {"mine": {"function": "rewards.signatures:keywords",
                                                                  "weight": 1.0}}})


def test_a_custom_reward_may_not_take_a_built_in_name():
    with pytest.raises(ConfigError, match="accuracy: also a built-in reward name"):
        parse_section("rewards", RewardsConfig, {"custom": {"accuracy": {"function": "rewards.example:brevity",
                                                                          "weight": 1.0}}})
