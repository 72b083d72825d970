"""What a paused backend reports and how a swap stores it: the worker's counts of the requests it
holds and its memory of finished ones (rlgw_vllm/generation_state.py), as request keys
(trainer/swap/boundary.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlgw import swap_boundaries as sb
from rlgw_vllm import generation_state
from trainer.swap.boundary import counts_from

HEX = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


@pytest.fixture
def memory(monkeypatch):
    monkeypatch.setattr(generation_state, "_finished", type(generation_state._finished)())
    monkeypatch.setattr(generation_state, "_installed", True)
    return generation_state


def test_the_worker_reports_each_held_request_with_its_output_tokens_so_far(memory):
    runner = SimpleNamespace(
        requests={
            f"chatcmpl-chatcmpl-{HEX}-1a2b3c4d": SimpleNamespace(output_token_ids=[5] * 17),
            f"3_chatcmpl-chatcmpl-{HEX}-1a2b3c4d": SimpleNamespace(output_token_ids=[]),
        }
    )
    memory.note_finished([f"cmpl-cmpl-{OTHER}-0-99aa00bb"])
    state = generation_state.GenerationState.rlgw_generation_state(
        SimpleNamespace(model_runner=runner)
    )
    assert state["ok"] and state["tracking"]
    running, finished = counts_from(state)
    assert running == {f"{HEX}:0": 17, f"{HEX}:3": 0}
    assert finished == [f"{OTHER}:0"]
    # The record ids the gateway gives those choices name the same requests.
    assert sb.request_key(f"chatcmpl-{HEX}") == f"{HEX}:0"
    assert sb.request_key(f"chatcmpl-{HEX}-3") == f"{HEX}:3"


def test_the_memory_of_finished_requests_is_bounded_in_count_and_age(memory, monkeypatch):
    monkeypatch.setattr(generation_state, "FINISHED_MEMORY", 3)
    memory.note_finished(["a", "b", "c", "d"])
    assert memory.recently_finished() == ["b", "c", "d"]  # the oldest forgotten first
    monkeypatch.setattr(generation_state, "FINISHED_WINDOW_S", -1.0)
    assert memory.recently_finished() == []  # all older than the window


def test_a_worker_without_the_hook_says_it_cannot_tell_finished_requests(monkeypatch):
    monkeypatch.setattr(generation_state, "_installed", False)
    runner = SimpleNamespace(requests={})
    state = generation_state.GenerationState.rlgw_generation_state(
        SimpleNamespace(model_runner=runner)
    )
    assert state["tracking"] is False and state["finished"] == []


def test_the_hook_notes_the_finished_requests_of_each_step(memory, monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    seen = []
    monkeypatch.setattr(GPUModelRunner, "_update_states", lambda self, out: seen.append(out))
    monkeypatch.setattr(generation_state, "_installed", False)
    assert generation_state.install()
    step = SimpleNamespace(finished_req_ids={"r1", "r2"})
    GPUModelRunner._update_states(object(), step)
    assert seen == [step]  # vLLM's own method still runs
    assert sorted(memory.recently_finished()) == ["r1", "r2"]
