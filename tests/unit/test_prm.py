"""The PRM's pieces on hand-computed cases: scored lines, gold labels, log_boost, aggregation, AUROC,
calibration, the loss, line spans, batched scoring and the tokenizer check."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from pipeline.core.io import InputError
from pipeline.modeling.models import train_tokenizer
from pipeline.prm.model import (
    EMPTY_SCORE,
    PRM_MARK,
    PRMScorer,
    aggregate,
    auroc,
    calibration,
    check_tokenizer,
    collate,
    encode,
    expected_calibration_error,
    line_labels,
    line_log_probs,
    log_boost,
    pair_loss,
    path_outcome,
    plain_lm_head,
    prm_from_policy,
    prm_loss,
    scored_lines,
    shared_prefix,
    token_logits,
    token_verdicts,
)

ROW = {
    "answer": "9", "answer_type": "number",
    "steps": [{"function": "f", "text": "", "value": "Jan 15, Feb 11"}, {"function": "g", "text": "", "value": "15"},
              {"function": "h", "text": "", "value": "9"}],
}
RIGHT = "Step 1: Select them: Jan 15, Feb 11.\nStep 2: The largest is 15.\nStep 3: 15 - 6 = 9.\nAnswer: 9"
CORPUS = [RIGHT, "Chart: bar.\nQuestion: What is it?\n", "Step 1: The value is 3.\nAnswer: No"] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="module")
def prm(tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=tokenizer.pad_token_id)
    setattr(config, PRM_MARK, "next_token")
    return Qwen2ForCausalLM(config).eval()


def test_scored_lines_are_step_lines_then_the_first_answer_line():
    text = "Let me think.\nStep 1: a is 2.\n  Step 2: b is 3.  \nAnswer: 3\nStep 3: extra.\nAnswer: 4"
    assert scored_lines(text) == ["Step 1: a is 2.", "Step 2: b is 3.", "Answer: 3"]
    assert scored_lines("no steps at all") == []
    assert scored_lines("Answer: 5") == ["Answer: 5"]
    assert scored_lines(None) == []


def test_gold_labels_check_each_step_value_and_the_answer():
    assert line_labels(scored_lines(RIGHT), ROW) == [1.0, 1.0, 1.0, 1.0]
    wrong = "Step 1: Select them: Jan 15, Feb 12.\nStep 2: The largest is 15.\nStep 3: 15 - 6 = 10.\nAnswer: 10"
    assert line_labels(scored_lines(wrong), ROW) == [0.0, 1.0, 0.0, 0.0]
    # beyond the gold chain, and a step without a value
    extra = "Step 1: no value here\nStep 2: The largest is 15.\nStep 3: 15 - 6 = 9.\nStep 4: again 9.\nAnswer: 9"
    assert line_labels(scored_lines(extra), ROW) == [0.0, 1.0, 1.0, 0.0, 1.0]
    # the pool's flat step_values work too
    assert line_labels(["Step 1: x is 9."], {"answer": "9", "answer_type": "number", "step_values": ["9"]}) == [1.0]


def test_log_boost_lifts_small_success_rates():
    assert log_boost(0.0) == 0.0 and log_boost(1.0) == pytest.approx(1.0)
    assert log_boost(0.1) == pytest.approx(math.log(2) / math.log(11))
    assert log_boost(0.25) > 0.25


def test_aggregate_and_the_empty_completion():
    assert aggregate([0.9, 0.2, 0.6], "min") == 0.2
    assert aggregate([0.9, 0.2, 0.6], "last") == 0.6
    assert aggregate([0.9, 0.2, 0.7], "mean") == pytest.approx(0.6)
    assert aggregate([], "min") == EMPTY_SCORE
    with pytest.raises(ValueError, match="median"):
        aggregate([0.5], "median")


def test_auroc_hand_computed():
    # positives 0.9, 0.4; negatives 0.1, 0.6: 3 of 4 pairs ordered right
    assert auroc([1, 0, 1, 0], [0.9, 0.1, 0.4, 0.6]) == pytest.approx(0.75)
    assert auroc([1, 0], [0.5, 0.5]) == pytest.approx(0.5)  # a tie counts half
    assert auroc([1, 1, 0], [0.3, 0.3, 0.1]) == pytest.approx(1.0)
    assert auroc([1, 1], [0.2, 0.3]) is None


def test_calibration_table_and_ece():
    table = calibration([1, 0, 1, 1], [0.05, 0.05, 0.95, 1.0], bins=2)
    assert table == [
        {"bin": 0.25, "predicted": 0.05, "observed": 0.5, "lines": 2},
        {"bin": 0.75, "predicted": 0.975, "observed": 1.0, "lines": 2},
    ]
    assert expected_calibration_error(table) == pytest.approx((2 * 0.45 + 2 * 0.025) / 4, abs=1e-4)


def test_held_out_over_no_lines_measures_nothing():
    """No held-out lines (a tiny run's val split): every share is None, as AUROC is, not a measured 0."""
    from pipeline.prm.model import held_out

    class NoScorer:
        def score(self, prompts, steps):
            return [[] for _ in prompts]

    metrics, table = held_out(NoScorer(), [])
    assert metrics["lines"] == 0 and table == []
    assert {k: metrics[k] for k in ("positive_share", "auroc", "accuracy", "ece")} == dict.fromkeys(
        ("positive_share", "auroc", "accuracy", "ece"))


def test_a_token_verdict_is_the_logit_of_that_token_one_position_before():
    logits = torch.tensor([[[0.0, 9.0], [2.0, -1.0], [5.0, 5.0]]])  # [1, T=3, V=2]
    ids = torch.tensor([[1, 0, 1]])
    got = token_verdicts(logits, ids)
    # token 0: nothing before it; token 1 (id 0) read at position 0 (logit 0.0); token 2 (id 1) at 1 (-1.0)
    assert got[0].exp().tolist() == pytest.approx([1.0, 0.5, 1 / (1 + math.e)])


def test_loss_is_bce_on_gold_and_mse_on_mcts_labels():
    logits, ids = torch.zeros(1, 5, 3), torch.tensor([[0, 1, 2, 1, 0]])  # every verdict sigmoid(0) = 0.5
    # line 1: tokens 1-2 (P(right) = 0.25), line 2: token 3 (0.5), a padding slot
    starts, ends = torch.tensor([[1, 3, -1]]), torch.tensor([[3, 4, -1]])
    log_p, valid = line_log_probs(token_verdicts(logits, ids), starts, ends)
    assert log_p[0, :2].exp().tolist() == pytest.approx([0.25, 0.5]) and valid.tolist() == [[True, True, False]]
    gold = prm_loss(logits, ids, starts, ends, torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0, 0, 0]]))
    assert gold.item() == pytest.approx((math.log(4) + math.log(2)) / 2, abs=1e-5)  # -ln 0.25, -ln(1 - 0.5)
    mcts = prm_loss(logits, ids, starts, ends, torch.tensor([[0.9, 0.1, 0.0]]), torch.tensor([[1, 1, 1]]))
    assert mcts.item() == pytest.approx(((0.25 - 0.9) ** 2 + (0.5 - 0.1) ** 2) / 2)


