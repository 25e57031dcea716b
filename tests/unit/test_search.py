"""Step-level search and decoding strategies with a scripted policy and a scripted PRM (no model)."""

from __future__ import annotations

import math

import pytest

from pipeline.evaluation.decoding import (
    Decoder,
    ceilings,
    faithfulness_probes,
    inconsistency,
    paired_difference,
    reversed_trend,
    swapped,
)
from pipeline.evaluation.params import DecodingConfig
from pipeline.evaluation.search import (
    Line,
    Node,
    backpropagate,
    beam_search,
    best_terminal,
    mcts,
    newline_ids,
    prefix,
    prm_mcts,
    select,
    tree_paths,
    ucb,
)

PROMPT = "Question: what?\n"


class ScriptedPolicy:
    """next_lines returns the scripted children of a path in turn (cycling); complete appends a fixed answer."""

    def __init__(self, tree: dict[tuple, list[str]], rest: str = "Answer: 0") -> None:
        self.tree, self.rest, self.tokens, self.calls = tree, rest, 0, []

    def render(self, prompt):
        return prompt  # raw prompts: StepPolicy.render with prompt.format raw

    def next_lines(self, prefixes, n):
        out = []
        for p in prefixes:
            path = tuple(line for line in p[len(PROMPT):].split("\n") if line)
            options = self.tree.get(path, ["Answer: 0"])
            self.calls.append((path, n))
            lines = [options[i % len(options)] for i in range(n)]
            self.tokens += 3 * n
            out.append([Line(t, 3, terminal=t.startswith("Answer:")) for t in lines])
        return out

    def complete(self, prefixes):
        self.tokens += len(prefixes)
        return [self.rest for _ in prefixes]


def table_scorer(values: dict[str, float]):
    """A PRM that scores each line from a lookup (0.5 for unknown lines)."""
    def score(prompts, paths):
        return [[values.get(line, 0.5) for line in path] for path in paths]
    return score


def test_ucb_prefers_unvisited_then_balances_value_and_visits():
    parent = Node(visits=10)
    fresh, good, tried = Node(parent=parent), Node(parent=parent, visits=5, total=4.0), Node(parent=parent, visits=1)
    assert ucb(fresh, 10, 1.0) == math.inf
    assert ucb(good, 10, 1.0) == pytest.approx(0.8 + math.sqrt(2 * math.log(10) / 5))
    assert ucb(tried, 10, 0.0) == 0.0
    parent.children = [good, tried]
    assert select(parent, 0.0) is good


def test_backpropagate_adds_a_visit_and_the_value_up_to_the_root():
    root = Node()
    child = Node(("a",), root)
    leaf = Node(("a", "b"), child)
    backpropagate(leaf, 1.0)
    backpropagate(child, 0.0)
    assert (root.visits, root.total, child.visits, child.q, leaf.q) == (2, 1.0, 2, 0.5, 1.0)
    assert [n.lines for n in leaf.path()] == [("a",), ("a", "b")]


def test_mcts_expands_dedups_and_labels_every_leaf_path():
    policy = ScriptedPolicy({(): ["Step 1: x is 1.", "Step 1: x is 2.", "Step 1: x is 1."],
                             ("Step 1: x is 1.",): ["Answer: 1"], ("Step 1: x is 2.",): ["Answer: 2"]})
    values = {"Answer: 1": 1.0, "Answer: 2": 0.0}

    def evaluate(owners, nodes):
        return [values.get(n.lines[-1], 0.5) for n in nodes]

    (root,) = mcts([PROMPT], policy, evaluate, iterations=3, children=3, c=1.0, max_steps=4)
    assert [c.lines for c in root.children] == [("Step 1: x is 1.",), ("Step 1: x is 2.",)]  # the duplicate merged
    paths = dict(tree_paths(root))
    assert paths[("Step 1: x is 1.", "Answer: 1")][1] == 1.0
    assert paths[("Step 1: x is 2.", "Answer: 2")][1] == 0.0
    assert best_terminal(root).lines == ("Step 1: x is 1.", "Answer: 1")


def test_max_steps_makes_a_path_terminal():
    policy = ScriptedPolicy({}, rest="")
    policy.tree = {(): ["Step 1: a."], ("Step 1: a.",): ["Step 2: b."]}
    (root,) = mcts([PROMPT], policy, lambda o, n: [0.5] * len(n), iterations=5, children=1, c=1.0, max_steps=2)
    assert max(len(n.lines) for n in root.walk()) == 2


