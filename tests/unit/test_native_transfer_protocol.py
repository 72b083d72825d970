"""What the trainer sends a backend through vLLM's native weight transfer, call by call.

No GPU build of vLLM runs here, so the backend is vLLM's own RL router
(`vllm.entrypoints.rl.online.api_router`: the real routes and their body schemas) in front of
a stand-in engine client that records each call, or fails one phase on purpose: a fake vLLM
endpoint used ONLY to check the request sequence and payloads the trainer sends. /server_info
answers what a GPU server started with --weight-transfer-config says (the fields the probe
reads, in the shape a real CPU server's answer has). The data plane (an NCCL broadcast) cannot
run on a CPU: `SentWeights` stands in for it, driving the same client calls in the order
vLLM's `NCCLTrainerWeightTransferEngine.send_weights` does and keeping what it would broadcast.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import create_engine, text
from starlette.testclient import TestClient
from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine
from vllm.entrypoints.rl.online.api_router import router as vllm_rl_router

from migrations.runner import upgrade
from trainer.backends.parity import ProbeScores
from trainer.backends.vllm_control import ControlError, VllmControl
from trainer.swap.coordinator import SwapCoordinator, SwapPlan, failed_label
from trainer.weight_update.base import WeightsUnknown
from trainer.weight_update.files import FullFile
from trainer.weight_update.nccl import NcclTransfer
from trainer.weight_update.packing import metadata, update_info
from trainer.weight_update.sync_client import ControlSyncClient
from trainer.weight_update.transfer_links import TransferLinks

WORKERS = 2  # TP 2: the group is the trainer and two workers


class RecordingEngine:
    """The engine client behind vLLM's router: records each call; `fail` names a phase that
    raises (the fault a real server would produce only by breaking)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: str | None = None
        parallel = type("Parallel", (), {"world_size_across_dp": WORKERS, "world_size": WORKERS})
        self.vllm_config = type("Config", (), {"parallel_config": parallel})()

    def _record(self, phase: str, payload: Any = None) -> None:
        self.calls.append((phase, payload))
        if self.fail == phase:
            raise RuntimeError(f"{phase} broke")

    async def init_weight_transfer_engine(self, request) -> None:
        self._record("init", request.init_info)

    async def start_weight_update(self) -> None:
        self._record("start")

    async def update_weights(self, request) -> None:
        self._record("update", request.update_info)

    async def finish_weight_update(self, weight_version) -> None:
        self._record("finish", weight_version)

    async def shutdown_weight_transfer_engine(self) -> None:
        self._record("shutdown")

    # what a swap around the transfer uses: pause, resume and the weight label
    async def pause_generation(self, mode, clear_cache) -> None:
        self._record("pause", mode)

    async def resume_generation(self) -> None:
        self._record("resume")

    async def update_weight_version(self, new_version: str) -> None:
        self._record("label", new_version)

    async def get_weight_version(self) -> str:
        labels = [payload for phase, payload in self.calls if phase == "label"]
        return labels[-1] if labels else "0"


def gpu_server_info() -> dict:
    return {
        "vllm_config": {
            "device_config": {"device": "cuda"},
            "model_config": {"dtype": "torch.bfloat16"},
            "weight_transfer_config": {"backend": "nccl"},
        },
        "vllm_env": {"VLLM_SERVER_DEV_MODE": True},
    }


@pytest.fixture
def server() -> RecordingEngine:
    return RecordingEngine()