def test_a_gold_chain_row_is_trained_by_next_token_cross_entropy_not_by_its_verdicts():
    torch.manual_seed(0)
    logits, ids = torch.randn(3, 7, 3), torch.tensor([[0, 1, 2, 1, 0, 1, 1], [2, 2, 0, 1, 1, 2, 0],
                                                      [1, 0, 2, 2, 1, 0, 1]])
    # row 0: labelled lines; row 1: a chain with a newline token (3) between its lines, then right padding;
    # row 2: a chain with one line and a padding slot
    starts, ends = torch.tensor([[1, 3], [2, 4], [3, -1]]), torch.tensor([[3, 4], [3, 6], [5, -1]])
    labels = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    kinds = torch.tensor([[0, 0], [2, 2], [2, 0]])
    verdicts_only = prm_loss(logits[:1], ids[:1], starts[:1], ends[:1], labels[:1], kinds[:1])
    assert prm_loss(logits, ids, starts, ends, labels, kinds) == pytest.approx(verdicts_only.item())  # weight 0

    def nll(row: int, t: int) -> float:  # token t read at position t - 1
        return -torch.log_softmax(logits[row, t - 1], -1)[ids[row, t]].item()

    # row 1: tokens 2..5 (the newline inside included), row 2: tokens 3..4; one mean over the 6 tokens
    by_hand = (sum(nll(1, t) for t in (2, 3, 4, 5)) + sum(nll(2, t) for t in (3, 4))) / 6
    assert prm_loss(logits, ids, starts, ends, labels, kinds, chain_weight=0.5).item() == pytest.approx(
        verdicts_only.item() + 0.5 * by_hand, rel=1e-5)
    # chains alone: no verdict loss, only the cross-entropy
    assert prm_loss(logits[1:], ids[1:], starts[1:], ends[1:], labels[1:], kinds[1:], chain_weight=1.0).item() == \
        pytest.approx(by_hand, rel=1e-5)