def test_beam_search_keeps_the_candidates_the_prm_prefers():
    policy = ScriptedPolicy({(): ["Step 1: good.", "Step 1: bad."],
                             ("Step 1: good.",): ["Answer: 7", "Answer: 8"], ("Step 1: bad.",): ["Answer: 9"]})
    scorer = table_scorer({"Step 1: good.": 0.9, "Step 1: bad.": 0.2, "Answer: 7": 0.8, "Answer: 8": 0.3,
                           "Answer: 9": 0.99})
    (text,) = beam_search([PROMPT], policy, scorer, n=2, width=1, max_steps=4, how="min")
    assert text == "Step 1: good.\nAnswer: 7"  # "bad" was pruned at step 1 although its answer scores 0.99
    assert policy.calls[0] == ((), 2)  # the root gets all n candidates


def test_beam_search_ends_every_path_at_max_steps():
    policy = ScriptedPolicy({(): ["Step 1: a."], ("Step 1: a.",): ["Step 2: b."]})
    assert beam_search([PROMPT], policy, table_scorer({}), n=2, width=2, max_steps=1, how="last") == ["Step 1: a."]
    assert beam_search([PROMPT], policy, table_scorer({}), n=2, width=2, max_steps=2, how="last") == [
        "Step 1: a.\nStep 2: b."]


def test_prm_mcts_returns_the_terminal_path_with_the_best_mean_score():
    policy = ScriptedPolicy({(): ["Step 1: a.", "Step 1: b."], ("Step 1: a.",): ["Answer: 1"],
                             ("Step 1: b.",): ["Answer: 2"]})
    scorer = table_scorer({"Step 1: a.": 0.9, "Step 1: b.": 0.4, "Answer: 1": 0.5, "Answer: 2": 0.95})
    (text,) = prm_mcts([PROMPT], policy, scorer, iterations=4, children=2, c=1.0, max_steps=4)
    # means: a -> (0.9 + 0.5) / 2 = 0.7; b -> (0.4 + 0.95) / 2 = 0.675
    assert text == "Step 1: a.\nAnswer: 1"


def test_prefix_is_what_the_policy_wrote():
    assert prefix(PROMPT, ("Step 1: a.", "Step 2: b.")) == PROMPT + "Step 1: a.\nStep 2: b.\n"


ROWS = [{"id": str(i), "split": "test", "prompt": PROMPT, "answer": a, "answer_type": "number", "task_type": "t",
         "chain_length": 1, "steps": [{"function": "f", "text": "", "value": a}]} for i, a in enumerate(["1", "2"])]


class FixedScorer:
    """Scores a completion by its answer line from a lookup; counts tokens like the real scorer."""

    def __init__(self, by_answer):
        self.by_answer, self.tokens = by_answer, 0

    def score(self, prompts, paths):
        self.tokens += sum(len(p) for p in paths)
        return [[self.by_answer.get(p[-1], 0.1)] if p else [] for p in paths]


def test_decoder_maj_and_best_of_n_on_the_same_samples():
    cfg = DecodingConfig(strategies=["greedy", "maj_at_n", "prm_best_of_n"], n=3)
    samples = [[("Answer: 5", 2), ("Answer: 5", 2), ("Answer: 1", 2)],   # majority wrong, one right
               [("Answer: 2", 2), ("Answer: 7", 2), ("Answer: 7", 2)]]
    greedy = [("Answer: 1", 4), ("Answer: 3", 4)]
    scorer = FixedScorer({"Answer: 1": 0.9, "Answer: 2": 0.8, "Answer: 5": 0.2, "Answer: 7": 0.3})
    out = Decoder(cfg, scorer, None).run(ROWS, greedy, 2.0, samples, 6.0)
    assert out["greedy"]["accuracy"] == 0.5 and out["greedy"]["seconds_per_question"] == 1.0
    assert out["maj_at_n"]["accuracy"] == 0.0 and out["maj_at_n"]["tokens_per_question"] == 6.0
    assert out["prm_best_of_n"]["accuracy"] == 1.0
    assert out["prm_best_of_n"]["prm_tokens_per_question"] > 0
    assert out["prm_best_of_n"]["seconds_per_question"] >= 3.0  # the sampling it reuses counts
    assert out["prm_best_of_n"]["ceilings"]["pass_at_n"] == 1.0
    # greedy is right on question 1 only: maj@N loses it, best-of-N gains question 2
    assert out["maj_at_n"]["vs_greedy"] == {"difference": -0.5, "standard_error": 0.5}
    assert out["prm_best_of_n"]["vs_greedy"] == {"difference": 0.5, "standard_error": 0.5}
    assert "vs_greedy" not in out["greedy"]
    # one right sample of three on each question: a random pick is right a third of the time, the PRM's every time
    assert out["prm_best_of_n"]["vs_random"] == {"random_pick": 0.3333, "difference": 0.6667, "standard_error": 0.0}