@pytest.fixture
def backend(server: RecordingEngine) -> VllmControl:
    app = FastAPI()
    app.state.engine_client = server
    app.include_router(vllm_rl_router)

    @app.get("/server_info")
    def server_info() -> JSONResponse:
        return JSONResponse(gpu_server_info())

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:  # an idle server: the drain ends at once
        return PlainTextResponse("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache() -> JSONResponse:
        server.calls.append(("reset_prefix_cache", None))
        return JSONResponse({})

    client = TestClient(app, raise_server_exceptions=False)
    return VllmControl(client, "http://testserver")


class SentWeights(TrainerWeightTransferEngine):
    """Stand-in for vLLM's NCCL trainer engine on a CPU: the same client calls in the same
    order (init at the rendezvous; start, update with the round's metadata, finish per round),
    and the tensors it would broadcast kept in `rounds`."""

    rounds: list[dict[str, torch.Tensor]]

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        raise NotImplementedError  # opened by `open_sent_weights` below

    def send_weights(self) -> None:
        self.client.start_weight_update()
        self.client.update_weights(update_info(metadata(dict(self.source))))
        self.rounds.append({name: t.clone() for name, t in self.source})
        self.client.finish_weight_update()


def links_with_stand_in(opened: list[SentWeights]) -> TransferLinks:
    def open_sent_weights(method, host, workers, client, source):
        client.init_weight_transfer_engine(
            {
                "master_address": host,
                "master_port": 29500,
                "rank_offset": 1,
                "world_size": 1 + workers,
            }
        )
        engine = SentWeights(client=client, source=source)
        engine.rounds = []
        opened.append(engine)
        return engine

    # The trainer "has" a GPU here only in name: the stand-in never touches CUDA.
    return TransferLinks(
        "nccl", device=torch.device("cpu"), host="127.0.0.1", open_engine=open_sent_weights
    )


def weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=gen),
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 12, generator=gen),
        "model.norm.weight": torch.randn(8, generator=gen),
    }


def shapes(w: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in w.items()}


def phases(server: RecordingEngine) -> list[str]:
    return [phase for phase, _ in server.calls]


# ----------------------------------------------------------------------------- the client


def test_the_control_client_speaks_vllms_routes_with_their_bodies(backend, server):
    client = ControlSyncClient(backend)
    client.init_weight_transfer_engine({"master_address": "10.0.0.5", "world_size": 3})
    client.start_weight_update()
    client.update_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 2]]})
    client.finish_weight_update()
    client.shutdown_weight_transfer_engine()
    assert server.calls == [
        ("init", {"master_address": "10.0.0.5", "world_size": 3}),
        ("start", None),
        ("update", {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 2]]}),
        ("finish", None),  # never a weight version: the swap labels it after parity
        ("shutdown", None),
    ]


def test_ipc_handles_travel_pickled_as_vllms_worker_expects(backend, server):
    ControlSyncClient(backend).update_weights(
        {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[1]], "ipc_handles": [{"u": (1,)}]}
    )
    ((_, sent),) = server.calls
    assert "ipc_handles" not in sent and isinstance(sent["ipc_handles_pickled"], str)


def test_vllms_own_trainer_init_posts_the_workers_nccl_init_info(backend, server):
    links = TransferLinks("nccl", device=torch.device("cpu"), host="127.0.0.1", timeout_s=60)
    with pytest.raises(ControlError, match="nccl rendezvous .* failed"):  # no GPU to open rank 0
        links.link(backend)
    ((phase, init_info),) = server.calls
    assert phase == "init"
    assert init_info["master_address"] == "127.0.0.1" and init_info["rank_offset"] == 1
    assert init_info["world_size"] == 1 + WORKERS  # the trainer and every worker
    assert init_info["packed"] is True


# ----------------------------------------------------------------------------- a swap's calls


def test_a_swap_sends_one_round_of_full_bf16_weights_in_order(backend, server):
    opened: list[SentWeights] = []
    new = weights(1)
    update = NcclTransfer(links_with_stand_in(opened), new, expected=shapes(new))
    staged = update.stage(backend)
    assert phases(server) == ["init"]  # the rendezvous, outside the pause
    assert staged.nbytes == sum(t.numel() * 2 for t in new.values())
    assert staged.detail["dtype"] == "torch.bfloat16" and staged.detail["workers"] == WORKERS
    update.apply(backend)
    update.commit(backend)
    assert phases(server) == ["init", "start", "update", "finish"]
    sent_info = server.calls[2][1]
    assert sent_info == {
        "names": list(new),
        "dtype_names": ["bfloat16"] * 3,
        "shapes": [list(t.shape) for t in new.values()],
    }
    (sent,) = opened[0].rounds
    assert list(sent) == list(new)
    assert all(torch.equal(sent[k], new[k].to(torch.bfloat16)) for k in new)


def test_the_link_is_opened_once_per_backend(backend, server):
    links = links_with_stand_in([])
    for seed in (1, 2):
        w = weights(seed)
        update = NcclTransfer(links, w, expected=shapes(w))
        update.stage(backend)
        update.apply(backend)
    assert phases(server) == ["init", "start", "update", "finish", "start", "update", "finish"]