def test_the_trainer_passes_the_chain_weight_to_the_loss(tmp_path, tokenizer, prm):
    from transformers import TrainingArguments

    from pipeline.prm.model import collate, encode_many
    from pipeline.training.trainer import PRMTrainer

    (ids, spans), = encode_many(tokenizer, ["Q\n"], [RIGHT.splitlines()])
    batch = collate([{"input_ids": ids, "spans": spans, "line_labels": [1.0] * len(spans), "kind": 2}], 0)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    losses = [PRMTrainer(model=prm, args=args, chain_weight=w).compute_loss(prm, dict(batch)).item() for w in (0, 2)]
    assert losses[0] == 0.0 and losses[1] > 0  # a chain row trains only through the cross-entropy


def test_pair_loss_orders_right_above_wrong_within_a_question_only():
    # four paths of one line each; line probabilities 0.8, 0.5 (question 0), 0.2, 0.9 (question 1)
    probs = torch.tensor([[0.8], [0.5], [0.2], [0.9]])
    log_p, valid = probs.log(), torch.ones(4, 1, dtype=torch.bool)
    questions, outcomes = torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 0.0])

    def logit(p: float) -> float:
        return math.log(p / (1 - p))

    def softplus(x: float) -> float:
        return math.log1p(math.exp(x))

    # pairs (0 right, 1 wrong) and (2 right, 3 wrong); never (0, 3): they answer other questions
    by_hand = (softplus(logit(0.5) - logit(0.8)) + softplus(logit(0.9) - logit(0.2))) / 2
    assert pair_loss(log_p, valid, questions, outcomes).item() == pytest.approx(by_hand, rel=1e-5)
    # a path's score is the mean of its valid lines' probabilities; -1 (no answer line, MCTS) is never paired
    two = torch.tensor([[0.9, 0.5], [0.6, 0.0]]).clamp(min=1e-9).log()
    mask = torch.tensor([[True, True], [True, False]])
    assert pair_loss(two, mask, torch.tensor([0, 0]), torch.tensor([1.0, 0.0])).item() == pytest.approx(
        softplus(logit(0.6) - logit(0.7)), rel=1e-5)
    none = pair_loss(log_p, valid, questions, torch.tensor([1.0, -1.0, 1.0, 1.0]))
    assert none.item() == 0.0


def test_prm_loss_adds_the_weighted_pair_term():
    logits, ids = torch.zeros(2, 3, 3), torch.tensor([[0, 1, 2], [0, 2, 1]])  # every line P = 0.5: pair term ln 2
    starts, ends = torch.tensor([[1], [1]]), torch.tensor([[3], [3]])
    labels, kinds = torch.tensor([[1.0], [0.0]]), torch.zeros(2, 1, dtype=torch.long)
    plain = prm_loss(logits, ids, starts, ends, labels, kinds).item()
    paired = prm_loss(logits, ids, starts, ends, labels, kinds, 0.0, torch.tensor([5, 5]), torch.tensor([1.0, 0.0]),
                      pair_weight=0.5).item()
    assert paired == pytest.approx(plain + 0.5 * math.log(2), rel=1e-5)


