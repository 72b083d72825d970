"""What a new version ships to the backends: the whole LoRA adapter, full weights every
`anchor_every`-th version (so that deltas never drift), or the delta from the served weights."""

from __future__ import annotations

import torch

from ..models.weights import delta
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
) -> tuple[torch.nn.Module | dict[str, torch.Tensor], type[WeightUpdate]]:
    """(payload, update kind) of `version`: `model` is the reference (holding `weights`), `served`
    the weights the backends serve now."""
    if lora:  # the whole adapter, saved from the reference
        return model, LoraAdapter
    if version % anchor_every == 0:  # full weights: no drift
        return weights, FullFile
    return delta(weights, served), DeltaFile