def test_weights_that_do_not_fit_the_checkpoint_are_refused_before_anything_is_sent(
    backend, server
):
    new = weights(1)
    expected = {**shapes(new), "model.norm.weight": (9,)}
    with pytest.raises(ControlError, match="model.norm.weight: shape"):
        NcclTransfer(links_with_stand_in([]), new, expected=expected).stage(backend)
    assert server.calls == []


def test_a_refused_start_leaves_the_weights_untouched(backend, server):
    new = weights(1)
    update = NcclTransfer(links_with_stand_in([]), new, expected=shapes(new))
    update.stage(backend)
    server.fail = "start"
    with pytest.raises(ControlError, match="start_weight_update refused"):
        update.apply(backend)


def test_a_round_broken_after_its_start_leaves_the_weights_unknown(backend, server):
    links = links_with_stand_in([])
    new = weights(1)
    update = NcclTransfer(links, new, expected=shapes(new))
    update.stage(backend)
    server.fail = "update"
    with pytest.raises(WeightsUnknown, match="after /start_weight_update"):
        update.apply(backend)
    server.fail = None
    update.stage(backend)  # the broken group was dropped: a new rendezvous
    assert phases(server)[-1] == "init"


# ----------------------------------------------------------------------------- rollback


def test_a_rollback_sends_the_parent_weights_again(backend, server):
    opened: list[SentWeights] = []
    parent, new = weights(0), weights(1)
    update = NcclTransfer(
        links_with_stand_in(opened), new, expected=shapes(new), parent=lambda: parent
    )
    update.stage(backend)
    update.apply(backend)
    update.rollback(backend)
    assert phases(server) == ["init", "start", "update", "finish", "start", "update", "finish"]
    first, second = opened[0].rounds
    assert all(torch.equal(first[k], new[k].to(torch.bfloat16)) for k in new)
    assert all(torch.equal(second[k], parent[k].to(torch.bfloat16)) for k in parent)


def test_without_parent_weights_a_rollback_refuses_and_sends_nothing(backend, server):
    new = weights(1)
    update = NcclTransfer(links_with_stand_in([]), new, expected=shapes(new))
    update.stage(backend)
    update.apply(backend)
    before = list(server.calls)
    with pytest.raises(ControlError, match="keeps no copy of the old weights"):
        update.rollback(backend)
    assert server.calls == before


def test_a_rollback_whose_round_breaks_is_a_control_error(backend, server):
    parent, new = weights(0), weights(1)
    update = NcclTransfer(links_with_stand_in([]), new, expected=shapes(new), parent=lambda: parent)
    update.stage(backend)
    update.apply(backend)
    server.fail = "update"
    with pytest.raises(ControlError, match="parent weights could not be sent again"):
        update.rollback(backend)


# ----------------------------------------------------------------------------- in a swap


class TakenHere(NcclTransfer):
    """Selected although this trainer has no GPU (the selection is tested on its own): what a
    swap does around a native transfer that breaks."""

    def unusable_on(self, backend: VllmControl) -> str | None:
        return None


def test_a_transfer_broken_inside_the_pause_leaves_the_backend_failed(
    make_database, backend, server
):
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO models (id, name) VALUES (1, 'tiny')"))
        conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (1, :u, 'active', 0)"
            ),
            {"u": backend.url},
        )
    new = weights(1)
    scores = ProbeScores((-1.0,), 0, -1.0)
    transfer = TakenHere(links_with_stand_in([]), new, expected=shapes(new))
    plan = SwapPlan("tiny", 1, 0, 1, FullFile("/never/read"), scores, scores, preferred=transfer)
    server.fail = "update"
    coordinator = SwapCoordinator(
        engine, drain_timeout_s=5, parity_tolerance=1e-4, http=backend.http
    )
    (report,) = coordinator.push(plan)
    with engine.connect() as conn:
        state, reason = conn.execute(text("SELECT state, state_reason FROM backends")).one()
    engine.dispose()

    assert report.kind == "nccl" and report.fallback is None
    assert report.outcome == "failed" and "WeightsUnknown" in report.reason
    assert state == "failed" and "weights unknown" in reason
    # The requests the pause held cannot continue on weights that are neither version: ended.
    assert phases(server)[:6] == ["init", "pause", "start", "update", "pause", "label"]
    assert [mode for phase, mode in server.calls if phase == "pause"] == ["keep", "abort"]
    assert server.calls[-1] == ("label", failed_label(1))  # an admin resume refuses it
    assert "resume" not in phases(server)  # it stays paused: its weights are neither version