def test_path_outcome_reads_the_answer_line_label():
    assert path_outcome(["Step 1: a.", "Answer: 3"], [0.0, 1.0], "gold") == 1.0
    assert path_outcome(["Step 1: a.", "Answer: 4"], [1.0, 0.0], "chain") == 0.0
    assert path_outcome(["Step 1: a."], [1.0], "gold") == -1.0  # cut short: no answer to compare
    assert path_outcome(["Step 1: a.", "Answer: 3"], [0.4, 0.9], "mcts") == -1.0


def test_collate_carries_questions_and_outcomes_only_when_every_feature_has_them():
    f = {"input_ids": [5, 6], "spans": [(1, 2)], "line_labels": [1.0], "kind": 0}
    assert "score_questions" not in collate([f, f], 0)
    batch = collate([{**f, "question": 3, "outcome": 1.0}, {**f, "question": 3, "outcome": 0.0}], 0)
    assert batch["score_questions"].tolist() == [3, 3] and batch["score_outcomes"].tolist() == [1.0, 0.0]


def test_question_grouped_sampler_keeps_a_question_together_and_reshuffles_each_epoch():
    from pipeline.training.trainer import QuestionGroupedSampler

    questions = [0, 1, 0, 2, 1, 0, 3, 3, 4, 5]
    sampler = QuestionGroupedSampler(questions, seed=0)
    orders = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    for order in orders:
        assert sorted(order) == list(range(len(questions))) and len(sampler) == len(questions)
        seen = [questions[i] for i in order]
        runs = [q for k, q in enumerate(seen) if k == 0 or seen[k - 1] != q]
        assert len(runs) == len(set(questions))  # each question's paths in one run
    assert len({tuple(o) for o in orders}) > 1
    assert list(QuestionGroupedSampler(questions, seed=0)) == orders[0]  # seeded
    resumed = QuestionGroupedSampler(questions, seed=0)
    resumed.set_epoch(2)  # a run resumed in epoch 2 sees epoch 2's order, not epoch 0's
    assert list(resumed) == orders[2] and list(resumed) == orders[2]  # and iterating again repeats it


def test_the_trainer_adds_the_pair_loss_and_groups_a_question_s_paths(tmp_path, tokenizer, prm):
    from datasets import Dataset
    from transformers import TrainingArguments

    from pipeline.prm.model import encode_many
    from pipeline.training.trainer import PRMTrainer, QuestionGroupedSampler

    wrong = RIGHT.replace("Answer: 9", "Answer: 8")
    encoded = encode_many(tokenizer, ["Q\n", "Q\n"], [RIGHT.splitlines(), wrong.splitlines()])
    features = [{"input_ids": ids, "spans": spans, "line_labels": [1.0] * (len(spans) - 1) + [y], "kind": 0,
                 "question": 0, "outcome": y} for (ids, spans), y in zip(encoded, (1.0, 0.0))]
    batch = collate(features, 0)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    plain, paired = (PRMTrainer(model=prm, args=args, pair_weight=w).compute_loss(prm, dict(batch)).item()
                     for w in (0.0, 1.0))
    assert paired > plain  # the pair term is positive (softplus), and read only with a weight
    grouped = PRMTrainer(model=prm, args=args, pair_weight=1.0, train_dataset=Dataset.from_list(features))
    assert isinstance(grouped._get_train_sampler(), QuestionGroupedSampler)


def test_a_wrong_line_still_learns_when_its_tokens_are_sure():
    """A line scored 1.0 (log p rounds to 0) but labelled 0: a finite loss with a gradient that lowers it."""
    logits, ids = torch.full((1, 4, 2), 40.0, requires_grad=True), torch.tensor([[0, 1, 1, 0]])
    loss = prm_loss(logits, ids, torch.tensor([[1]]), torch.tensor([[4]]), torch.tensor([[0.0]]), torch.tensor([[0]]))
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() > 5
    read = logits.grad[0, torch.arange(3), ids[0, 1:]]  # the logit each verdict reads
    assert (read > 0).all()  # gradient descent lowers every one


