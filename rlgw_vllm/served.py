"""The state a weight-update extension keeps on the vLLM worker it is mixed into, and its view of
the served model. Every mixin of `WeightUpdateExtension` (rlgw_vllm/extension.py) stands on this:
the attributes live on the worker object, prefixed `_rlgw_` so as never to meet vLLM's own.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .settings import WorkerSettings
from .updates import Prepared, Undo


class ServedModel:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner."""

    _rlgw_staged: Prepared | None = None
    _rlgw_undo: Undo | None = None
    _rlgw_expected: dict[str, tuple[int, ...]] | None = None
    _rlgw_generation: int = 0  # bumped whenever the served weights change
    _rlgw_targets: dict[tuple[str, frozenset[str]], frozenset[str]] | None = None
    # Tensors no longer served (replaced weights, used scratch), reused by the next stage: a fresh
    # allocation costs page faults (0.7 s for 1.4 GB here), zeroing a used buffer 0.07 s.
    _rlgw_pool: dict[str, list[torch.Tensor]] | None = None
    _rlgw_reused = 0  # buffers taken from the pool by the current stage
    _rlgw_fetch: Any = None  # rlgw_vllm.fetch.BackgroundFetch: a version file on its way (HTTP)
    _rlgw_fetched: tuple[str, dict[str, Any]] | None = None  # (sha256, report) of the last one
    _rlgw_adapter_fetch: Any = None  # rlgw_vllm.fetch.BackgroundAdapterFetch: an adapter (HTTP)
    _rlgw_serving_lock: threading.RLock | None = None  # held by forward steps (see the docstring)
    _rlgw_stage_thread: threading.Thread | None = None
    _rlgw_stage_report: dict[str, Any] | None = None  # the last stage's outcome

    def _rlgw_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _rlgw_params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self._rlgw_model().named_parameters())

    def _rlgw_check_weights_kept(self) -> str | None:
        for name, param in self._rlgw_params().items():
            if param.numel() == 0:
                return (
                    f"parameter {name} is empty: the rlgw vLLM plugin is not active "
                    "(start the server with `rlgw backend`, or set RLGW_VLLM_KEEP_WEIGHTS=1)"
                )
        return None

    def _rlgw_mode(self) -> str:
        forced = WorkerSettings().apply_mode()
        if forced is not None:
            return forced
        if not is_cpu():
            return "inplace"  # CUDA graphs keep the parameters' addresses
        config = getattr(self.model_runner, "model_config", None)
        eager = bool(getattr(config, "enforce_eager", False))
        return "swap" if eager else "inplace"  # a compiled graph may hold the tensors


def is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
