"""When the native weight transfer is taken, and the reason given when it is not."""

from __future__ import annotations

import httpx
import torch

from rlgw.ports import free_port
from rlgw.settings import Settings
from trainer.backends.parity import ProbeScores
from trainer.backends.vllm_control import VllmControl
from trainer.publishing.publish import swap_metrics
from trainer.swap.coordinator import SwapPlan, SwapReport
from trainer.weight_update.files import DeltaFile, FullFile
from trainer.weight_update.native_offer import native_offer
from trainer.weight_update.native_probe import ServerInfo, server_problems, trainer_problems
from trainer.weight_update.nccl import IpcTransfer, NcclTransfer
from trainer.weight_update.transfer_links import TransferLinks

SCORES = ProbeScores((-1.0,), 0, -1.0)
GPU_NCCL = ServerInfo("cuda", "nccl", torch.bfloat16, 1, insecure_serialization=False)
LOCAL, REMOTE = "http://127.0.0.1:8001", "http://10.1.2.3:8001"


def test_a_cuda_backend_started_with_the_matching_config_has_no_problem():
    assert server_problems("nccl", GPU_NCCL, LOCAL, None) == []
    assert server_problems("nccl", GPU_NCCL, REMOTE, "10.1.2.9") == []


def test_a_cpu_backend_without_the_flag_says_both():
    cpu = ServerInfo("cpu", None, torch.float32, 1, insecure_serialization=False)
    problems = server_problems("nccl", cpu, LOCAL, None)
    assert problems == [
        "the backend runs on cpu, not CUDA",
        'the backend was started without --weight-transfer-config \'{"backend": "nccl"}\'',
    ]


def test_a_backend_configured_for_another_engine_is_not_taken():
    (problem,) = server_problems("ipc", GPU_NCCL, LOCAL, None)[:1]
    assert problem == "the backend's weight transfer is 'nccl', not 'ipc'"


def test_a_remote_backend_needs_an_address_of_the_trainer_for_nccl():
    (problem,) = server_problems("nccl", GPU_NCCL, REMOTE, None)
    assert "RLGW_WEIGHT_TRANSFER_HOST" in problem


def test_ipc_needs_the_same_host_and_pickled_handles_allowed():
    ipc = ServerInfo("cuda", "ipc", torch.bfloat16, 1, insecure_serialization=False)
    assert server_problems("ipc", ipc, REMOTE, None) == [
        "CUDA IPC needs the backend on the trainer's host (and GPU)",
        "CUDA IPC handles travel pickled over HTTP: the backend needs "
        "VLLM_ALLOW_INSECURE_SERIALIZATION=1",
    ]
    allowed = ServerInfo("cuda", "ipc", torch.bfloat16, 1, insecure_serialization=True)
    assert server_problems("ipc", allowed, LOCAL, None) == []


def test_a_trainer_without_cuda_cannot_send():
    assert trainer_problems(torch.device("cpu")) == ["the trainer has no CUDA device"]


def test_the_server_info_json_is_read_for_device_flag_dtype_and_workers():
    info = ServerInfo.parse(
        {
            "vllm_config": {
                "device_config": {"device": "cuda"},
                "model_config": {"dtype": "torch.bfloat16"},
                "weight_transfer_config": {"backend": "ipc"},
            },
            "vllm_env": {"VLLM_ALLOW_INSECURE_SERIALIZATION": True},
        },
        world_size=4,
    )
    assert info == ServerInfo("cuda", "ipc", torch.bfloat16, 4, insecure_serialization=True)


def plan(preferred) -> SwapPlan:
    return SwapPlan("tiny", 1, 4, 5, DeltaFile("d"), SCORES, SCORES, FullFile("f"), preferred)


def test_an_unreachable_backend_gets_its_files_with_every_reason():
    links = TransferLinks("nccl", device=torch.device("cpu"), timeout_s=5)
    weights = {"w": torch.zeros(2)}
    transfer = NcclTransfer(links, weights, expected={"w": (2,)})
    backend = VllmControl(httpx.Client(timeout=5), f"http://127.0.0.1:{free_port()}")  # nothing
    update, reason = plan(transfer).choose(backend, served_version=4)
    assert isinstance(update, DeltaFile)  # the backend serves the parent: its delta
    assert reason.startswith("nccl not used: the trainer has no CUDA device; ")
    assert "GET /server_info" in reason
    update, _ = plan(transfer).choose(backend, served_version=2)
    assert isinstance(update, FullFile)  # behind: the full weights, as without the transfer


def test_without_a_preferred_update_the_plan_chooses_as_before():
    assert plan(None).choose(VllmControl(httpx.Client(), LOCAL), 4)[1] is None


def test_the_native_transfer_is_never_the_default():
    assert Settings().weight_transfer == "files"
    assert native_offer("files", checkpoint=None, host=None, timeout_s=5) is None
    offer = native_offer("ipc", checkpoint=None, host=None, timeout_s=5)
    assert isinstance(offer.update({"w": torch.zeros(1)}, None), IpcTransfer)


def test_a_version_keeps_why_backends_did_not_take_the_native_transfer():
    reports = [
        SwapReport(1, LOCAL, outcome="swapped", fallback="nccl not used: the backend runs on cpu"),
        SwapReport(2, REMOTE, outcome="swapped"),
    ]
    metrics = swap_metrics(reports)
    assert metrics["transfer_fallbacks"] == {"1": "nccl not used: the backend runs on cpu"}
    assert "transfer_fallbacks" not in swap_metrics(reports[1:])