def test_weighted_vote_sums_each_answers_scores_and_returns_its_best_sample():
    from pipeline.evaluation.decoding import weighted_vote

    row = {"answer_type": "number"}
    # 5 weighs 0.5 + 0.5 = 1.0 against 9's single 0.9: the vote goes to 5, its best-scored sample (the second)
    texts = ["Step 1: a.\nAnswer: 5", "Step 1: b.\nAnswer: 5.0", "Answer: 9", "Step 1: no answer."]
    assert weighted_vote(row, texts, [0.4, 0.6, 0.9, 1.0]) == texts[1]  # 5 and 5.0 are one answer; no answer, no vote
    # equal weights (0.5 and 0.5): the answer seen first
    assert weighted_vote(row, ["Answer: 3", "Answer: 4"], [0.5, 0.5]) == "Answer: 3"
    assert weighted_vote(row, ["Step 1: a.", ""], [0.9, 0.0]) == ""


class CountingScorer(FixedScorer):
    """FixedScorer that counts its calls: best-of-N and the weighted vote must score the samples once."""

    calls = 0

    def score(self, prompts, paths):
        self.calls += 1
        return super().score(prompts, paths)


def test_weighted_vote_and_best_of_n_pick_differently_from_one_scoring():
    cfg = DecodingConfig(strategies=["greedy", "maj_at_n", "prm_best_of_n", "prm_weighted_vote"], n=3)
    # question 1 (answer 1): two 1s at 0.5 outweigh one 5 at 0.9, which best-of-N takes;
    # question 2 (answer 2): two 7s at 0.3 outweigh one 2 at 0.4, which best-of-N takes
    samples = [[("Answer: 1", 2), ("Answer: 1", 2), ("Answer: 5", 2)],
               [("Answer: 2", 2), ("Answer: 7", 2), ("Answer: 7", 2)]]
    scorer = CountingScorer({"Answer: 1": 0.5, "Answer: 5": 0.9, "Answer: 2": 0.4, "Answer: 7": 0.3})
    out = Decoder(cfg, scorer, None).run(ROWS, [("Answer: 0", 4)] * 2, 2.0, samples, 6.0)
    vote, best = out["prm_weighted_vote"], out["prm_best_of_n"]
    assert scorer.calls == 1
    assert vote["by_task_type"] == {"t": 0.5} and best["by_task_type"] == {"t": 0.5}
    assert vote["vs_greedy"] == {"difference": 0.5, "standard_error": 0.5}  # greedy wrong on both
    # a random pick is right 2/3 on question 1 and 1/3 on question 2; the vote 1 and 0: differences +1/3 and -1/3,
    # mean 0, sample variance 2/9, standard error sqrt(2/9 / 2) = 1/3
    assert vote["vs_random"] == {"random_pick": 0.5, "difference": 0.0, "standard_error": 0.3333}
    # each strategy's cost is the whole scoring, whichever ran it first
    assert vote["prm_tokens_per_question"] == best["prm_tokens_per_question"] > 0
    assert "ceilings" in best and "ceilings" not in vote


def test_paired_difference_of_hand_counted_answers():
    # differences 0, 1, 0, -1: mean 0, sample variance 2/3, standard error sqrt(2/3 / 4)
    assert paired_difference([1, 1, 0, 0], [1, 0, 0, 1]) == {"difference": 0.0, "standard_error": 0.4082}
    # differences 1, 0, 0, 0: mean 0.25, sample variance (0.75^2 + 3 x 0.25^2) / 3 = 0.25, standard error 0.25
    assert paired_difference([1, 1, 1, 0], [0, 1, 1, 0]) == {"difference": 0.25, "standard_error": 0.25}
    assert paired_difference([True], [False]) == {"difference": 1.0, "standard_error": None}
    assert paired_difference([], []) == {"difference": None, "standard_error": None}
    with pytest.raises(ValueError):
        paired_difference([1, 0], [1])


