"""The weight-update seam: which update a backend gets, and what a file update ships."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from trainer.backends.parity import ProbeScores
from trainer.backends.vllm_control import ControlError, VllmControl
from trainer.swap.coordinator import SwapPlan
from trainer.weight_update import FILE_KINDS, DeltaFile, FullFile, file_update

SCORES = ProbeScores((-1.0,), 0, -1.0)


def plan(update, fallback=None) -> SwapPlan:
    return SwapPlan("tiny", 1, 4, 5, update, SCORES, SCORES, fallback)


def test_a_delta_goes_to_backends_at_its_parent_and_full_weights_to_the_others():
    delta, full = DeltaFile("d"), FullFile("f")
    assert plan(delta, full).update_for(4) is delta
    assert plan(delta, full).update_for(3) is full
    assert plan(delta, full).update_for(None) is full


def test_without_full_weights_a_backend_behind_gets_nothing():
    assert plan(DeltaFile("d")).update_for(3) is None


def test_full_weights_go_to_every_backend():
    full = FullFile("f")
    assert {plan(full).update_for(v) for v in (None, 0, 4, 9)} == {full}


def test_a_fallback_must_not_need_the_parent():
    with pytest.raises(ValueError, match="fallback"):
        plan(DeltaFile("d"), DeltaFile("e"))


def test_stored_versions_map_to_their_file_updates():
    assert {"delta": DeltaFile, "full": FullFile} == FILE_KINDS
    assert isinstance(file_update("delta", "p"), DeltaFile)
    assert file_update("full", "p").path == "p"


def test_a_file_update_writes_its_payload_and_says_how_big(tmp_path):
    update = DeltaFile.write({"w": torch.ones(4, 4)}, tmp_path / "d.safetensors")
    assert update.nbytes == (tmp_path / "d.safetensors").stat().st_size > 64
    assert torch.equal(update.tensors()["w"], torch.ones(4, 4))


def test_a_file_update_stages_its_path_and_kind_and_sums_the_workers_bytes():
    calls = []

    def worker(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        return httpx.Response(200, json={"results": [{"ok": True, "bytes": 10}, {"bytes": 5}]})

    backend = VllmControl(httpx.Client(transport=httpx.MockTransport(worker)), "http://b")
    staged = FullFile("/v/f.safetensors").stage(backend)
    assert staged.nbytes == 15 and len(staged.detail) == 2
    assert calls == [
        {"method": "rlgw_stage", "kwargs": {"path": "/v/f.safetensors", "kind": "full"}}
    ]


def test_a_worker_that_refuses_raises_control_error():
    refused = httpx.MockTransport(
        lambda _: httpx.Response(200, json={"results": [{"ok": False, "error": "bad shape"}]})
    )
    backend = VllmControl(httpx.Client(transport=refused), "http://b")
    with pytest.raises(ControlError, match="bad shape"):
        DeltaFile("d").apply(backend)


def test_a_stage_in_the_background_is_waited_for_and_its_errors_raised():
    answers = iter(
        [
            {"results": [{"ok": True, "running": True}]},
            {"results": [{"ok": True, "running": True}]},
            {"results": [{"ok": False, "error": "bad shape"}]},
        ]
    )
    methods = []

    def worker(request: httpx.Request) -> httpx.Response:
        methods.append(json.loads(request.content)["method"])
        return httpx.Response(200, json=next(answers))

    backend = VllmControl(httpx.Client(transport=httpx.MockTransport(worker)), "http://b")
    with pytest.raises(ControlError, match="bad shape"):
        DeltaFile("d").stage(backend)
    assert methods == ["rlgw_stage", "rlgw_stage_status", "rlgw_stage_status"]
