"""One rank of tests/unit/test_sharding.py, run by torchrun on 2 gloo processes: a tiny model sharded by FSDP 2
(torch's `fully_shard`, as accelerate's FSDP 2 plugin shards it on GPUs) or partitioned by DeepSpeed ZeRO-3 (its
CPU accelerator), decoded, gathered, trained a step and saved through the pipeline's own functions. Each rank
writes what it saw to <out>/rank<r>.json.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/unit/sharded_ranks.py <out> fsdp|zero3
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pipeline.core import sharding
from pipeline.inference.generation import decode, pad
from pipeline.modeling.models import save_model, train_tokenizer
from pipeline.training.checkpoints import run_key
from pipeline.training.trainer import snapshot, weights_changed

NEW_TOKENS = 12
NEVER = -1  # an id no row ever picks: such a row runs all NEW_TOKENS steps


def tiny_model() -> Qwen2ForCausalLM:
    """The same random model on every rank (seeded), with wide weights so that greedy rows differ."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                         tie_word_embeddings=True))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    return model.eval()


def as_trainer(model) -> SimpleNamespace:
    """What `checkpoints.run_key` reads of a trainer."""
    return SimpleNamespace(args=SimpleNamespace(to_dict=dict), train_dataset=[0, 1], model=model)


def zero3_engine(model):
    """DeepSpeed's ZeRO-3 engine over `model`, every parameter partitioned (none kept whole for being small), with
    a plain torch optimizer (DeepSpeed's own Adam would compile an extension)."""
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                      config=config)
    return engine


def main(out: Path, kind: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_model()
    whole = copy.deepcopy(model)
    before = snapshot(whole)
    # Each rank decodes its own prompts; rank 0's rows end at their first token, rank 1's run NEW_TOKENS steps.
    prompts = [[3, 4, 5], [7, 8]] if rank == 0 else [[9, 10, 11, 12], [13]]
    ids, mask = pad(prompts, 0, left=True)
    probe = decode(whole, ids, mask, NEW_TOKENS, NEVER)
    stops = [row[0] for row in probe] if rank == 0 else []
    reference = decode(whole, ids, mask, NEW_TOKENS, NEVER, stop_ids=stops)  # one process, unsharded
    if kind == "fsdp":
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        engine = None
    else:
        engine = zero3_engine(model)
    report = {"lockstep": sharding.lockstep(model), "lockstep_whole": sharding.lockstep(whole),
              "reference": reference}
    # a later phase's checkpoint key (repro.checkpoint_steps): the whole weights', the same on every rank
    report["key_whole"], report["key_sharded"] = run_key(as_trainer(whole), {}), run_key(as_trainer(model), {})
    report["sharded"] = decode(model, ids, mask, NEW_TOKENS, NEVER, stop_ids=stops)
    gathered = sharding.full_state_dict(model)
    report["gathered_keys"] = sorted(gathered)
    report["gathered_equal"] = all(torch.equal(gathered[k], before[k]) for k in gathered)
    report["changed_untrained"] = weights_changed(before, model)
    model.train()
    batch = torch.tensor([[1, 2, 3, 4, 5, 6]]) + rank
    if engine is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
    else:  # DeepSpeed's engine steps its own optimizer; its backward reduces the partitioned gradients
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
    report["changed_trained"] = weights_changed(before, model)
    trained = sharding.full_state_dict(model)
    # a second phase on the model the first left sharded (sft's curriculum): its snapshot is gathered too
    again = snapshot(model)
    report["snapshot_keys"] = len(again)
    report["changed_since_snapshot"] = weights_changed(again, model)
    tokenizer = train_tokenizer(["a b c d e f g h i j k"] * 4, 64)
    save_model(model, tokenizer, out / f"model{rank}")
    saved = out / f"model{rank}"
    report["saved_files"] = sorted(p.name for p in saved.iterdir()) if saved.exists() else []
    if trained:
        loaded = AutoModelForCausalLM.from_pretrained(saved).state_dict()
        report["saved_equal"] = all(torch.equal(loaded[k], trained[k]) for k in trained)
        report["saved_architecture"] = json.loads((saved / "config.json").read_text())["architectures"]
    if kind == "zero3":  # after its trainer, a stage gives the model its whole weights back on every rank
        sharding.unshard(SimpleNamespace(accelerator=SimpleNamespace(free_memory=engine.destroy)), model)
        whole_now = model.state_dict()
        report["unsharded"] = not sharding.zero3(model) and not sharding.sharded(model)
        report["still_tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        report["unsharded_equal"] = all(torch.equal(whole_now[k], trained[k]) for k in trained)
        report["unsharded_decode"] = decode(model.eval(), ids, mask, NEW_TOKENS, NEVER, stop_ids=stops)
        report["unsharded_trainable"] = all(p.requires_grad and p.numel() > 0 for p in model.parameters())
        report["unsharded_key"] = run_key(as_trainer(model), {})  # the same whole weights on both ranks
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
