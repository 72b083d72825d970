"""Verified swaps into a real vLLM CPU backend serving in bf16, and staging that does not block it.

One backend started with `--dtype bfloat16` (served probe log-probs are ~2-3e-3 from the fp32
reference: a 1e-4 tolerance would refuse every correct swap). A correct delta is accepted; a
delta of zeros, a file with half of the tensors, and a wrong delta are refused and rolled back,
and the backend serves its old weights again, bitwise, back in routing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from migrations.runner import upgrade
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import RegisteredModel
from rlgw.ports import free_port
from rlgw.registry import register_backend
from rlgw.test_hooks import STAGE_GATE_ENV
from trainer.backends.parity import ProbeScores, reference_scores, served_scores
from trainer.backends.vllm_control import VllmControl
from trainer.models.weights import state_dict
from trainer.swap.coordinator import SwapCoordinator, SwapPlan, SwapReport
from trainer.swap.verification import LOW_PRECISION_CEILING, NOISE_FACTOR
from trainer.weight_update.files import DeltaFile, FullFile

from conftest import MODEL_NAME
from swap_helpers import random_delta, reference_with, write_delta

FP32_TOLERANCE = 1e-4  # the settings' default: what a bf16 backend used to be judged with


class Bf16Backend:
    """One bf16 backend registered in its own database; the deltas it has been swapped to."""

    def __init__(self, db_url: str, url: str, model_dir: Path, gate: Path) -> None:
        self.db_url, self.url, self.model_dir, self.gate = db_url, url, model_dir, gate
        self.http = httpx.Client(timeout=120)
        self.engine = create_engine(db_url)
        # One coordinator for the module, as a trainer keeps one: it keeps the noise it measured.
        self.coordinator = SwapCoordinator(
            self.engine, drain_timeout_s=5, parity_tolerance=FP32_TOLERANCE
        )
        self.applied: list[dict[str, torch.Tensor]] = []

    @property
    def control(self) -> VllmControl:
        return VllmControl(self.http, self.url)

    def reference(self, *extra: dict[str, torch.Tensor]) -> ProbeScores:
        return reference_scores(reference_with(self.model_dir, *self.applied, *extra))

    def swap(self, path: Path, intended: dict[str, torch.Tensor]) -> SwapReport:
        """Swap to the next version, whose trainer-side weights are the current ones plus
        `intended`, by shipping the file at `path` (which may not hold `intended`)."""
        model_id = self.model_id()
        version = len(self.applied)
        plan = SwapPlan(
            model_name=MODEL_NAME,
            model_id=model_id,
            parent_version=version,
            new_version=version + 1,
            update=DeltaFile(path),
            reference_new=self.reference(intended),
            reference_old=self.reference(),
        )
        (backend,) = self.coordinator.backends(model_id)
        report = self.coordinator.swap_backend(backend, plan)
        if report.outcome == "swapped":
            self.applied.append(intended)
        return report

    def model_id(self) -> int:
        with Session(self.engine) as db:
            return db.scalar(select(RegisteredModel.id).where(RegisteredModel.name == MODEL_NAME))

    def state(self) -> tuple[str, int | None]:
        """The backend's routing state and served version in the registry."""
        (backend,) = self.coordinator.backends(self.model_id())
        return backend.state, backend.served_version


@pytest.fixture(scope="module")
def bf16(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Bf16Backend]:
    db_url = make_database()
    upgrade(db_url)
    logs = tmp_path_factory.mktemp("bf16-logs")
    gate = logs / "stage-gate"
    gate.touch()  # stages run through; the staging test removes it to hold one open
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(STAGE_GATE_ENV, str(gate))
        proc = start_backend(
            tiny_model_dir,
            port,
            served_model_name=MODEL_NAME,
            dtype="bfloat16",
            log_path=logs / "vllm.log",
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=420, proc=proc)
        httpx.post(
            f"{url}/v1/completions",
            timeout=300,
            json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 4},
        )
        engine = make_sync_engine(db_url)
        register_backend(
            sync_session_factory(engine), MODEL_NAME, url, model_path=str(tiny_model_dir)
        )
        engine.dispose()
        backend = Bf16Backend(db_url, url, tiny_model_dir, gate)
        yield backend
        backend.engine.dispose()
    finally:
        stop_backend(proc)


