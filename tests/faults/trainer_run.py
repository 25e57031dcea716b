"""Tiny GRPO, DPO and PRM runs through the pipeline's own functions, as subprocesses of tests/faults/test_resume_rl.py.

python tests/faults/trainer_run.py MODES: MODES is `grpo`, `dpo`, `prm` or several joined by commas, run one after
another in this process (each writes <mode>.json in the working directory). Each trains a 1-layer model (hidden
32) from scratch through `rl_train` (GRPO with guided replay), `dpo_train` or `prm_train`, for
8 optimizer steps over more than one epoch. The working directory's params.yaml (its `repro` section) decides
checkpoints and resume; the checkpoint folder is `.checkpoints/<mode>-<key>`.

Written per step (the step a call belongs to is the trainer's global step + 1): the training loss, a digest of the
batch it trained on, and for GRPO the prompts of the step, the digest of their rollouts, each rollout's rewards and
the guided-replay counts after the step, and TRL's per-step values (`_metrics`, what its logs average); then the
trainer's log history (timings aside), the metrics the function returned, and the sha256 of the final weights (every
tensor of the state dict, in name order, as bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ROWS = [{"id": f"r{a}-{b}", "prompt": f"What is {a} plus {b}?\n",
         "rationale": f"Step 1: {a} + {b} = {a + b}\nAnswer: {a + b}", "answer": str(a + b), "answer_type": "number",
         "step_values": [str(a + b)]}
        for a in range(4) for b in range(4)]


# Every run (8 steps) logs at steps 4 and 8: a checkpoint at step 6 falls inside the last logged window, whose means
# the final metrics report (GRPO's reward_last and kl_last, DPO's reward_accuracy_last and reward_margin_last).
LOGGING = 4


def digest(value) -> str:
    """sha256 of a batch: its tensors' bytes (and any other values' text), keys in order."""
    import torch

    h = hashlib.sha256()
    if isinstance(value, dict):
        for key in sorted(value):
            h.update(key.encode())
            h.update(digest(value[key]).encode())
    elif isinstance(value, (list, tuple)):
        for item in value:
            h.update(digest(item).encode())
    elif isinstance(value, torch.Tensor):
        h.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def weights_hash(model) -> str:
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tiny_model(tokenizer):
    """The same fresh weights every run, loaded from a folder as a stage loads its starting model (GRPO's reference
    is loaded again from the model's path)."""
    from pipeline.modeling.models import build_student, load_weights
    from pipeline.modeling.params import BaseModelConfig

    start = Path("start")
    if not start.is_dir():
        model = build_student(BaseModelConfig(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=2, num_key_value_heads=1, vocab_size=160,
                                              max_position_embeddings=96), tokenizer)
        model.save_pretrained(start)
        tokenizer.save_pretrained(start)
    return load_weights(start, "float32")


def untimed_logs(trainer) -> list[dict]:
    """The trainer's log history (a resumed run's holds the checkpoint's earlier logs), wall-clock values aside."""
    return [{k: v for k, v in log.items() if not any(w in k for w in ("runtime", "per_second", "time"))}
            for log in trainer.state.log_history]


def recorded(steps: dict) -> None:
    """Patches `checkpoints.train` so that the trainer it gets records every step into `steps`."""
    from pipeline.training import checkpoints

    train = getattr(checkpoints.train, "original", checkpoints.train)

    def recording_train(trainer, stage_cfg, *args, **kwargs):
        def entry() -> dict:
            return steps.setdefault(trainer.state.global_step + 1, {"loss": 0.0, "batches": []})

        step = trainer.training_step

        def training_step(model, inputs, *args, **kwargs):
            loss = step(model, inputs, *args, **kwargs)
            entry()["loss"] += loss.detach().float().item()
            entry()["batches"].append(digest(inputs))  # GRPO: the step's rows, before its rollouts
            # TRL's per-step values (its logs are their means since the last log), timings aside
            entry()["trl"] = {k: v[-1] for k, v in getattr(trainer, "_metrics", {}).get("train", {}).items()
                              if v and "time" not in k}
            return loss

        trainer.training_step = training_step
        rollout = getattr(trainer, "rollout_func", None)
        if rollout is not None:  # GRPO: the prompts each step sampled for, their rollouts, and replay's counts
            def rollout_func(prompts, trainer_):
                out = rollout(prompts, trainer_)
                entry().update(prompts=list(prompts), rollouts=digest(out["completion_ids"]))
                entry()["replay"] = dict(rollout.stats)
                return out

            trainer.rollout_func = rollout_func
            rewards = trainer._calculate_rewards

            def calculate_rewards(*args, **kwargs):
                per_func = rewards(*args, **kwargs)
                entry()["rewards"] = per_func.tolist()
                return per_func

            trainer._calculate_rewards = calculate_rewards
        result = train(trainer, stage_cfg, *args, **kwargs)
        steps["logs"] = untimed_logs(trainer)
        return result

    recording_train.original = train
    checkpoints.train = recording_train


def grpo(tokenizer, model):
    from pipeline.rl.grpo import rl_train
    from pipeline.rl.params import GRPOStageConfig, RewardsConfig

    # 8 prompts, 2 a step (G = 2): 4 steps an epoch, 2 epochs
    cfg = GRPOStageConfig(seed=0, max_steps=8, prompts_per_step=2, num_generations=2, max_completion_length=32,
                          learning_rate=3e-3, warmup_steps=0, temperature=1.0, beta=0.04, logging_steps=LOGGING,
                          guided_replay=True, success_prompts=0)
    rewards = RewardsConfig(weights={"accuracy": 1.0, "format": 0.1})
    return rl_train(cfg, rewards, model, tokenizer, ROWS[:8], Path("work"), Path("live"))


def dpo(tokenizer, model):
    from pipeline.rl.params import DPOStageConfig
    from pipeline.training.trainer import dpo_train

    pairs = [{"prompt": r["prompt"], "chosen": r["rationale"],
              "rejected": r["rationale"].rsplit("Answer:", 1)[0] + f"Answer: {int(r['answer']) + 1}"} for r in ROWS]
    # 16 pairs, 4 a step: 4 steps an epoch, 2 epochs
    cfg = DPOStageConfig(seed=0, num_train_epochs=2, per_device_train_batch_size=4, learning_rate=3e-3,
                         warmup_steps=0, logging_steps=LOGGING, max_length=64)
    return dpo_train(cfg, model, tokenizer, pairs, Path("work"), Path("live"))


def prm(tokenizer, model):
    from pipeline.prm.params import PRMConfig
    from pipeline.training.trainer import prm_train

    rows = [{"id": r["id"], "prompt": r["prompt"], "steps": r["rationale"].splitlines(),
             "labels": [1.0, 1.0] if (i % 3) else [1.0, 0.0], "source": "gold"} for i, r in enumerate(ROWS[:10])]
    # 10 paths, 2 a step: 5 steps an epoch, 1.6 epochs: 8 steps
    cfg = PRMConfig(seed=0, num_train_epochs=1.6, per_device_train_batch_size=2, chain_weight=0.0, learning_rate=3e-3,
                    warmup_steps=0, logging_steps=LOGGING, max_length=96)
    return prm_train(cfg, model, tokenizer, rows, Path("work"), Path("live"))


def main(modes: str) -> None:
    import logging

    from transformers import TrainerCallback

    import pipeline.rl.grpo as rl
    import pipeline.training.trainer as training
    from pipeline.core.params import give
    from pipeline.modeling.models import train_tokenizer
    from pipeline.orchestration.flows import expected_errors
    from pipeline.orchestration.sections import run_settings

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pipeline").setLevel(logging.INFO)  # checkpoints' "resuming from ..." on stderr
    training.dvclive_callback = rl.dvclive_callback = lambda live: TrainerCallback()  # no dvclive files
    tokenizer = train_tokenizer([r["prompt"] + r["rationale"] for r in ROWS], 160)
    with expected_errors():
        give(*run_settings())  # params.yaml's `repro` (checkpoints, resume), handed over as run_stage does
    for mode in modes.split(","):
        os.environ["DVC_STAGE"] = mode  # the checkpoint folder's label
        steps: dict[int, dict] = {}
        recorded(steps)
        model = tiny_model(tokenizer)
        with expected_errors():
            metrics = {"grpo": grpo, "dpo": dpo, "prm": prm}[mode](tokenizer, model)
        logs = steps.pop("logs")
        Path(f"{mode}.json").write_text(json.dumps({"steps": steps, "logs": logs, "metrics": metrics,
                                                    "weights": weights_hash(model)}))


if __name__ == "__main__":
    main(sys.argv[1])
