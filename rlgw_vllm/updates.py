"""What a stage leaves for the apply (`Prepared`), and what an apply leaves for a rollback
(`Undo`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

MISSING = object()  # an attribute a module did not have


@dataclass
class ModuleState:
    """What a CPU GEMM dispatch changed on one module: attribute values before and after."""

    module: torch.nn.Module
    old: dict[str, Any]
    new: dict[str, Any]


@dataclass
class Prepared:
    """A staged update, ready to apply."""

    kind: str
    mode: str
    generation: int  # the served weights it was prepared against
    names: list[str]  # affected vLLM parameters
    update: dict[str, torch.Tensor]  # inplace: values to add (delta) or copy (full)
    new_data: dict[str, torch.Tensor] = field(default_factory=dict)  # swap: new tensors
    modules: list[ModuleState] = field(default_factory=list)  # swap: new packed GEMMs
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # inplace: old values
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Undo:
    """How to put back the weights from before the last apply."""

    mode: str
    names: list[str]
    old_data: dict[str, torch.Tensor] = field(default_factory=dict)  # swap
    modules: list[ModuleState] = field(default_factory=list)  # swap
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # inplace
