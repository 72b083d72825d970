"""Background work inside a serving backend (a stage, a download) yields the CPU to serving."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from .settings import STAGE_NICE_ENV, WorkerSettings

__all__ = ["STAGE_NICE_ENV", "quick_gil_handoff", "yield_cpu_to_serving"]


def yield_cpu_to_serving() -> int | None:
    """Lower the calling thread's CPU priority to RLGW_STAGE_NICE (19 by default): on a backend
    with no spare core the stage then takes the time the forward passes leave, instead of
    slowing them.
    On Linux nice is per thread, and the OpenMP workers that this thread's tensor operations start
    inherit it; the engine loop's thread and its workers keep theirs. The value set (None where
    the platform cannot)."""
    nice = WorkerSettings().stage_nice
    if nice <= 0 or not hasattr(os, "setpriority"):
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        return None
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


@contextlib.contextmanager
def quick_gil_handoff() -> Iterator[None]:
    """While background work runs, hand the GIL back to a waiting thread after 1 ms instead of
    Python's 5 ms: the engine loop's thread takes the GIL back after every tensor operation of a
    forward pass (hundreds per step), and each time the stage's thread holds it, the loop waits
    up to one interval. Process-wide; the previous interval is restored when the last user ends."""
    global _switch_users, _switch_saved
    interval = WorkerSettings().stage_switch_interval_s
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(interval, _switch_saved))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)