def test_encode_spans_each_line_token_by_token(tokenizer):
    prompt = "Chart: bar.\nQuestion: What is it?\n"
    lines = scored_lines(RIGHT)
    ids, spans = encode(tokenizer, prompt, lines)
    assert len(spans) == len(lines)
    assert tokenizer.decode(ids) == prompt + "\n".join(lines)
    for (a, b), line in zip(spans, lines):
        assert tokenizer.decode(ids[a:b]).strip("\n") == line  # the line's tokens and nothing else
    assert spans[-1][1] == len(ids) and all(b <= a2 for (_, b), (a2, _) in zip(spans, spans[1:]))


def test_batched_scores_equal_one_at_a_time_and_no_lines_is_defined(tokenizer, prm):
    prompts = ["Chart: bar.\nQuestion: What is it?\n"] * 3
    completions = [RIGHT, "Step 1: The value is 3.\nAnswer: No", "I refuse to show steps."]
    lines = [scored_lines(c) for c in completions]
    batched = PRMScorer(prm, tokenizer, batch_size=8).score(prompts, lines)
    single = [PRMScorer(prm, tokenizer, batch_size=1).score([p], [ls])[0] for p, ls in zip(prompts, lines)]
    assert [len(s) for s in batched] == [4, 2, 0]
    for a, b in zip(batched, single):
        assert [math.log(x) for x in a] == pytest.approx([math.log(x) for x in b], abs=1e-4)
    scores = [aggregate(s, "min") for s in batched]  # how best-of-N reads them: no lines, the empty score
    assert scores[2] == EMPTY_SCORE and all(0.0 < s < 1.0 for s in scores[:2])


def test_shared_prefix_leaves_each_sequence_a_token_of_its_own():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token is still read per pair
    assert shared_prefix([[7, 1], [8, 1]]) == 0
    assert shared_prefix([[4, 5, 6]]) == 2


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_prefix_shared_scores_equal_a_full_forward_pass_per_pair(tokenizer, prm, batch_size):
    """Best-of-N candidates and search children (lines shared beyond the prompt), lone pairs, a group cut by a batch."""
    short, long = "Question: What is it?\n", "Chart: bar.\nQuestion: What is it?\n"
    pairs = [(long, ["Step 1: Select them: Jan 15, Feb 11.", "Step 2: The largest is 15."]),
             (short, ["Step 1: The value is 3.", "Answer: No"]),
             (long, ["Step 1: Select them: Jan 15, Feb 11.", "Step 2: The largest is 11.", "Answer: 9"]),
             (long, ["Step 1: The value is 3."]),
             (short, ["Answer: 9"]),
             ("Chart: pie.\n", ["Step 1: 15 - 6 = 9.", "Answer: 9"])]
    scorer = PRMScorer(prm, tokenizer, batch_size=batch_size)
    got = scorer.score([p for p, _ in pairs], [ls for _, ls in pairs])
    full_tokens = 0
    for (prompt, lines), scores in zip(pairs, got):
        batch = collate([dict(zip(("input_ids", "spans"), encode(tokenizer, prompt, lines)))], tokenizer.pad_token_id)
        with torch.inference_mode():
            logits = prm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        log_p, _ = line_log_probs(token_verdicts(logits, batch["input_ids"]), batch["score_starts"],
                                  batch["score_ends"])
        # In log space: a line of many unsure tokens scores near 0, where an absolute tolerance would pass anything.
        assert [math.log(x) for x in scores] == pytest.approx(log_p[0].tolist(), abs=1e-4)
        full_tokens += batch["input_ids"].shape[1]
    if batch_size == 1:
        assert scorer.tokens == full_tokens
    else:  # the prompts (and the shared first step) are read once per batch
        assert scorer.tokens < full_tokens


def _pairs():
    prompt = "Chart: bar.\nQuestion: What is it?\n"
    lines = [scored_lines(RIGHT), ["Step 1: The value is 3.", "Answer: No"], ["Step 1: Select them: Jan 15, Feb 11."]]
    return [prompt, prompt, "Question: What is it?\n"], lines


