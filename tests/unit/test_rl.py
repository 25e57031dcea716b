"""Hard-case mining, guided replay, TBRM's loss, success amplification and pass@k / maj@k, on hand-computed cases."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from pipeline.data.distill import QuestionResult
from pipeline.data.mining import bucket, policy_pairs, rl_set
from pipeline.data.params import MineConfig
from pipeline.evaluation.metrics import majority_vote, pass_at_k, sampled_metrics
from pipeline.modeling.models import build_student, train_tokenizer
from pipeline.modeling.params import BaseModelConfig
from pipeline.rl.grpo import GuidedRollout, grpo_args, success_amplification
from pipeline.rl.params import GRPOStageConfig
from pipeline.rl.tbrm import TBRMTrainer


def result(i: int, correct: int, g: int = 8, kept=None, failed=None) -> QuestionResult:
    row = {"id": f"q{i}", "prompt": f"P{i}\n", "answer": "5", "answer_type": "number",
           "rationale": "Step 1: 5.\nAnswer: 5", "steps": [{"function": "f", "text": "t", "value": "5"}],
           "task_type": "arithmetic", "chain_length": 2}
    return QuestionResult(row, correct / g, correct, kept or [], failed or [])


@pytest.mark.parametrize(("pass_rate", "expected"), [
    (0.0, "unsolved"), (0.125, "hard"), (0.625, "hard"), (0.75, "easy"), (0.875, "easy"), (1.0, "solved"),
])
def test_buckets_at_the_window_edges(pass_rate, expected):
    assert bucket(pass_rate, MineConfig(hard_min_pass_rate=0.125, hard_max_pass_rate=0.625)) == expected


def test_rl_set_repeats_by_bucket_and_excludes_solved():
    cfg = MineConfig(repeat_unsolved=1, repeat_hard=3, repeat_easy=1, repeat_solved=0)
    results = [result(0, 0), result(1, 2), result(2, 7), result(3, 8)]
    rows, counts, pool = rl_set(results, cfg)
    assert dict(counts) == {"unsolved": 1, "hard": 1, "easy": 1, "solved": 1}
    # 1 + 3 + 1 + 0 copies
    assert sorted(r["id"] for r in rows) == ["q0", "q1", "q1", "q1", "q2"]
    assert [r["bucket"] for r in pool] == ["unsolved", "hard", "easy", "solved"]
    assert pool[1]["step_values"] == ["5"] and pool[1]["pass_rate"] == 0.25
    again, _, _ = rl_set(results, cfg)
    assert [r["id"] for r in again] == [r["id"] for r in rows]  # seeded shuffle


def test_policy_pairs_need_a_right_and_a_distinct_wrong_rollout():
    results = [
        result(0, 2, kept=["right a", "right b"], failed=["wrong", "wrong", "other wrong"]),
        result(1, 8, kept=["right"], failed=[]),  # nothing to reject
        result(2, 0, kept=[], failed=["wrong"]),  # nothing to choose
    ]
    assert policy_pairs(results, max_pairs=1) == [
        {"id": "q0", "prompt": "P0\n", "chosen": "right a", "rejected": "wrong", "source": "policy"}]
    assert [(p["chosen"], p["rejected"]) for p in policy_pairs(results, max_pairs=5)] == [
        ("right a", "wrong"), ("right b", "other wrong")]


@pytest.mark.parametrize(("p0", "beta", "expected"), [
    (0.2, 2, 0.4087), (0.2, 5, 0.2807), (0.5, 5, 0.6007), (0.05, 10, 0.0719),  # p* of docs/methods.md's recurrence
])
def test_success_amplification_fixed_point(p0, beta, expected):
    p = success_amplification(p0, beta)
    assert p == pytest.approx(expected, abs=1e-4)
    h = 1 / (1 + math.exp(-(math.log(p0 / (1 - p0)) + 1 / (beta * math.sqrt(p * (1 - p) + 1e-8)))))
    assert h == pytest.approx(p, abs=1e-9)  # it is a fixed point
    assert success_amplification(0.0, 1.0) == 0.0 and success_amplification(1.0, 1.0) == 1.0


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 0, 4, 0.0), (4, 1, 4, 1.0), (4, 1, 1, 0.25), (5, 2, 2, 0.7), (10, 3, 1, 0.3),  # 1 - C(3,2)/C(5,2) = 0.7
])
def test_pass_at_k_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_majority_vote_counts_numbers_by_value_and_skips_missing_answers():
    assert majority_vote(["3", "3.0", "4", None, None], "number") == "3"
    assert majority_vote(["Red", "blue", "red."], "text") == "Red"
    assert majority_vote(["a", "b"], "text") == "a"  # a tie goes to the first seen
    assert majority_vote([None, None], "binary") is None


def test_sampled_metrics_hand_computed():
    rows = [{"answer": "5", "answer_type": "number"}, {"answer": "Yes", "answer_type": "binary"}]
    samples = [["Answer: 5", "Answer: 6", "Answer: 6", "no answer"],  # 1 of 4 right; vote 6: wrong
               ["Answer: yes", "Answer: Yes", "Answer: No", "Answer: yes"]]  # 3 of 4; vote yes: right
    m = sampled_metrics(rows, samples, k=4)
    assert m["pass_at_4"] == 1.0 and m["maj_at_4"] == 0.5
    assert m["sampled_accuracy"] == pytest.approx((0.25 + 0.75) / 2)


@pytest.fixture(scope="module")
def tiny():
    texts = [f"Q{a}\nStep 1: {a} + 1 = {a + 1}.\nAnswer: {a + 1}" for a in range(30)]
    tok = train_tokenizer(texts, 200)
    cfg = BaseModelConfig(seed=0, vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    return build_student(cfg, tok), tok


def test_guided_replay_replaces_the_tail_of_failing_groups_only(tiny):
    _, tok = tiny
    gold = {"A\n": {"answer": "2", "answer_type": "number", "rationale": "Step 1: 1 + 1 = 2.\nAnswer: 2"},
            "B\n": {"answer": "3", "answer_type": "number", "rationale": "Step 1: 2 + 1 = 3.\nAnswer: 3"}}
    rollout = GuidedRollout(gold, num_generations=3, max_new_tokens=64, temperature=1.0, top_p=1.0, seed=0,
                            replay=True, replay_max_accuracy=0.0, replay_samples=1)
    texts = ["Answer: 7", "Answer: 8", "nothing",  # group A: all wrong -> last one replaced
             "Answer: 3", "Answer: 1", "Answer: 1"]  # group B: one right -> untouched
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    out, replaced = rollout.guide(["A\n"] * 3 + ["B\n"] * 3, ids, tok)
    assert out[:2] == ids[:2] and out[3:] == ids[3:] and replaced == {2}
    assert out[2][-1] == tok.eos_token_id
    assert tok.decode(out[2], skip_special_tokens=True) == gold["A\n"]["rationale"]
    assert dict(rollout.stats) == {"groups": 2, "replayed_groups": 1, "replayed_samples": 1}


def test_a_gold_rationale_longer_than_a_rollout_is_cut_like_one_and_counted(tiny):
    """The replayed gold is cut at max_new_tokens like a sampled rollout; its answer, at its end, is then lost, so the
    group stays all wrong (zero advantages): counted, for the stage's warning."""
    _, tok = tiny
    gold = {"A\n": {"answer": "2", "answer_type": "number", "rationale": "Step 1: 1 + 1 = 2.\nAnswer: 2"}}
    full = len(tok(gold["A\n"]["rationale"], add_special_tokens=False)["input_ids"])
    rollout = GuidedRollout(gold, num_generations=2, max_new_tokens=full, temperature=1.0, top_p=1.0, seed=0,
                            replay=True)
    out, replaced = rollout.guide(["A\n"] * 2, [tok("no", add_special_tokens=False)["input_ids"]] * 2, tok)
    assert replaced == {1} and len(out[1]) == full and out[1][-1] == tok.eos_token_id  # cut by one token, EOS after
    assert rollout.stats["replayed_cut"] == 1
    rollout.max_new_tokens = full + 1  # room for the whole rationale and its EOS: nothing cut
    rollout.guide(["A\n"] * 2, [tok("no", add_special_tokens=False)["input_ids"]] * 2, tok)
    assert rollout.stats["replayed_cut"] == 1 and rollout.stats["replayed_groups"] == 2