def test_newline_ids_are_every_token_whose_text_holds_a_newline():
    from pipeline.modeling.models import train_tokenizer

    tokenizer = train_tokenizer(["Step 1: It is 5.\nAnswer: 5\n\n", "Chart: bar.\nQuestion: what?\n"] * 20,
                                vocab_size=300)
    one_by_one = [i for i in sorted(tokenizer.get_vocab().values()) if "\n" in tokenizer.decode([i])]
    assert newline_ids(tokenizer) == one_by_one and one_by_one


def test_ceilings_of_best_of_n_a_perfect_outcome_and_a_perfect_step_verifier():
    candidates = [["Step 1: It is 5.\nAnswer: 1", "Step 1: It is 1.\nAnswer: 5", "Step 1: It is 1.\nAnswer: 1"],
                  ["Step 1: It is 2.\nAnswer: 2", "Step 1: It is 7.\nAnswer: 3"]]
    scores = [[0.9, 0.5, 0.2], [0.1, 0.3]]
    out = ceilings(ROWS, candidates, scores)
    # question 1: both step-right candidates tie on steps, the PRM prefers the wrong answer among them (0.5 > 0.2);
    # question 2: the one step-right candidate is the right one, though the PRM scores it lower
    assert out == {"pass_at_n": 1.0, "step_oracle": 0.5, "all_steps_right": 0.6}


def test_searches_run_on_the_first_search_questions_and_pair_with_greedy_there():
    cfg = DecodingConfig(strategies=["greedy", "prm_beam", "prm_mcts"], n=2, beam_width=1, mcts_iterations=2,
                         mcts_children=2, search_questions=1)
    policy = ScriptedPolicy({(): ["Step 1: a.", "Step 1: b."], ("Step 1: a.",): ["Answer: 1"],
                             ("Step 1: b.",): ["Answer: 9"]})
    scorer = FixedScorer({"Answer: 1": 0.9, "Answer: 9": 0.2})
    greedy = [("Answer: 9", 4), ("Answer: 2", 4)]  # wrong on question 1, right on question 2
    out = Decoder(cfg, scorer, policy).run(ROWS, greedy, 2.0, [[("", 0)] * 2] * 2, 1.0)
    assert out["greedy"]["questions"] == 2 and out["greedy"]["accuracy"] == 0.5
    for strategy in ("prm_beam", "prm_mcts"):
        # one question, answered right: +1 against greedy's wrong answer there, not against greedy's 0.5 overall
        assert out[strategy]["questions"] == 1 and out[strategy]["accuracy"] == 1.0, strategy
        assert out[strategy]["vs_greedy"] == {"difference": 1.0, "standard_error": None}, strategy
    assert len([c for c in policy.calls if c[0] == ()]) == 2  # each search started from question 1's root only


def test_decoder_skips_prm_strategies_without_a_prm():
    cfg = DecodingConfig(n=1, beam_width=1)
    out = Decoder(cfg, None, None).run(ROWS, [("", 0)] * 2, 1.0, [[("", 0)]] * 2, 1.0)
    assert list(out) == ["greedy", "maj_at_n"]


def test_swapped_comparisons_and_the_inconsistency_rate():
    assert swapped("Is the value of Mon larger than the value of Tue?") == \
        "Is the value of Tue larger than the value of Mon?"
    assert swapped("Is the count of bars smaller than 3?") == "Is 3 smaller than the count of bars?"
    assert swapped("Is the sum of bars greater than 3 greater than 4?") is None  # ambiguous
    assert swapped("What is the value?") is None
    row = {"id": "1", "answer_type": "binary", "functions": ["one_object", "A_greater_B"],
           "question": "Is a greater than b?", "prompt": "Table\nQuestion: Is a greater than b?\n"}
    assert faithfulness_probes([row]) == [(row, "Table\nQuestion: Is b greater than a?\n")]
    assert faithfulness_probes([{**row, "functions": ["all_same_value"]}]) == []
    stats = inconsistency([("Yes", "No"), ("Yes", "yes."), ("No", "No"), ("No", None), ("maybe", "No")])
    assert stats == {"pairs": 5, "answered": 3, "inconsistent": 2, "inconsistency_rate": round(2 / 3, 4)}


