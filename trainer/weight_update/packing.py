"""The trainer's side of a streamed full-weights update: the tensors in wire form and their buckets.

vLLM's weight-transfer engines (`vllm.distributed.weight_transfer`) stream checkpoint-format
weights: every parameter once, by its Hugging Face name, in the dtype the server runs in, and
the worker loads them with the model's own `load_weights` (which knows the fused q/k/v and
gate/up layouts). Packed NCCL transfers concatenate consecutive tensors as bytes into buckets
of about `buffer_bytes`; both sides cut the stream at the same places from the per-round
metadata (`NCCLWeightTransferUpdateInfo`: names, dtype names, shapes), so the order and the
metadata must agree exactly. No vLLM import here: the GPU check (bench/gpu_check.py) packs and
broadcasts with these functions on a machine without vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WireTensor:
    """One parameter as it travels: name, shape and dtype the worker sizes its buffer by."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")  # the worker does getattr(torch, name)


def wire_tensors(
    weights: dict[str, torch.Tensor],
    order: list[str],
    dtype: torch.dtype,
    device: torch.device | str,
) -> dict[str, torch.Tensor]:
    """The weights in `order` (the checkpoint's), cast to the served dtype, contiguous, on the
    sending device: exactly what goes on the wire. A tensor already in that form is not copied."""
    return {
        name: weights[name].detach().to(device=device, dtype=dtype).contiguous() for name in order
    }


def metadata(tensors: dict[str, torch.Tensor]) -> list[WireTensor]:
    return [WireTensor(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]


def update_info(meta: list[WireTensor]) -> dict[str, list]:
    """The per-round metadata in the form of vLLM's `NCCLWeightTransferUpdateInfo`."""
    return {
        "names": [m.name for m in meta],
        "dtype_names": [m.dtype_name for m in meta],
        "shapes": [list(m.shape) for m in meta],
    }


def buckets(meta: list[WireTensor], buffer_bytes: int) -> list[list[WireTensor]]:
    """Where a packed stream is cut: tensors are added to a bucket until its size passes
    `buffer_bytes`, then the bucket is sent (vLLM's `packed_tensor.pack_tensors` on the trainer
    and `packed_nccl_broadcast_consumer` on the worker cut the same way)."""
    out: list[list[WireTensor]] = []
    current: list[WireTensor] = []
    size = 0
    for m in meta:
        current.append(m)
        size += m.nbytes
        if size > buffer_bytes:
            out.append(current)
            current, size = [], 0
    if current:
        out.append(current)
    return out


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One bucket as one flat uint8 tensor: each tensor's bytes, back to back."""
    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])


def unpack(packed: torch.Tensor, meta: list[WireTensor]) -> dict[str, torch.Tensor]:
    """The inverse of `pack`, from the metadata alone (what the receiving side knows)."""
    pieces = packed.split([m.nbytes for m in meta])
    return {m.name: p.view(m.dtype).view(m.shape) for m, p in zip(meta, pieces, strict=True)}
