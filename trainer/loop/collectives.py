"""What the update needs from torch.distributed: world size, rank, reductions, global grad norm.

Every function is the identity on one process (no process group), so the update has one path.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import torch
import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def all_reduce(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """`values` reduced over every rank (in place, and returned): op 'sum' or 'max'."""
    if world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return values


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients to a global L2 norm of max_norm; returns the norm before clipping.

    torch's clip_grad_norm_, split in two so that a norm over FSDP2-sharded gradients (a DTensor
    holding a partial sum) is made whole with full_tensor() before it scales anything (as
    torchtitan does).
    """
    params = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(total, "full_tensor"):  # a DTensor: the norm of this rank's shards only
        total = total.full_tensor()
    norm = float(total)
    if max_norm / (norm + 1e-6) < 1.0:  # torch's own coefficient; at >= 1 it scales by 1.0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)  # skip that pass
    return norm


# What rank 0 alone decides (the next step, a base path, whether moments were kept) travels in a
# second gloo group with this timeout, made by `make_patient_group`: before it sends, rank 0 may
# work alone for minutes (a version rebuilt from its files, a 1.4 GB commit, a swap of every
# backend), longer than the main group's timeout, which a waiting rank would otherwise hit. A
# rank 0 that dies closes its connections and the others fail at once; this bounds a hung one.
PATIENT_TIMEOUT_S = 24 * 3600.0
_patient = None  # the gloo group for broadcast_object (None: the default group)


def make_patient_group(timeout_s: float = PATIENT_TIMEOUT_S) -> None:
    """Make the group broadcast_object uses: every rank must call it, once, after the default
    group exists (distributed.init_distributed does)."""
    global _patient
    _patient = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def drop_patient_group() -> None:
    """Forget the patient group (the process group is being destroyed)."""
    global _patient
    _patient = None


def broadcast_object(value):
    """Rank 0's `value` on every rank (picklable; the others pass anything), waited for as long
    as rank 0 takes to send it (the patient group above)."""
    if world_size() == 1:
        return value
    box = [value if rank() == 0 else None]
    dist.broadcast_object_list(box, src=0, group=_patient)
    return box[0]
