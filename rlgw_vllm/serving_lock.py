"""The serving lock: a forward pass never sees a parameter pointed at scratch. Every forward step
holds it; a background stage holds it only while parameters are redirected (see
rlgw_vllm/extension.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .served import ServedModel

FORWARD_METHODS = ("execute_model", "sample_tokens")  # the worker calls that read the weights


def _holding(lock: threading.RLock, method: Callable) -> Callable:
    """`method`, called with `lock` held."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return guarded


class ServingLock(ServedModel):
    def _rlgw_guard_forward(self) -> None:
        """Make every forward step hold the serving lock (once; called between two steps)."""
        if self._rlgw_serving_lock is not None:
            return
        lock = threading.RLock()  # re-entrant: a step may call another guarded method
        for name in FORWARD_METHODS:
            method = getattr(self, name, None)
            if callable(method):
                setattr(self, name, _holding(lock, method))
        self._rlgw_serving_lock = lock

    @contextlib.contextmanager
    def _rlgw_serving_paused(self) -> Iterator[None]:
        """No forward step runs inside this block (parameters may be redirected in it)."""
        lock = self._rlgw_serving_lock
        if lock is None or self._rlgw_stage_thread is not threading.current_thread():
            yield  # staging inside a worker call: no step can run meanwhile anyway
            return
        with lock:
            yield

    def _rlgw_wait_for_stage(self) -> None:
        thread = self._rlgw_stage_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
