"""What a paused backend holds: each request's output tokens so far, and the ones it finished.

A swap pauses vLLM in place (`keep`), reads this state, applies the new weights and resumes, so
that every request in flight continues on the new version (rlgw/swap_boundaries.py). The worker's
model runner keeps, per request it has scheduled and not yet finished, the output token ids it
sampled (`CachedRequestState.output_token_ids`; a preempted request keeps its state), so with the
engine paused, their counts are exactly the tokens sampled under the old weights. A request the
worker has never seen has sampled none.

A request the worker finished and dropped is told apart from one it never saw by a memory of the
requests it finished (the ids of each step's `finished_req_ids`, the last FINISHED_MEMORY of them,
at most FINISHED_WINDOW_S old): the plugin (rlgw_vllm/plugin.py) installs the hook that notes them
at start-up, before the first step.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

FINISHED_MEMORY = 20_000  # request ids
FINISHED_WINDOW_S = 600.0  # a finished request older than this is forgotten

_finished: OrderedDict[str, float] = OrderedDict()  # request id -> when the worker dropped it
_lock = threading.Lock()
_installed = False


def note_finished(request_ids: Iterable[str]) -> None:
    """Remember requests the engine finished (called by the hook at each step)."""
    now = time.monotonic()
    with _lock:
        for rid in request_ids:
            _finished[rid] = now
            _finished.move_to_end(rid)
        while len(_finished) > FINISHED_MEMORY:
            _finished.popitem(last=False)


def recently_finished() -> list[str]:
    """The finished requests still remembered (oldest first)."""
    horizon = time.monotonic() - FINISHED_WINDOW_S
    with _lock:
        while _finished and next(iter(_finished.values())) < horizon:
            _finished.popitem(last=False)
        return list(_finished)


def install() -> bool:
    """Note the finished requests of every step of vLLM's model runner (idempotent). False when
    this vLLM has no such hook point (the state then says it cannot tell finished requests)."""
    global _installed
    if _installed:
        return True
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return False
    original = getattr(GPUModelRunner, "_update_states", None)
    if original is None:
        return False

    @functools.wraps(original)
    def update_states(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        finished = getattr(scheduler_output, "finished_req_ids", None)
        if finished:
            note_finished(finished)
        return original(self, scheduler_output, *args, **kwargs)

    GPUModelRunner._update_states = update_states  # type: ignore[method-assign]
    _installed = True
    return True


class GenerationState:
    """Mixed into vLLM's worker through WeightUpdateExtension (`self.model_runner`: its runner)."""

    def rlgw_generation_state(self) -> dict[str, Any]:
        """Each request the worker holds -> its output tokens so far, and the requests it
        finished lately. Meaningful while the engine is paused (no step runs meanwhile)."""
        requests = getattr(self.model_runner, "requests", None)  # type: ignore[attr-defined]
        if requests is None:
            return {"ok": False, "error": "this vLLM's model runner keeps no request states"}
        running = {
            str(rid): len(getattr(state, "output_token_ids", ()) or ())
            for rid, state in list(requests.items())
        }
        return {
            "ok": True,
            "tracking": _installed,
            "running": running,
            "finished": recently_finished() if _installed else [],
        }
