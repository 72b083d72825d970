"""Many trainer processes through torch.distributed: the process group, FSDP2 sharding, gathering.

Launch with torchrun (`torchrun --nproc-per-node N ...`): every rank runs the same update on its
share of the samples; rank 0 alone claims sessions, writes the version's file, commits and pushes.
gloo on CPU, nccl on CUDA. A rank that dies makes the others' next collective fail (a peer error,
or the group's timeout), so a step either completes on every rank or raises on the survivors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from . import collectives
from .device import resolve_device
from .samples import Sample

DEFAULT_TIMEOUT_S = 60.0  # how long a collective waits for a missing rank before it raises
TIMEOUT_ENV = "RLGW_DIST_TIMEOUT_S"  # Settings.dist_timeout_s, which the service passes in
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device  # this rank's device: cuda:LOCAL_RANK, or cpu


def init_distributed(device: str = "auto", timeout_s: float | None = None) -> DistContext:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT): nccl when this rank's device is a GPU, gloo otherwise. Without those variables
    this is one process and no group is made (every helper here then acts on one rank).
    `timeout_s` bounds every collective of a step (the service passes $RLGW_DIST_TIMEOUT_S; 60 s);
    rank 0's announcements between steps wait longer (collectives.PATIENT_TIMEOUT_S)."""
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    where = resolve_device(device, local_rank)
    if not all(k in os.environ for k in TORCHRUN_ENV):
        return DistContext(0, 1, 0, where)
    if where.type == "cuda":
        torch.cuda.set_device(where)
    dist.init_process_group(
        "nccl" if where.type == "cuda" else "gloo",
        timeout=timedelta(seconds=timeout_s),
        device_id=where if where.type == "cuda" else None,
    )
    collectives.make_patient_group()  # for what rank 0 announces (collectives.broadcast_object)
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, where)


def shutdown_distributed() -> None:
    if collectives.initialized():
        dist.destroy_process_group()
        collectives.drop_patient_group()


def is_rank0() -> bool:
    return collectives.rank() == 0


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the classes transformers lists in `_no_split_modules`
    (Qwen2DecoderLayer, LlamaDecoderLayer, ...), else any module named *DecoderLayer."""
    names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    layers = [m for m in model.modules() if type(m).__name__ in names]
    return layers or [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard each decoder layer, then the root (embeddings, final norm, LM head, tied or
    not); parameters become DTensors sharded on dim 0 over the ranks. Call after
    `prepare_model` (device, fp32 master weights, checkpointing) and before making the optimizer.
    Gradients are reduce-scattered as a mean over ranks; the update scales the loss to match."""
    from torch.distributed.fsdp import fully_shard

    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"no decoder layers found in {type(model).__name__} to shard")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def replicate_model(model: torch.nn.Module) -> torch.nn.Module:
    """LoRA over several ranks: every rank holds the whole model (the frozen base and the small
    adapter), wrapped in DDP, which first gives every rank rank 0's parameters and buffers and
    then averages the adapter's gradients over the ranks after each backward, as FSDP2 does for
    sharded ones (the update scales the loss to match). Call where `shard_model` would be."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, broadcast_buffers=False)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a `replicate_model` wrapper (itself otherwise)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def is_distributed_model(model: torch.nn.Module) -> bool:
    """Sharded (`shard_model`) or replicated (`replicate_model`): its gradients are reduced."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, FSDPModule | DistributedDataParallel)


def broadcast_trainable(model: torch.nn.Module) -> None:
    """Rank 0's values of the trainable parameters (a replicated adapter) on every rank."""
    for param in model.parameters():
        if param.requires_grad:
            dist.broadcast(param.data, src=0)


def gather_full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, by HF name, tied weights once (as trainer.models.weights.state_dict),
    on the CPU of rank 0; {} on the other ranks. A collective: every rank must call it."""
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():  # named_parameters yields a tied weight once
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        if is_rank0():
            out[name] = full.detach().to("cpu", copy=True)
        del full
    return out


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor] | None) -> None:
    """Rank 0's full weights (by HF name, as gather_full_state gives them; None elsewhere) into
    every rank's shards, so that only rank 0 needs the version chain (materialize). A tied
    weight comes once, under its first name, and fills its alias too. A collective; on one
    process it simply loads them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    many = collectives.world_size() > 1
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=many, strict=False)
    result = set_model_state_dict(model, state if is_rank0() else {}, options=options)
    names = dict(model.named_parameters())  # one name per tensor, as `state` has them
    missing = [k for k in result.missing_keys if k in names]
    if is_rank0() and missing:
        raise KeyError(f"weights missing from the state loaded: {missing[:5]}")


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's whole state (moments unsharded, on the CPU, keyed by parameter name) on
    rank 0, for trainer.loop.optimizer_state to save; {} elsewhere. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_optimizer_state_dict(model, optimizer, options=options)
    return state if is_rank0() else {}


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state) -> None:
    """full_optimizer_state's dict (on rank 0; None elsewhere) back into every rank's shards.
    Call it before the optimizer's first step: a fresh optimizer's state is made for it then."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    many = collectives.world_size() > 1
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=many)
    set_optimizer_state_dict(model, optimizer, state if is_rank0() else {}, options=options)


def broadcast_samples(samples: list[Sample] | None) -> list[Sample]:
    """Rank 0's samples on every rank (others pass None); the update splits them by rank."""
    if collectives.world_size() == 1:
        return list(samples or [])
    return collectives.broadcast_object(samples if is_rank0() else None)
