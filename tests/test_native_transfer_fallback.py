"""On the real CPU build, a plan that prefers vLLM's native weight transfer swaps with the files
and says why, in the swap report: no GPU, so the NCCL path is never taken here."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import torch
from sqlalchemy import Engine, create_engine, text

from migrations.runner import upgrade
from trainer.backends.parity import reference_scores
from trainer.backends.vllm_control import ControlError, VllmControl
from trainer.models.weights import load_reference_model, state_dict
from trainer.swap.coordinator import SwapCoordinator, SwapPlan
from trainer.weight_update.files import FullFile
from trainer.weight_update.native_offer import native_offer
from trainer.weight_update.nccl import NcclTransfer

from conftest import MODEL_NAME


@pytest.fixture
def registry(make_database, vllm_url, tiny_model_dir) -> Iterator[Engine]:
    """A database whose model is served by the shared CPU server, at version 0."""
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO models (id, name, path) VALUES (1, :m, :p)"),
            {"m": MODEL_NAME, "p": str(tiny_model_dir)},
        )
        conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (1, :u, 'active', 0)"
            ),
            {"u": vllm_url},
        )
    yield engine
    engine.dispose()


def test_a_cpu_backend_gets_its_files_and_the_report_says_why(
    registry, vllm_url, tiny_model_dir, tmp_path
):
    engine = registry
    reference = load_reference_model(tiny_model_dir)
    scores = reference_scores(reference)
    weights = state_dict(reference)
    # Version 0 again, in full: the served weights do not change, so the shared server stays as
    # every other test expects it.
    files = FullFile.write(weights, tmp_path / "v0.safetensors")
    offer = native_offer("nccl", checkpoint=str(tiny_model_dir), host=None, timeout_s=60)
    plan = SwapPlan(
        MODEL_NAME, 1, 0, 0, files, scores, scores, preferred=offer.update(weights, None)
    )
    lines: list[str] = []
    coordinator = SwapCoordinator(
        engine, drain_timeout_s=10, parity_tolerance=1e-4, log=lines.append
    )
    try:
        (report,) = coordinator.push(plan)
    finally:
        coordinator.http.close()

    assert report.outcome == "swapped" and report.kind == "full", report
    assert report.fallback.startswith("nccl not used: the trainer has no CUDA device; ")
    assert "the backend runs on cpu, not CUDA" in report.fallback
    assert "started without --weight-transfer-config" in report.fallback
    assert any(report.fallback in line for line in lines)  # logged, too
    served = offer.links.server(VllmControl(httpx.Client(timeout=60), vllm_url))
    assert (served.device, served.weight_transfer, served.dtype, served.world_size) == (
        "cpu",
        None,
        torch.float32,
        1,
    )


class RefusedAtStage(NcclTransfer):
    """A native transfer the backend seems able to take, whose stage is refused: the fault a
    failed rendezvous gives on a GPU, injected (this CPU server can never get that far)."""

    def unusable_on(self, backend: VllmControl) -> str | None:
        return None

    def stage(self, backend: VllmControl):
        raise ControlError("nccl rendezvous with the backend failed: timed out")


def test_a_native_transfer_refused_at_its_stage_falls_back_to_the_files(
    registry, tiny_model_dir, tmp_path
):
    reference = load_reference_model(tiny_model_dir)
    scores = reference_scores(reference)
    weights = state_dict(reference)
    files = FullFile.write(weights, tmp_path / "v0.safetensors")
    offer = native_offer("nccl", checkpoint=str(tiny_model_dir), host=None, timeout_s=60)
    refused = RefusedAtStage(offer.links, weights, expected={})
    plan = SwapPlan(MODEL_NAME, 1, 0, 0, files, scores, scores, preferred=refused)
    coordinator = SwapCoordinator(registry, drain_timeout_s=10, parity_tolerance=1e-4)
    try:
        (report,) = coordinator.push(plan)
    finally:
        coordinator.http.close()
    assert report.outcome == "swapped" and report.kind == "full", report
    assert report.fallback == (
        "nccl not used: its stage was refused: nccl rendezvous with the backend failed: timed out"
    )