def test_verdicts_through_the_plain_head_equal_the_whole_vocabulary_s_logits(tokenizer, prm):
    prompts, lines = _pairs()
    plain, whole = PRMScorer(prm, tokenizer, batch_size=2), PRMScorer(prm, tokenizer, batch_size=2, full_logits=True)
    assert plain.head is prm.lm_head and whole.head is None
    got, want = plain.score(prompts, lines), whole.score(prompts, lines)
    for a, b in zip(got, want):
        assert [math.log(x) for x in a] == pytest.approx([math.log(x) for x in b], abs=1e-5)
    assert plain.tokens == whole.tokens


def test_a_head_with_a_bias_is_read_with_it(tokenizer, prm):
    torch.manual_seed(1)
    biased = copy.deepcopy(prm)
    biased.lm_head = torch.nn.Linear(prm.config.hidden_size, prm.config.vocab_size, bias=True)
    torch.nn.init.normal_(biased.lm_head.bias, std=2.0)  # large enough that leaving it out fails the comparison
    prompts, lines = _pairs()
    plain, whole = PRMScorer(biased, tokenizer), PRMScorer(biased, tokenizer, full_logits=True)
    assert plain.head is biased.lm_head
    for a, b in zip(plain.score(prompts, lines), whole.score(prompts, lines)):
        assert [math.log(x) for x in a] == pytest.approx([math.log(x) for x in b], abs=1e-5)


class _DoubledHead(torch.nn.Linear):
    """A head whose logits are not its weight's (as a quantised layer's packed weight is not its values)."""

    def forward(self, x):
        return torch.nn.functional.linear(x, 2 * self.weight)


def test_a_head_whose_logits_are_not_its_weight_s_is_read_whole(tokenizer, prm):
    doubled = copy.deepcopy(prm)
    head = _DoubledHead(prm.config.hidden_size, prm.config.vocab_size, bias=False)
    head.weight = torch.nn.Parameter(prm.lm_head.weight.detach().clone())
    doubled.lm_head = head
    assert plain_lm_head(doubled) is None
    prompts, lines = _pairs()
    scorer = PRMScorer(doubled, tokenizer)
    assert scorer.head is None
    assert scorer.score(prompts, lines) == PRMScorer(doubled, tokenizer, full_logits=True).score(prompts, lines)


def test_a_probe_that_fails_reads_the_whole_head_and_does_not_crash(tokenizer, prm, monkeypatch):
    broken = copy.deepcopy(prm)

    def refuse(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 must have the same dtype")

    monkeypatch.setattr(broken.model, "forward", refuse)
    assert plain_lm_head(broken) is None


def test_token_logits_are_the_head_s_logits_of_those_tokens(prm):
    hidden = torch.randn(2, 5, prm.config.hidden_size)
    ids = torch.randint(0, prm.config.vocab_size, (2, 5))
    want = prm.lm_head(hidden).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logits(hidden, prm.lm_head, ids), want, atol=1e-5)
    assert token_logits(hidden.bfloat16(), prm.lm_head, ids).dtype == torch.float32


