"""The native weight transfer a publisher offers its plans when RLGW_WEIGHT_TRANSFER asks for one.

One offer per publisher: it holds the links (one transfer group per backend, kept across
versions) and builds each version's `NcclTransfer` / `IpcTransfer`, checked against the base
checkpoint the backends were launched with (its safetensors headers, when the trainer can read
the model directory; else the weights' own names and shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rlgw.weight_files import checkpoint_shapes

from .native_probe import METHODS, sending_device
from .nccl import NATIVE_TRANSFERS, NativeTransfer
from .transfer_links import TransferLinks

FILES = "files"  # RLGW_WEIGHT_TRANSFER's default: no native transfer is offered


class NativeOffer:
    def __init__(
        self, method: str, *, checkpoint: str | None, host: str | None, timeout_s: float
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"weight transfer must be one of {(FILES, *METHODS)}, not {method!r}")
        self.method = method
        self.links = TransferLinks(method, device=sending_device(), host=host, timeout_s=timeout_s)
        self.checkpoint = checkpoint

    def update(
        self,
        weights: dict[str, torch.Tensor],
        parent: Callable[[], dict[str, torch.Tensor]] | None,
    ) -> NativeTransfer:
        """This version's transfer of `weights`; `parent` gives the weights a rollback re-sends."""
        expected = self._expected() or {name: tuple(t.shape) for name, t in weights.items()}
        return NATIVE_TRANSFERS[self.method](self.links, weights, expected=expected, parent=parent)

    def _expected(self) -> dict[str, tuple[int, ...]]:
        if not self.checkpoint or not Path(self.checkpoint).is_dir():
            return {}
        return checkpoint_shapes(self.checkpoint)

    def close(self) -> None:
        self.links.close()


def native_offer(
    method: str, *, checkpoint: str | None, host: str | None, timeout_s: float
) -> NativeOffer | None:
    """The offer for RLGW_WEIGHT_TRANSFER `method`; None for "files" (the default)."""
    if method == FILES:
        return None
    return NativeOffer(method, checkpoint=checkpoint, host=host, timeout_s=timeout_s)