def test_the_backend_serves_bf16_and_its_noise_is_beyond_the_fp32_tolerance(bf16):
    assert bf16.control.rpc("rlgw_info")[0]["dtype"] == "bfloat16"
    noise = served_scores(bf16.http, bf16.url, MODEL_NAME).max_abs_diff(bf16.reference())
    assert FP32_TOLERANCE < noise < LOW_PRECISION_CEILING, noise


def test_a_correct_bf16_swap_is_accepted_within_the_measured_band(bf16, tmp_path):
    delta = random_delta(bf16.model_dir, seed=21)
    report = bf16.swap(write_delta(delta, tmp_path / "d.safetensors"), delta)
    assert report.outcome == "swapped", report.reason
    assert report.dtype == "bfloat16"
    assert FP32_TOLERANCE < report.parity_diff <= report.tolerance  # fp32's 1e-4 would refuse
    assert report.parity_old_diff > 10 * report.tolerance  # clearly not the old version
    assert "measure_noise" in report.steps  # the first swap measured the backend's noise
    noise = bf16.coordinator.noise.get(bf16.url).noise
    assert noise == report.parity_diff  # kept for the next swap's band
    assert bf16.state() == ("active", 1)


def _refused_swap(bf16: Bf16Backend, path: Path, intended: dict[str, torch.Tensor]) -> None:
    """Swap with a file that does not hold `intended`: refused, rolled back, serving as before."""
    version = len(bf16.applied)
    noise = bf16.coordinator.noise.get(bf16.url).noise
    checksum = bf16.control.rpc("rlgw_checksum")
    report = bf16.swap(path, intended)
    assert report.outcome == "rolled_back", (report.outcome, report.reason)
    assert report.reason.startswith("parity failed")
    assert report.tolerance == pytest.approx(NOISE_FACTOR * noise)
    assert bf16.control.rpc("rlgw_checksum") == checksum  # the old weights, bitwise
    old = served_scores(bf16.http, bf16.url, MODEL_NAME).max_abs_diff(bf16.reference())
    assert old <= report.tolerance
    assert bf16.state() == ("active", version)  # back in routing, on its old version
    assert bf16.http.get(f"{bf16.url}/weight_info").json()["weight_version"] == str(version)


def test_a_delta_of_zeros_is_refused_and_rolled_back(bf16, tmp_path):
    intended = random_delta(bf16.model_dir, seed=22)
    zeros = {name: torch.zeros_like(value) for name, value in intended.items()}
    _refused_swap(bf16, write_delta(zeros, tmp_path / "zeros.safetensors"), intended)


def test_a_half_applied_delta_is_refused_and_rolled_back(bf16, tmp_path):
    intended = random_delta(bf16.model_dir, seed=23)
    # A crafted file with every other tensor of the intended delta: what a half-done apply serves.
    half = {name: intended[name] for name in sorted(intended)[::2]}
    _refused_swap(bf16, write_delta(half, tmp_path / "half.safetensors"), intended)


def test_a_wrong_delta_is_refused_and_rolled_back(bf16, tmp_path):
    intended = random_delta(bf16.model_dir, seed=24)
    wrong = random_delta(bf16.model_dir, seed=25)
    _refused_swap(bf16, write_delta(wrong, tmp_path / "wrong.safetensors"), intended)


