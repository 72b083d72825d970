"""A backend's background work (stage, download) runs at a lower CPU priority than serving."""

import os
import threading

import pytest

from rlgw_vllm.cpu_priority import STAGE_NICE_ENV, yield_cpu_to_serving

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "setpriority"), reason="needs per-thread nice (Linux)"),
    pytest.mark.skipif(
        hasattr(os, "getpriority") and os.getpriority(os.PRIO_PROCESS, 0) != 0,
        reason="the test process is already niced",
    ),
]


def _in_a_thread() -> tuple[int | None, int]:
    """What yield_cpu_to_serving returns in a new thread, and that thread's nice value after."""
    seen: dict[str, int | None] = {}

    def work() -> None:
        seen["set"] = yield_cpu_to_serving()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return seen["set"], seen["nice"]  # type: ignore[return-value]


def test_only_the_calling_thread_is_lowered(monkeypatch):
    monkeypatch.delenv(STAGE_NICE_ENV, raising=False)
    value, nice = _in_a_thread()
    assert value == nice == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # serving keeps its


def test_the_nice_value_is_configurable_and_0_turns_it_off(monkeypatch):
    monkeypatch.setenv(STAGE_NICE_ENV, "7")
    assert _in_a_thread() == (7, 7)
    monkeypatch.setenv(STAGE_NICE_ENV, "0")
    assert _in_a_thread() == (None, 0)