def test_reversed_trends_and_their_inconsistency_rule():
    assert reversed_trend("Are all the bars strictly increasing from left to right?") == \
        "Are all the bars strictly decreasing from left to right?"
    assert reversed_trend("Do the points except Sun consistently decrease from left to right?") == \
        "Do the points except Sun consistently increase from left to right?"
    assert reversed_trend("Do the increasing bars decrease?") is None  # two direction words: ambiguous
    assert reversed_trend("Do all the slices all have the same value?") is None
    row = {"id": "1", "answer_type": "binary", "functions": ["all_objects", "consistently_increasing"],
           "question": "Are all the bars strictly increasing from left to right?",
           "prompt": "Table\nQuestion: Are all the bars strictly increasing from left to right?\n"}
    assert faithfulness_probes([row], "trend") == [
        (row, "Table\nQuestion: Are all the bars strictly decreasing from left to right?\n")]
    assert faithfulness_probes([row], "order") == []
    # Three values cannot rise and fall strictly at once: only Yes/Yes contradicts; No/No is consistent.
    stats = inconsistency([("Yes", "Yes"), ("Yes", "No"), ("No", "No"), ("No", "Yes"), (None, "Yes")], "trend")
    assert stats == {"pairs": 5, "answered": 4, "inconsistent": 1, "inconsistency_rate": 0.25}
    with pytest.raises(ValueError, match="probe kind"):
        inconsistency([], "colour")


def test_the_generalisation_table_of_a_dataset_task_has_one_all_column():
    """A dataset task's questions all have the task type "all": no second column beside the table's own."""
    from pipeline.evaluation.report import generalisation_markdown

    table = generalisation_markdown({"sft": {"decoding": {"greedy": {
        "accuracy": 0.5, "by_task_type": {"all": 0.5}, "accuracy_ood": None, "by_task_type_ood": {}}}}})
    lines = table.splitlines()
    assert "| model / strategy | all |" in lines and "| sft / greedy | 0.50 / - |" in lines


def test_report_tables_each_model_with_both_faithfulness_probes():
    from pipeline.evaluation.report import decoding_markdown

    greedy = {"accuracy": 0.4, "accuracy_ood": 0.1, "tokens_per_question": 48.0, "prm_tokens_per_question": 0.0,
              "seconds_per_question": 0.01}
    evaluations = {
        "sft": {"decoding": {"greedy": greedy},
                "faithfulness": {"pairs": 45, "answered": 1, "inconsistent": 1, "inconsistency_rate": 1.0,
                                 "trend": {"pairs": 15, "answered": 15, "inconsistent": 8,
                                           "inconsistency_rate": 0.5333}}},
        "old": {"decoding": {}, "faithfulness": {"pairs": 3, "answered": 0, "inconsistent": 0,
                                                 "inconsistency_rate": None}},
    }
    evaluations["sft"]["decoding"]["prm_best_of_n"] = {**greedy, "accuracy": 0.45, "vs_greedy": {
        "difference": 0.05, "standard_error": 0.021}}
    table = decoding_markdown(evaluations)
    assert "| sft | greedy | 0.4 | 0.1 |  | 48.0 | 0.0 |" in table
    assert "| sft | prm_best_of_n | 0.45 | 0.1 | +0.050 (0.021) | 48.0 | 0.0 |" in table
    assert "| sft | 45 | 1 | 1.0 | 15 | 15 | 0.5333 |" in table
    assert "| old | 3 | 0 | – | – | – | – |" in table  # metrics from before the trend probe still render

    # a dataset task: no ood column, and one line for the probes every model skipped, not a table of –
    del greedy["accuracy_ood"]
    skipped = {"skipped": "the probes rewrite chart questions; task.kind is dataset"}
    table = decoding_markdown({"sft": {"decoding": {"greedy": greedy}, "faithfulness": skipped}})
    assert "| model | strategy | test | test minus greedy (paired SE) |" in table
    assert "| sft | greedy | 0.4 |  | 48.0 | 0.0 |" in table
    assert table.endswith("Skipped for every model: the probes rewrite chart questions; task.kind is dataset.")


class ParagraphPolicy(ScriptedPolicy):
    """ScriptedPolicy for paragraph steps: a prefix's steps are its blank-line separated paragraphs."""

    def next_lines(self, prefixes, n):
        out = []
        for p in prefixes:
            self.calls.append(p)
            path = tuple(part for part in p[len(PROMPT):].split("\n\n") if part)
            options = self.tree.get(path, ["#### 0"])
            out.append([Line(options[i % len(options)], 3, terminal=options[i % len(options)].startswith("####"))
                        for i in range(n)])
        return out


