"""One rank of tests/unit/test_sharding.py, run by torchrun on 2 gloo processes: a tiny model sharded by FSDP 2
(torch's `fully_shard`, as accelerate's FSDP 2 plugin shards it on GPUs), decoded, gathered, trained a step and
saved through the pipeline's own functions. Each rank writes what it saw to <out>/rank<r>.json.

    python -m torch.distributed.run --nproc_per_node 2 tests/unit/sharded_ranks.py <out>
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

from pipeline import sharding
from pipeline.checkpoints import run_key
from pipeline.generation import decode, pad
from pipeline.models import save_model, train_tokenizer
from pipeline.training import snapshot, weights_changed

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


def main(out: Path) -> None:
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
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.tensor([[1, 2, 3, 4, 5, 6]]) + rank
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
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
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