def test_a_head_that_caps_its_logits_is_read_whole(tokenizer):
    """Gemma 2 squashes its logits (cap x tanh(logit / cap)): one dot product would not be its logit."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=30.0,
                          pad_token_id=tokenizer.pad_token_id)
    capped = Gemma2ForCausalLM(config).eval()
    assert plain_lm_head(capped) is None
    uncapped = copy.deepcopy(config)
    uncapped.final_logit_softcapping = None
    assert plain_lm_head(Gemma2ForCausalLM(uncapped).eval()) is not None
    prompts, lines = _pairs()
    scorer = PRMScorer(capped, tokenizer)
    assert scorer.head is None
    for prompt, pair_lines, scores in zip(prompts, lines, scorer.score(prompts, lines)):
        batch = collate([dict(zip(("input_ids", "spans"), encode(tokenizer, prompt, pair_lines)))],
                        tokenizer.pad_token_id)
        with torch.inference_mode():
            logits = capped(input_ids=batch["input_ids"]).logits
        log_p, _ = line_log_probs(token_verdicts(logits, batch["input_ids"]), batch["score_starts"],
                                  batch["score_ends"])
        assert [math.log(x) for x in scores] == pytest.approx(log_p[0].tolist(), abs=1e-4)


def test_equal_pairs_are_read_once(tokenizer, prm):
    prompt, lines = "Chart: bar.\nQuestion: What is it?\n", scored_lines(RIGHT)
    once, twice = PRMScorer(prm, tokenizer), PRMScorer(prm, tokenizer)
    [alone] = once.score([prompt], [lines])
    assert twice.score([prompt, prompt], [lines, list(lines)]) == [alone, alone]
    assert twice.tokens == once.tokens


def test_collate_pads_right_and_marks_padding_slots():
    batch = collate([{"input_ids": [5, 6, 7], "spans": [(0, 2), (2, 3)], "line_labels": [1.0, 0.0], "kind": 0},
                     {"input_ids": [8], "spans": [(0, 1)], "line_labels": [0.5], "kind": 1}], pad_value=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["score_starts"].tolist() == [[0, 2], [0, -1]]
    assert batch["score_ends"].tolist() == [[2, 3], [1, -1]]
    assert batch["score_labels"].tolist() == [[1.0, 0.0], [0.5, 0.0]]
    assert batch["score_kinds"].tolist() == [[0, 0], [1, 0]]  # a padding slot is masked out anyway


def test_a_prm_with_another_tokenizer_fails_with_a_clear_message(tokenizer):
    other = train_tokenizer(["completely different words here"] * 10, vocab_size=280)
    check_tokenizer(tokenizer, tokenizer, "models/prm", "models/sft")  # the same: no error
    with pytest.raises(InputError, match=r"models/prm: the PRM's tokenizer .* does not match the policy's at models/x"):
        check_tokenizer(tokenizer, other, "models/prm", "models/x")


def test_loading_a_policy_as_the_prm_fails_with_a_clear_message(tokenizer, prm, tmp_path):
    policy = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in prm.config.to_dict().items() if k != PRM_MARK}))
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    with pytest.raises(InputError, match=r"policy: not a PRM checkpoint .*python -m stages.prm"):
        PRMScorer.load(tmp_path / "policy", device="cpu")
    prm.save_pretrained(tmp_path / "prm")
    tokenizer.save_pretrained(tmp_path / "prm")
    assert PRMScorer.load(tmp_path / "prm", device="cpu").score(["Q\n"], [["Answer: 9"]])[0][0] > 0


def test_within_question_pair_accuracy_ignores_question_difficulty():
    from pipeline.prm.model import within_question

    rows = [{"id": "q", "steps": ["Step 1: a", "Answer: 1"], "labels": [1.0, 1.0]},
            {"id": "q", "steps": ["Answer: 2"], "labels": [0.0]},
            {"id": "q", "steps": ["Step 1: b"], "labels": [1.0]},  # no answer line: not a right answer
            {"id": "easy", "steps": ["Answer: 3"], "labels": [1.0]}]  # no wrong answer to compare with
    out = within_question(rows, [[0.2, 0.9], [0.5], [0.5], [0.99]])
    # pairs (right, wrong) of question q: (row 0, row 1) and (row 0, row 2)
    assert out == {"pair_accuracy_min": 0.0, "pair_accuracy_last": 1.0, "pair_accuracy_mean": 1.0, "pairs": 2}


def test_a_deeper_prm_starts_as_the_policy_and_round_trips(tokenizer, prm, tmp_path):
    policy = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in prm.config.to_dict().items() if k != PRM_MARK}))
    policy.save_pretrained(tmp_path / "policy")
    deeper = prm_from_policy(tmp_path / "policy", extra_layers=2).eval()
    assert deeper.config.num_hidden_layers == 3 and len(deeper.model.layers) == 3
    assert getattr(deeper.config, PRM_MARK) == "next_token"
    ids = torch.tensor([tokenizer(RIGHT)["input_ids"]])
    with torch.no_grad():  # the new layers start as the identity: the PRM reads as the policy does
        assert torch.equal(deeper(input_ids=ids).logits, policy.eval()(input_ids=ids).logits)
        for layer in deeper.model.layers[1:]:
            layer.mlp.down_proj.weight.normal_()  # as if trained: the saved PRM must keep them
    deeper.save_pretrained(tmp_path / "prm")
    tokenizer.save_pretrained(tmp_path / "prm")
    loaded = PRMScorer.load(tmp_path / "prm", device="cpu")
    assert len(loaded.model.model.layers) == 3
    scorer = PRMScorer(deeper, tokenizer)
    assert loaded.score(["Q\n"], [RIGHT.splitlines()])[0] == \
        pytest.approx(scorer.score(["Q\n"], [RIGHT.splitlines()])[0])


@pytest.mark.parametrize("grouped", [False, True])
def test_prm_train_batches_paths_of_one_length_when_asked(tmp_path, monkeypatch, tokenizer, prm, grouped):
    """`prm.group_by_length`: transformers' length-grouped sampler over the features' `length` (less padding)."""
    import pipeline.prm.model
    from pipeline.prm.params import PRMConfig
    from pipeline.training.trainer import prm_train

    short, long = ["Step 1: The value is 3.", "Answer: No"], scored_lines(RIGHT)
    rows = [{"id": f"q{i}", "prompt": "Q\n", "steps": steps, "labels": [1.0] * len(steps), "source": "gold"}
            for i in range(32) for steps in (short, long)]
    widths, collate_ = [], pipeline.prm.model.collate

    def spy(features, pad_value):
        widths.append({len(f["input_ids"]) for f in features})
        return collate_(features, pad_value)

    monkeypatch.setattr(pipeline.prm.model, "collate", spy)
    cfg = PRMConfig(group_by_length=grouped, num_train_epochs=1, per_device_train_batch_size=4, chain_weight=0.0)
    metrics = prm_train(cfg, copy.deepcopy(prm), tokenizer, rows, tmp_path / "work", tmp_path / "live")
    assert metrics["steps"] == 16 and len(widths) == 16
    # Batches that pad a short path to a long one. The sampler sorts each of its 4 "megabatches" (a random quarter
    # here; 50 batches on the default run): a batch mixes the two lengths only where a megabatch turns from long to
    # short, and where the longest path is swapped to the front. At random, 7 in 8 batches of 4 mix.
    mixed = sum(len(w) > 1 for w in widths)
    assert mixed <= 5 if grouped else mixed >= 10


def test_the_scorer_and_scored_lines_refuse_what_they_cannot_read_and_take_a_generation(prm, tokenizer):
    """What generate() gives (a list per prompt of Generations) passed whole used to come back as no lines, and
    the scorer as [[]]: now a Generation is read by its text, and a list or a bare text is a TypeError saying what
    is wanted."""
    from pipeline.inference.generation import Generation

    one = Generation(text=RIGHT, tokens=30)
    assert scored_lines(one) == scored_lines(RIGHT) and scored_lines(None) == []
    for wrong, named in (([one], "list of Generation"), ([[one]], "list of list"), (42, "int")):
        with pytest.raises(TypeError, match=rf"scored_lines takes one completion: .* not a {named}.*out\[i\]\[j\]"):
            scored_lines(wrong)
    scorer = PRMScorer(prm, tokenizer)
    prompt = "Chart: bar.\nQuestion: What is it?\n"
    assert len(scorer.score([prompt], [scored_lines(one)])[0]) == 4
    for prompts, lines, message in (
        (prompt, [scored_lines(RIGHT)], r"prompts is a str \(one prompt: \[prompt\]\)"),
        ([prompt], [RIGHT], r"an item of lines is a str \(a completion's text\? pass scored_lines\(text\)\)"),
        ([prompt], [[one]], r"an item of lines is a list of Generation, not a list of str"),
        ([prompt], [one], r"an item of lines is a Generation, not a list of str"),
    ):
        with pytest.raises(TypeError, match=message):
            scorer.score(prompts, lines)
    with pytest.raises(ValueError, match="2 prompts but 1 lists of lines"):
        scorer.score([prompt, prompt], [scored_lines(RIGHT)])