def test_rollout_sampling_is_seeded_per_step(tiny):
    model, tok = tiny
    rollout = GuidedRollout({}, num_generations=2, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=3, replay=False)
    prompts = tok(text=["Q1\n", "Q1\n", "Q12\n", "Q12\n"])["input_ids"]
    a, b = rollout.sample(model, tok, prompts, step=0), rollout.sample(model, tok, prompts, step=0)
    c = rollout.sample(model, tok, prompts, step=1)
    assert a == b and a != c and all(1 <= len(x) <= 8 for x in a)


def test_tbrm_args_keep_equal_rollouts_with_one_per_prompt(tmp_path):
    cfg = GRPOStageConfig(algorithm="tbrm", prompts_per_step=4, num_generations=8)
    args = grpo_args(cfg, [1.0], tmp_path)
    assert args.num_generations == 1 and args.per_device_train_batch_size == 32 and args.beta == 0.0
    grpo = grpo_args(GRPOStageConfig(prompts_per_step=4, num_generations=8), [1.0], tmp_path)
    assert grpo.num_generations == 8 and grpo.per_device_train_batch_size == 32


def test_tbrm_loss_is_the_squared_trajectory_residual(tiny):
    """At the start (policy = reference) the residual is beta * logsumexp z(s1) - r, hand-assembled here."""
    model, tok = tiny
    prompt = tok(["Q3\n", "Q7\n"], padding=True, padding_side="left", return_tensors="pt")
    completion = tok(["Answer: 4", "Answer: 1"], padding=True, padding_side="right", return_tensors="pt")
    inputs = {"prompt_ids": prompt["input_ids"], "prompt_mask": prompt["attention_mask"],
              "completion_ids": completion["input_ids"], "completion_mask": completion["attention_mask"],
              "advantages": torch.tensor([1.0, 0.0])}
    fake = SimpleNamespace(tbrm_beta=0.5, tbrm_ref=model, model=model,
                           _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    model.eval()
    loss = TBRMTrainer._compute_loss(fake, model, inputs)
    with torch.no_grad():
        logits = model(**{"input_ids": inputs["prompt_ids"], "attention_mask": inputs["prompt_mask"]}).logits
        lse = torch.logsumexp(logits[:, -1, :].float(), dim=-1)
    expected = ((0.5 * lse - inputs["advantages"]) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_tbrm_reference_stays_frozen_while_the_policy_moves(tiny, tmp_path):
    """The reference must not share the policy's (TRL-patched) forward: else every log ratio is 0."""
    from pipeline.rl.grpo import rl_dataset
    from pipeline.rl.params import RewardsConfig
    from pipeline.rl.rewards import build_rewards

    model, tok = tiny
    rows = [{"id": f"q{a}", "prompt": f"Q{a}\n", "answer": str(a + 1), "answer_type": "number",
             "step_values": [str(a + 1)], "rationale": f"Step 1: {a} + 1 = {a + 1}.\nAnswer: {a + 1}"}
            for a in range(8)]
    funcs, weights = build_rewards(RewardsConfig())
    cfg = GRPOStageConfig(algorithm="tbrm", max_steps=1, prompts_per_step=2, num_generations=2)
    trainer = TBRMTrainer(model=model, reward_funcs=funcs, args=grpo_args(cfg, weights, tmp_path),
                          train_dataset=rl_dataset(rows), processing_class=tok, tbrm_beta=0.04,
                          rollout_func=GuidedRollout({}, num_generations=1, max_new_tokens=8, temperature=1.0,
                                                     top_p=1.0, seed=0, replay=False))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = trainer.tbrm_ref(input_ids=ids).logits.clone()
        for param in trainer.model.parameters():
            param.add_(0.1)
        assert not torch.equal(trainer.model(input_ids=ids).logits, before)
        assert torch.equal(trainer.tbrm_ref(input_ids=ids).logits, before)


def test_models_markdown_puts_models_side_by_side_with_the_rl_yardstick(tmp_path):
    import json

    from pipeline.orchestration.orchestrate import models_markdown

    root = tmp_path / "metrics"
    (root / "evaluate").mkdir(parents=True)
    # The order comes from the evaluate matrix of the dvc.yaml beside the metrics folder, not from file names.
    (tmp_path / "dvc.yaml").write_text("stages:\n  evaluate:\n    matrix:\n      model: [teacher, sft, grpo]\n")
    for name, acc in (("sft", 0.32), ("grpo", 0.33)):
        (root / "evaluate" / f"{name}.json").write_text(json.dumps({
            "accuracy": acc, "accuracy_ood": 0.06, "step_accuracy": 0.2, "pass_at_4": 0.5, "maj_at_4": 0.3,
            "sampled": {"k": 4, "sampled_accuracy": 0.26}, "tokens_per_question": 45.0}))
    (root / "grpo.json").write_text(json.dumps({"algorithm": "grpo", "steps": 45, "rollouts": 2880, "p0": 0.31,
                                                "p_star": 1.0, "success_prompts": 200, "p_before": 0.3,
                                                "p_after": 0.34}))
    table = models_markdown(root).splitlines()
    assert table[2] == "| sft | 0.32 | 0.06 | 0.2 | 0.5 (k=4) | 0.3 | 0.26 | 45.0 |"
    assert table[3].startswith("| grpo | 0.33 |") and len(table) == 6  # no teacher file: no teacher row
    assert "p0 = 0.31" in table[5] and "0.3 before, 0.34 after" in table[5]

    # a dataset task: no ood column, a val one where evaluate.splits asks for it, – for the chart-only numbers,
    # and a PRM whose held-out lines are all of one class says so rather than printing None
    for name, acc in (("sft", 0.32), ("grpo", 0.33)):
        (root / "evaluate" / f"{name}.json").write_text(json.dumps({
            "accuracy": acc, "step_accuracy": None, "pass_at_4": 0.5, "maj_at_4": 0.3, "val": {"accuracy": 0.5},
            "sampled": {"k": 4, "sampled_accuracy": 0.26}, "tokens_per_question": 45.0}))
    (root / "prm.json").write_text(json.dumps({
        "sources": {"chain": 3, "mc": 5}, "auroc": None, "accuracy": 0.98, "ece": 0.02,
        "held_out": {"lines": 51, "positive_share": 0.0, "auroc_steps": None, "auroc_answers": None,
                     "within_question": {"pairs": 0, "pair_accuracy_mean": None}}}))
    table = models_markdown(root).splitlines()
    assert table[0] == "| model | test | val | step accuracy | pass@k | maj@k | sampled accuracy | tokens/question |"
    assert table[2] == "| sft | 0.32 | 0.5 | – | 0.5 (k=4) | 0.3 | 0.26 | 45.0 |"
    assert table[5] == ("PRM on held-out step labels (chain and mc; 51 lines): AUROC – (one class only: 0.0 of the "
                        "lines right; steps –, answers –), accuracy 0.98, ECE 0.02; no held-out question has both a "
                        "right and a wrong answer to rank.")
