"""One rank of tests/gpu/test_fsdp.py, started by `accelerate launch --config_file configs/accelerate/<config>`:
SFT with TRL (the weights sharded by accelerate's FSDP 2 plugin, or partitioned by DeepSpeed ZeRO-3), the model
saved whole, greedy decoding of this rank's own prompts, then GRPO steps on the saved model (rollouts decoded in
step over the ranks). Each rank writes what it saw to <out>/rank<r>.json.

    accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes N tests/gpu/fsdp_rank.py SAVED OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from pipeline.core import sharding
from pipeline.inference.generation import decode, pad, pad_id
from pipeline.modeling.models import load_model, save_model
from pipeline.rl import grpo as rl
from pipeline.rl.params import GRPOStageConfig, RewardsConfig
from pipeline.training import trainer as training
from pipeline.training.params import TrainConfig

TEXTS = [f"Question: what is {a}+{b}?\nStep 1: Select them: {a} {b}.\nStep 2: {a} + {b} = {a + b}.\nAnswer: {a + b}"
         for a in range(10) for b in range(10)]


def main(saved: Path, out: Path) -> None:
    # the image has no dvclive: no curves here (rl took its own reference to the function)
    training.dvclive_callback = rl.dvclive_callback = lambda live_dir: TrainerCallback()
    rank = int(__import__("os").environ.get("RANK", 0))
    model, tok = load_model(saved)
    rows = [{"prompt": t.split("\n", 1)[0] + "\n", "rationale": t.split("\n", 1)[1]} for t in TEXTS]
    cfg = TrainConfig(max_steps=6, per_device_train_batch_size=8, eval_steps=3, logging_steps=1, max_eval_samples=8,
                      learning_rate=1e-3)
    report = {"sft": training.sft_train(cfg, model, tok, rows, rows, out / f"work{rank}", out / f"live{rank}"),
              "sharded": sharding.sharded(model), "lockstep": sharding.lockstep(model)}
    save_model(model, tok, out / "sft" if rank == 0 else out / f"sft-rank{rank}")
    # this rank's own prompts, a different number of new tokens each: the ranks decode in step
    prompts = [tok(t.split("\n", 1)[0] + "\n")["input_ids"] for t in TEXTS[rank * 7 : rank * 7 + 3]]
    ids, mask = pad(prompts, pad_id(tok), left=True)
    report["prompts"] = prompts
    report["decoded"] = decode(model, ids.to(model.device), mask.to(model.device), 24 + 8 * rank, tok.eos_token_id)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # rank 0 has saved
    policy, _ = load_model(out / "sft")  # every rank reads rank 0's saved model
    gold = [{"id": str(i), "prompt": r["prompt"], "answer": t.rsplit(" ", 1)[1], "answer_type": "number",
             "step_values": [], "rationale": r["rationale"]} for i, (r, t) in enumerate(zip(rows, TEXTS))][:16]
    grpo = GRPOStageConfig(max_steps=3, prompts_per_step=2, num_generations=4, max_completion_length=32,
                           learning_rate=1e-4, success_prompts=0)
    report["grpo"] = rl.rl_train(grpo, RewardsConfig(weights={"accuracy": 1.0}), policy, tok, gold, out / f"rl{rank}",
                              out / f"rl-live{rank}")
    (out / f"rank{rank}.json").write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
