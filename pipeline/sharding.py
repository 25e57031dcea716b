"""Sharded parameters (FSDP 2, `launch.config_file: configs/accelerate/fsdp.yaml`): the weights gathered whole to
save or compare, and the decode loop kept in step over the ranks.

Under FSDP 2 each parameter is a DTensor of which a rank holds one shard, and every forward pass all-gathers a
layer's shards from every rank. So every rank must run the same number of forward passes, whatever its own rows
do (`lockstep`, read by `pipeline.generation.decode`; transformers' `generate` does the same with
`synced_gpus`), and the model's own `state_dict` holds shards, not weights (`full_state_dict`). Everything else a
stage does after training already runs alike on every rank.
"""

from __future__ import annotations

import torch


def sharded(model) -> bool:
    """Are the model's parameters sharded DTensors (FSDP 2, on one rank or more)? FSDP needs a process group:
    without one (every single-process run: each decode call asks) no parameter is looked at."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def lockstep(model) -> bool:
    """Must this process's forward passes keep pace with other ranks'? (sharded, over more than one rank)"""
    import torch.distributed as dist

    return sharded(model) and dist.get_world_size() > 1


def any_rank(flag: bool, device) -> bool:
    """Is `flag` true on any rank? A collective: every rank calls it, as often as the others."""
    import torch.distributed as dist

    value = torch.tensor([int(flag)], device=device)  # on the model's device: NCCL reduces CUDA tensors only
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded model in CPU memory on global rank 0, {} on every other rank.

    A collective (every rank calls it): each tensor is all-gathered in turn and moved to the CPU, so no device
    holds more than one whole tensor beside its shards.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def inference(model):
    """`torch.inference_mode()`, or `torch.no_grad()` for a sharded model: FSDP 2 keeps a forward pass's
    all-gather buffers for the next one, and buffers made under inference mode cannot be written by a training
    pass afterwards (GRPO's rollouts come between its training steps)."""
    return torch.no_grad() if sharded(model) else torch.inference_mode()