def test_a_request_sent_while_a_stage_runs_is_served_before_the_stage_ends(bf16, tmp_path):
    """The worker stages in a background thread: the engine keeps serving, on the old weights."""
    delta = random_delta(bf16.model_dir, seed=26)
    path = write_delta(delta, tmp_path / "d.safetensors")
    old = bf16.reference()
    bf16.gate.unlink()  # the stage, once prepared, waits for the gate: certainly in progress
    try:
        assert bf16.control.rpc("rlgw_stage", path=str(path), kind="delta") == [
            {"ok": True, "running": True}
        ]
        served = served_scores(bf16.http, bf16.url, MODEL_NAME)  # a request, during the stage
        assert bf16.control.rpc("rlgw_stage_status") == [{"ok": True, "running": True}]
        assert served.max_abs_diff(old) < LOW_PRECISION_CEILING  # the old weights, untouched
        assert served.max_abs_diff(bf16.reference(delta)) > 0.05
    finally:
        bf16.gate.touch()
    while bf16.control.rpc("rlgw_stage_status")[0].get("running"):
        time.sleep(0.05)
    assert bf16.control.rpc("rlgw_stage_status")[0]["ok"] is True
    # The same update, staged again by the coordinator, applies as usual.
    report = bf16.swap(path, delta)
    assert report.outcome == "swapped", report.reason


def test_a_backend_already_far_from_its_reference_is_refused_before_staging(bf16, tmp_path):
    """A coordinator meeting the backend for the first time measures its noise against the old
    reference; one beyond the ceiling (here: the reference of other weights) is not swapped."""
    delta = random_delta(bf16.model_dir, seed=27)
    path = write_delta(delta, tmp_path / "d.safetensors")
    checksum = bf16.control.rpc("rlgw_checksum")
    fresh = SwapCoordinator(bf16.engine, drain_timeout_s=5, parity_tolerance=FP32_TOLERANCE)
    (backend,) = fresh.backends(bf16.model_id())
    version = len(bf16.applied)
    plan = SwapPlan(
        model_name=MODEL_NAME,
        model_id=backend.model_id,
        parent_version=version,
        new_version=version + 1,
        update=DeltaFile(path),
        reference_new=bf16.reference(delta),
        reference_old=bf16.reference(random_delta(bf16.model_dir, seed=28)),  # not what it serves
    )
    report = fresh.swap_backend(backend, plan)
    assert report.outcome == "refused" and "away from its reference" in report.reason
    assert "stage" not in report.steps  # nothing was shipped
    assert bf16.control.rpc("rlgw_checksum") == checksum
    assert bf16.state() == ("active", version)


def test_a_full_sync_of_a_backend_behind_measures_its_noise_on_the_version_it_serves(
    bf16, tmp_path
):
    """A trainer that first meets a bf16 backend two versions behind (a restart, say) has no old
    reference in the plan: it rebuilds the served version's reference and measures the backend's
    noise on it, instead of judging it by a default (too tight for a deep model's bf16 noise)."""
    served = len(bf16.applied)
    skipped, delta = random_delta(bf16.model_dir, seed=29), random_delta(bf16.model_dir, seed=30)
    target = state_dict(reference_with(bf16.model_dir, *bf16.applied, skipped, delta))
    path = tmp_path / "full.safetensors"
    FullFile.write(target, path)
    asked: list[int] = []

    def reference_of(version: int) -> ProbeScores | None:
        asked.append(version)
        return bf16.reference() if version == served else None

    noise = served_scores(bf16.http, bf16.url, MODEL_NAME).max_abs_diff(bf16.reference())
    fresh = SwapCoordinator(bf16.engine, drain_timeout_s=5, parity_tolerance=FP32_TOLERANCE)
    (backend,) = fresh.backends(bf16.model_id())
    plan = SwapPlan(
        model_name=MODEL_NAME,
        model_id=backend.model_id,
        parent_version=served + 2,  # a full sync: the version it installs is its own parent
        new_version=served + 2,
        update=FullFile(path),
        reference_new=bf16.reference(skipped, delta),
        reference_of=reference_of,
    )
    report = fresh.swap_backend(backend, plan)
    assert report.outcome == "swapped", report.reason
    assert asked == [served]  # the version the backend served, rebuilt once
    assert {"served_reference", "measure_noise"} <= set(report.steps)
    # The band is the noise measured on the served version, not the dtype's default:
    assert report.tolerance == pytest.approx(NOISE_FACTOR * noise, rel=0.05)
    measured = fresh.noise.get(bf16.url).noise
    assert measured == report.parity_diff  # the band now follows the new version's noise
    assert FP32_TOLERANCE < report.parity_diff <= report.tolerance
    bf16.applied += [skipped, delta]
    assert bf16.state() == ("active", served + 2)