@pytest.fixture
def paragraphs():
    from pipeline.data import task as tasks

    tasks.use(tasks.Task("dataset", "gsm8k", "exact", "paragraph"))
    yield
    tasks.use(None)


def test_a_sampled_step_is_a_line_or_a_paragraph():
    from pipeline.data import task as tasks

    lines, paragraphs = tasks.Task("dataset", "gsm8k", "exact", "line"), tasks.Task("dataset", "gsm8k", "exact",
                                                                                     "paragraph")
    assert lines.first_step("Step 1: a.\nStep 2: b.") == ("Step 1: a.", True)
    assert lines.first_step("Answer: 3") == ("Answer: 3", False)
    # a paragraph keeps its own line breaks; leading whitespace is not a break; a blank line with spaces is
    assert paragraphs.first_step("\n3 * 4 = 12\napples.\n \nthen") == ("3 * 4 = 12\napples.", True)
    assert paragraphs.first_step("#### 10") == ("#### 10", False)


def test_beam_search_on_paragraph_steps_continues_blank_lines_and_scores_collapsed_paragraphs(paragraphs):
    first_good, first_bad = "3 * 4 = 12\napples.", "3 + 4 = 7\napples."
    policy = ParagraphPolicy({(): [first_good, first_bad], (first_good,): ["#### 12"], (first_bad,): ["#### 7"]})
    seen = []

    def scorer(prompts, paths):
        seen.extend(paths)
        values = {"3 * 4 = 12 apples.": 0.9, "3 + 4 = 7 apples.": 0.1}
        return [[values.get(step, 0.5) for step in path] for path in paths]

    (text,) = beam_search([PROMPT], policy, scorer, n=2, width=1, max_steps=4, how="min")
    assert text == "3 * 4 = 12\napples.\n\n#### 12"
    assert policy.calls == [PROMPT, PROMPT + "3 * 4 = 12\napples.\n\n"]  # the paragraph as written, a blank line
    assert ("3 * 4 = 12 apples.",) in seen and ("3 * 4 = 12 apples.", "#### 12") in seen
    assert prefix(PROMPT, (first_good,)) == PROMPT + first_good + "\n\n"


def test_mcts_labels_paragraph_paths_as_the_prm_reads_them(paragraphs):
    policy = ParagraphPolicy({(): ["a\nb"], ("a\nb",): ["#### 1"]})
    (root,) = mcts([PROMPT], policy, lambda o, n: [1.0] * len(n), iterations=2, children=1, c=1.0, max_steps=4)
    assert dict(tree_paths(root)) == {("a b", "#### 1"): [1.0, 1.0]}


def test_the_step_policy_samples_whole_paragraphs_on_a_tiny_model(paragraphs):
    import torch

    from pipeline.evaluation.search import StepPolicy
    from pipeline.modeling.models import build_student, train_tokenizer
    from pipeline.modeling.params import BaseModelConfig

    texts = [f"{a} + {b} = {a + b}\nso {a + b}.\n\n#### {a + b}" for a in range(10) for b in range(10)]
    tok = train_tokenizer(texts, 200)
    cfg = BaseModelConfig(seed=0, vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    torch.manual_seed(0)
    model = build_student(cfg, tok)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features)
    with torch.no_grad():  # newlines favoured: paragraphs end within the step budget
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[newline_ids(tok)] = 4.0
    model.lm_head = head
    # a paragraph may run to the completion limit, not step_tokens (a line's limit): a cut paragraph is no step
    policy = StepPolicy(model, tok, step_tokens=4, completion_tokens=48, temperature=1.0, seed=1)
    assert policy.stop is not None and policy.stop_ids == [] and policy.step_limit == 48
    lines = [line for per in policy.next_lines(["1 + 2 = 3\n\n", "4 + 4 = "], 4) for line in per]
    assert len(lines) == 8 and policy.tokens == sum(line.tokens for line in lines)
    assert all("\n\n" not in line.text and line.text == line.text.strip() for line in lines)
    assert any(not line.terminal for line in lines)  # some ended at a blank line, not at the token limit
    assert max(line.tokens for line in lines) > 4
