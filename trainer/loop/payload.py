"""What a new version ships to the backends: the whole LoRA adapter, full weights every
`anchor_every`-th version (so that deltas never drift), or the delta from the served weights in
`delta_dtype` (bf16 by default: half the bytes; the reference adopts the rounded version, so
that parity stays exact and the rounding is carried into the next delta: docs/training.md,
"Weight sync")."""

from __future__ import annotations

import torch

from ..models.weights import adopt_delta, delta
from ..weight_update.base import WeightUpdate
from ..weight_update.files import DeltaFile, FullFile
from ..weight_update.lora import LoraAdapter


def version_payload(
    lora: bool,
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    served: dict[str, torch.Tensor],
    version: int,
    anchor_every: int,
    delta_dtype: str = "float32",
) -> tuple[torch.nn.Module | dict[str, torch.Tensor], type[WeightUpdate]]:
    """(payload, update kind) of `version`: `model` is the reference (holding `weights`), `served`
    the weights the backends serve now. A delta stored in a narrower dtype than fp32 is adopted:
    `model` then holds served + delta, exactly what the backends will serve."""
    if lora:  # the whole adapter, saved from the reference
        return model, LoraAdapter
    if version % anchor_every == 0:  # full weights: no drift
        return weights, FullFile
    dtype = getattr(torch, delta_dtype)
    update = delta(weights, served, dtype)
    if dtype != torch.float32:
        adopt_delta(model, served, update)
    return update, DeltaFile
