"""SFT on a CPU goes through the model's plain LM head (training.PlainHeadSFTTrainer) instead of TRL's fused one.

The two must train the same model: the same loss at every step and TRL's running count of trained tokens, which
the plain head keeps through TRL's own (private) counters; a TRL release that moves them would show here, not as a
`tokens_per_second` of 0 in sft's metrics.
"""

from __future__ import annotations

import pytest
from trl import SFTTrainer

from pipeline.modeling.models import build_student, train_tokenizer
from pipeline.modeling.params import BaseModelConfig
from pipeline.training.params import TrainConfig
from pipeline.training.trainer import PlainHeadSFTTrainer, prompt_completion_dataset, trainer_args

PROMPT, COMPLETION = "Tom has 3 apples and buys 4 more. How many?\n", "Step 1: 3 + 4 = 7.\nAnswer: 7"
STEPS, BATCH = 4, 2


def run(trainer_class, tmp_path) -> tuple[list[dict], int]:
    """The logged steps of a 4-step SFT run on identical rows, and the tokens of one row."""
    tok = train_tokenizer([PROMPT + COMPLETION] * 30, 300)
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64), tok)
    # Every row the same, so every batch has the same tokens whatever the order: the count is known by hand
    rows = [{"prompt": PROMPT, "rationale": COMPLETION}] * 8
    cfg = TrainConfig(max_steps=STEPS, per_device_train_batch_size=BATCH, logging_steps=1, learning_rate=1e-2)
    trainer = trainer_class(model=model, args=trainer_args(cfg, tmp_path, eval_strategy="no"), processing_class=tok,
                            train_dataset=prompt_completion_dataset(rows))
    trainer.train()
    example = trainer.train_dataset[0]
    logs = [log for log in trainer.state.log_history if "loss" in log]
    return logs, len(example["input_ids"])


def test_the_plain_head_trains_as_trls_own_and_counts_the_same_tokens(tmp_path):
    ours, length = run(PlainHeadSFTTrainer, tmp_path / "plain")
    trls, _ = run(SFTTrainer, tmp_path / "trl")
    assert len(ours) == len(trls) == STEPS
    # the loss falls, and equals TRL's at every step (float32 sums in another order: rel. 1e-4)
    assert ours[-1]["loss"] < ours[0]["loss"]
    assert [log["loss"] for log in ours] == pytest.approx([log["loss"] for log in trls], rel=1e-4)
    # the prompt's and the completion's tokens (EOS included), BATCH rows a step, no padding
    assert [log["num_tokens"] for log in ours] == [BATCH * length * (k + 1) for k in range(STEPS)]
    assert [log["num_tokens"] for log in ours] == [log["num_tokens"] for log in trls]


def test_changed_counts_tensors_and_elements_by_hand():
    import torch

    from pipeline.training.trainer import changed, snapshot

    model = torch.nn.Linear(3, 2)  # weight 2x3 (6 elements), bias 2: 8 elements in 2 tensors
    before = snapshot(model)
    assert changed(before, model) == {"weights_changed": 0.0, "elements_changed": 0.0}
    with torch.no_grad():
        model.weight[0, 1] += 1.0  # one element of one tensor
    assert changed(before, model) == {"weights_changed": 0.5, "elements_changed": 0.125}
    with torch.no_grad():
        model.bias += 1.0
    assert changed(before, model) == {"weights_changed": 1.0, "elements_changed": 0.375}


def test_sft_counts_the_rows_trls_truncation_cuts_and_drops_and_warns(tmp_path, caplog):
    """TRL cuts every row to max_length and drops a row whose prompt alone fills it, both silently: sft's metrics
    count both (3 rows of each kind here) and the stage's log says which key to raise."""
    from pipeline.training.trainer import sft_train

    tok = train_tokenizer([PROMPT + COMPLETION] * 30, 300)
    model = build_student(BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=512), tok)
    fits = {"prompt": PROMPT, "rationale": COMPLETION}
    long_completion = {"prompt": PROMPT, "rationale": "\n".join([COMPLETION] * 8)}
    long_prompt = {"prompt": PROMPT * 8, "rationale": COMPLETION}
    rows = [fits, long_completion, long_prompt] * 3
    # the fitting row's prepared length (no truncation at 1,024), then a limit a few tokens above it: the
    # 8-fold completion and the 8-fold prompt are far longer
    cfg = TrainConfig(max_steps=1, per_device_train_batch_size=2, logging_steps=1, max_length=1024, eval_steps=1)
    trainer = SFTTrainer(model=model, args=trainer_args(cfg, tmp_path / "measure", eval_strategy="no"),
                         processing_class=tok, train_dataset=prompt_completion_dataset([fits]))
    limit = len(trainer.train_dataset[0]["input_ids"]) + 4
    with caplog.at_level("WARNING", logger="pipeline"):
        metrics = sft_train(cfg.model_copy(update={"max_length": limit}), model, tok, rows, [fits], tmp_path / "w",
                            tmp_path / "live")
    assert (metrics["examples"], metrics["rows_at_max_length"], metrics["rows_dropped"]) == (9, 3, 3)
    assert f"3 of 9 training rows reach max_length {limit} tokens" in caplog.text
    assert "3 were dropped" in caplog.text

    untouched = sft_train(cfg, model, tok, rows, [fits], tmp_path / "w2", tmp_path / "live2")
    assert (untouched["rows_at_max_length"], untouched["rows_dropped"]) == (0, 0)
