"""Sharded parameters: the weights gathered whole to save or compare, the decode loop kept in step over the ranks,
and a model given back whole after a trainer that partitioned it.

Two kinds, from `launch.config_file`:
- FSDP 2 (`configs/accelerate/fsdp.yaml`): each parameter is a DTensor of which a rank holds one shard.
- DeepSpeed ZeRO-3 (`configs/accelerate/deepspeed_zero3.yaml`): each parameter is a DeepSpeed partition, gathered
  by hooks that DeepSpeed's engine puts on every module.

Either way every forward pass all-gathers a layer's parameters from every rank. So every rank must run the same
number of forward passes, whatever its own rows do (`lockstep`, read by `pipeline.inference.generation.decode`;
transformers' `generate` does the same with `synced_gpus`), and the model's own `state_dict` holds shards, not
weights (`full_state_dict`). A ZeRO-3 model stays partitioned only while its trainer runs: `unshard` gives every
rank the whole weights back, so the stage's own loops after training (the table drills, sampling, the PRM's
scoring) and a later trainer phase get a plain model, as under DDP. Everything else a stage does after training
already runs alike on every rank.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def _grouped() -> bool:
    """Is there a process group? FSDP and ZeRO-3 both need one: without it (every single-process run, where the
    decode loop and GRPO's rollouts ask at every call) no parameter is looked at."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def zero3(model) -> bool:
    """Are the model's parameters DeepSpeed ZeRO-3 partitions (gathered or not)?"""
    return _grouped() and any(hasattr(p, "ds_id") for p in model.parameters())


def sharded(model) -> bool:
    """Are the model's parameters sharded over the ranks: FSDP 2 DTensors, or ZeRO-3 partitions?"""
    if not _grouped():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters())


def lockstep(model) -> bool:
    """Must this process's forward passes keep pace with other ranks'? (sharded, over more than one rank; a ZeRO-3
    model gathered whole for generation (`generating`) does no collective, but keeping pace costs one small
    all-reduce a step)"""
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

    A collective (every rank calls it): each tensor is gathered in turn and moved to the CPU, so no device holds
    more than one whole tensor beside its shards.
    """
    if zero3(model):
        import torch.distributed as dist

        rank0 = dist.get_rank() == 0
        return {name: tensor for name, tensor in whole_tensors(model) if rank0}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def whole_tensors(model):
    """(name, whole tensor) for every entry of the model's state dict, in name order, on every rank: sharded ones
    gathered in turn (a collective: every rank iterates to the end), so no device holds more than one whole tensor
    beside its shards. A gathered ZeRO-3 tensor is a CPU copy; a DTensor's is on its device."""
    from torch.distributed.tensor import DTensor

    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):  # the parameters themselves, to gather
        if isinstance(tensor, DTensor):
            yield name, tensor.full_tensor().detach()
        elif hasattr(tensor, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([tensor]):
                whole = tensor.detach().to("cpu", copy=True)
            yield name, whole
        else:
            yield name, tensor.detach()


def unshard(trainer, model) -> None:
    """After `trainer` ran under DeepSpeed ZeRO-3: stop its engine (its hooks off every module) and give `model`
    its whole weights on every rank, as plain parameters (tied ones stay tied). Nothing otherwise.

    Every rank calls it. Each rank then holds the whole model (2 or 4 bytes a parameter) for the stage's work after
    training, which the drills' plain loops and the save need; the partitioned optimizer state is gone with the
    engine.
    """
    if not zero3(model):
        return
    import deepspeed

    trainer.accelerator.free_memory()  # DeepSpeedEngine.destroy(): the gather/release hooks come off
    params = list(dict.fromkeys(model.parameters()))  # each once: a tied weight is one parameter in two modules
    with deepspeed.zero.GatheredParameters(params):
        whole = {id(p): torch.nn.Parameter(p.data.clone(), requires_grad=p.requires_grad) for p in params}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and id(p) in whole:
                module._parameters[name] = whole[id(p)]


@contextmanager
def generating(trainer):
    """The trainer's model ready to decode during training (GRPO's rollouts). Under ZeRO-3: gathered whole and
    without DeepSpeed's hooks for the while, through TRL's own `unwrap_model_for_generation` as TRL's generation
    does it (`ds3_gather_for_generation` false leaves it partitioned: the decode keeps in step, `lockstep`).
    Otherwise the model itself, unwrapped from DDP or FSDP."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not zero3(model):
        yield model
        return
    from trl.models.utils import unwrap_model_for_generation

    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                     gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                     gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs) as model:
        yield model


def inference(model):
    """`torch.inference_mode()`, or `torch.no_grad()` for a sharded model: FSDP 2 keeps a forward pass's
    all-gather buffers for the next one (and ZeRO-3 its gathered parameters), and tensors made under inference mode
    cannot be written by a training pass afterwards (GRPO's rollouts come between its training steps)."""
    return torch.no_grad() if sharded(model) else torch.inference_mode()
