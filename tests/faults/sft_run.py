"""A tiny SFT run through pipeline.training.trainer.sft_train, as a subprocess of the fault tests.

python tests/faults/sft_run.py OUT.json [LEARNING_RATE [MAX_STEPS]]: trains a 2-layer model from scratch for 8
optimizer steps (one epoch) on 64 arithmetic rows in the working directory (its params.yaml's `repro` section decides
checkpoints and resume), then writes to OUT.json the loss of every step, the summary metrics, and the `weights_only`
argument of every `torch.load` call. A diverged run exits 1 with its message, as a stage does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.core.params import give
from pipeline.modeling.models import build_student, train_tokenizer
from pipeline.modeling.params import BaseModelConfig
from pipeline.orchestration.flows import expected_errors
from pipeline.orchestration.sections import run_settings
from pipeline.training.params import SFTConfig
from pipeline.training.trainer import sft_train

ROWS = [{"prompt": f"What is {a} plus {b}?\n", "rationale": f"Step 1: {a} + {b} = {a + b}\nAnswer: {a + b}"}
        for a in range(8) for b in range(8)]


def main(out: str, learning_rate: float = 3e-3, max_steps: float = 8) -> None:
    import torch

    loads: list[object] = []
    original_load = torch.load

    def recorded_load(*args, **kwargs):
        loads.append(kwargs.get("weights_only"))
        return original_load(*args, **kwargs)

    torch.load = recorded_load

    tokenizer = train_tokenizer([r["prompt"] + r["rationale"] for r in ROWS], 200)
    model = build_student(BaseModelConfig(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, vocab_size=200,
                                          max_position_embeddings=64), tokenizer)
    cfg = SFTConfig(max_steps=int(max_steps), per_device_train_batch_size=8, logging_steps=1, eval_steps=100,
                    learning_rate=learning_rate, warmup_steps=0, max_eval_samples=8)
    logged: dict[int, float] = {}

    from transformers import TrainerCallback

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                logged[state.global_step] = logs["loss"]

    import pipeline.training.trainer as training

    training.dvclive_callback = lambda live: Record()  # every step's loss, in memory, instead of dvclive's files
    with expected_errors():
        give(*run_settings())  # params.yaml's `repro` (checkpoints, resume), handed over as run_stage does
        metrics = sft_train(cfg, model, tokenizer, ROWS, ROWS[:8], Path("work"), Path("live"))
    Path(out).write_text(json.dumps({"losses": logged, "metrics": metrics, "loads": loads}))


if __name__ == "__main__":
    main(sys.argv[1], *map(float, sys.argv[2:]))
