"""Verified swaps over HTTP: a trainer and a vLLM backend with separate state directories and no
shared path. The backend runs in a mount namespace where the trainer's state directory is an
empty tmpfs, so the path the trainer reports for a version file (or a LoRA version's adapter
folder) does not exist for its worker."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import select

from migrations.runner import upgrade
from rlgw.backend_launcher import backend_command, stop_backend, wait_healthy
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import Backend
from rlgw.registry import register_backend
from rlgw.settings import Settings
from trainer.backends.parity import reference_scores, served_scores
from trainer.publishing.publish import Publisher
from trainer.publishing.push import push
from trainer.publishing.versions import file_sha256, version_file
from trainer.swap.coordinator import SwapPlan, SwapReport
from trainer.weight_update.files import DeltaFile
from trainer.weight_update.lora import CONFIG_FILE, WEIGHTS_FILE, LoraAdapter
from trainer.weight_update.remote import RemoteDelta, RemoteLora, ServedFile

from conftest import MODEL_NAME, free_port, gateway_settings
from swap_helpers import random_adapter, random_delta, reference_with, write_delta

TOL = 1e-4
RANK = 8  # the LoRA backend's --max-lora-rank is 8 too


def _can_hide_paths() -> bool:
    """A mount namespace needs CAP_SYS_ADMIN (root here); elsewhere these tests are skipped."""
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(
    not _can_hide_paths(), reason="needs `unshare --mount` (root) to hide the trainer's files"
)


def hidden_from(argv: list[str], hidden: Path) -> list[str]:
    """`argv` run in a mount namespace of its own in which `hidden` is an empty tmpfs."""
    mount = 'mount -t tmpfs -o size=1m rlgw-hidden "$0" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(hidden), *argv]


@dataclass
class Split:
    """A trainer's side (settings, state directory) and a backend that cannot read it."""

    db_url: str
    url: str
    pid: int
    settings: Settings
    trainer_home: Path
    backend_home: Path
    model_dir: Path
    applied: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def reference(self) -> torch.nn.Module:
        return reference_with(self.model_dir, *self.applied)

    def served_diff(self, model: torch.nn.Module, name: str = MODEL_NAME) -> float:
        with httpx.Client(timeout=120) as http:
            return served_scores(http, self.url, name).max_abs_diff(reference_scores(model))

    def adapters(self) -> list[str]:
        """The LoRA adapters the backend has loaded."""
        models = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"]
        return sorted(m["id"] for m in models if m["id"] != MODEL_NAME)

    @contextlib.contextmanager
    def publisher(self) -> Iterator[Publisher]:
        engine = make_sync_engine(self.db_url)
        try:
            with Publisher(self.settings, engine, MODEL_NAME) as publisher:
                yield publisher
        finally:
            engine.dispose()

    def backend_row(self) -> Backend:
        engine = make_sync_engine(self.db_url)
        try:
            with sync_session_factory(engine)() as db:
                return db.scalar(select(Backend).where(Backend.url == self.url))
        finally:
            engine.dispose()

    def visible_to_backend(self, path: Path) -> bool:
        """Whether the backend's processes see `path` (through their own mount namespace)."""
        return Path(f"/proc/{self.pid}/root{path}").exists()


@contextlib.contextmanager
def hidden_backend(make_database, model_dir: Path, tmp_path_factory, **launch) -> Iterator[Split]:
    """A database of its own with one backend registered, started (with `launch`: more
    `backend_command` arguments) where the trainer's state directory is hidden."""
    db_url = make_database()
    upgrade(db_url)
    trainer_home = tmp_path_factory.mktemp("trainer-home")
    backend_home = tmp_path_factory.mktemp("backend-home")
    port = free_port()
    argv, env_add = backend_command(model_dir, port, served_model_name=MODEL_NAME, **launch)
    log_path = tmp_path_factory.mktemp("http-logs") / "vllm.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            hidden_from(argv, trainer_home),
            env={**os.environ, **env_add, "RLGW_HOME": str(backend_home)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=420, proc=proc, log_path=log_path)
        httpx.post(
            f"{url}/v1/completions",
            timeout=300,
            json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 4},
        )
        engine = make_sync_engine(db_url)
        register_backend(sync_session_factory(engine), MODEL_NAME, url, model_path=str(model_dir))
        engine.dispose()
        settings = gateway_settings(db_url).model_copy(
            update={"home": trainer_home, "version_files_bind": "127.0.0.1:0"}
        )
        yield Split(db_url, url, proc.pid, settings, trainer_home, backend_home, model_dir)
    finally:
        stop_backend(proc)


@pytest.fixture(scope="module")
def split(make_database, tiny_model_dir: Path, tmp_path_factory) -> Iterator[Split]:
    with hidden_backend(make_database, tiny_model_dir, tmp_path_factory) as started:
        yield started


def test_a_backend_without_the_trainers_path_is_swapped_over_http(split: Split, tmp_path) -> None:
    delta = random_delta(split.model_dir, seed=11)
    reports = push(
        split.settings,
        split.db_url,
        MODEL_NAME,
        delta=write_delta(delta, tmp_path / "delta.safetensors"),
    )
    split.applied.append(delta)
    (report,) = reports
    stored = version_file(split.trainer_home, MODEL_NAME, 1, "delta")
    assert stored.is_file() and not split.visible_to_backend(stored)
    assert report.outcome == "swapped", report.reason
    assert report.delivery.startswith("http delivery")
    assert "not readable on this host" in report.delivery
    assert report.bytes_shipped == stored.stat().st_size  # every byte came over the network
    assert split.backend_row().served_version == 1
    assert split.served_diff(split.reference()) <= TOL


def test_a_bad_token_is_refused_and_the_backend_keeps_serving(split: Split) -> None:
    path = version_file(split.trainer_home, MODEL_NAME, 900, "delta")
    DeltaFile.write(random_delta(split.model_dir, seed=900), path)
    old = split.reference()
    with split.publisher() as publisher:
        url = f"{publisher.source.base_url}/versions/{MODEL_NAME}/900/delta"
        plan = SwapPlan(
            model_name=MODEL_NAME,
            model_id=publisher.model.id,
            parent_version=1,
            new_version=900,
            update=RemoteDelta(path, url, file_sha256(path), token="not-the-token"),
            reference_new=reference_scores(old),  # never reached
            reference_old=reference_scores(old),
        )
        (backend,) = publisher.coordinator.backends(publisher.model.id)
        report = publisher.coordinator.swap_backend(backend, plan)
        assert publisher.files_server.refusals >= 1
    path.unlink()
    assert report.outcome == "refused"
    assert "HTTP 403" in report.reason and "token was refused" in report.reason
    row = split.backend_row()
    assert (row.state, row.served_version) == ("active", 1)
    assert split.served_diff(old) <= TOL


def test_a_corrupted_download_is_refused_with_nothing_applied(split: Split) -> None:
    delta = random_delta(split.model_dir, seed=12)
    old = split.reference()
    with split.publisher() as publisher:
        parent, reference = publisher.latest()
        reference_old = reference_scores(reference)
        DeltaFile.apply_to(reference, delta)
        published = publisher.record(parent, delta, DeltaFile)
        # Flip one byte deep in the tensor data after the checksum was recorded: the file still
        # parses and has the right shapes, so only the checksum can tell.
        stored = Path(published.update.path)
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 0xFF
        stored.write_bytes(bytes(data))
        try:
            (report,) = publisher.push(published, reference, reference_old=reference_old)
        finally:
            data[len(data) // 2] ^= 0xFF  # the trainer's own copy is whole again
            stored.write_bytes(bytes(data))
    split.applied.append(delta)  # recorded and current: the backend is only behind
    assert report.outcome == "refused"
    assert "checksum mismatch" in report.reason and "nothing was read" in report.reason
    row = split.backend_row()
    assert (row.state, row.served_version) == ("active", 1)
    assert split.served_diff(old) <= TOL
    assert not list((split.backend_home / "downloads").glob("*.part"))


def test_the_next_push_brings_a_backend_behind_forward_with_full_weights_over_http(
    split: Split, tmp_path
) -> None:
    delta = random_delta(split.model_dir, seed=13)
    (report,) = push(
        split.settings,
        split.db_url,
        MODEL_NAME,
        delta=write_delta(delta, tmp_path / "delta.safetensors"),
    )
    split.applied.append(delta)
    assert report.outcome == "swapped", report.reason
    assert report.kind == "full"  # served version 1, the new delta applies to version 2
    assert report.delivery.startswith("http delivery")
    assert split.backend_row().served_version == 3
    assert split.served_diff(split.reference()) <= TOL


def test_a_cut_off_download_resumes_where_it_stopped(split: Split) -> None:
    delta = random_delta(split.model_dir, seed=14)
    with split.publisher() as publisher:
        parent, reference = publisher.latest()
        reference_old = reference_scores(reference)
        DeltaFile.apply_to(reference, delta)
        published = publisher.record(parent, delta, DeltaFile)
        stored = Path(published.update.path)
        data = stored.read_bytes()
        half = len(data) // 2
        downloads = split.backend_home / "downloads"
        downloads.mkdir(exist_ok=True)
        (downloads / f"{file_sha256(stored)}.part").write_bytes(data[:half])  # a cut download
        (report,) = publisher.push(published, reference, reference_old=reference_old)
        sent = publisher.files_server.bytes_sent
    split.applied.append(delta)
    assert report.outcome == "swapped", report.reason
    assert report.bytes_shipped == len(data) - half == sent
    assert split.served_diff(split.reference()) <= TOL


# ---------------------------------------------------------------------- LoRA versions


@pytest.fixture(scope="module")
def lora_split(make_database, tiny_model_dir: Path, tmp_path_factory) -> Iterator[Split]:
    """A backend started for run-time LoRA adapters, where the trainer's directory is hidden
    (`applied` stays empty: a LoRA version's reference is its peft model)."""
    with hidden_backend(make_database, tiny_model_dir, tmp_path_factory, lora_rank=RANK) as s:
        yield s


@pytest.fixture(scope="module")
def lora_v1(lora_split: Split) -> tuple[torch.nn.Module, SwapReport]:
    """LoRA version 1 pushed to the backend over HTTP: its peft model and the swap's report."""
    model = random_adapter(lora_split.model_dir, RANK, seed=21)
    with lora_split.publisher() as publisher:
        parent, reference = publisher.latest()
        published = publisher.record(parent, model, LoraAdapter)
        (report,) = publisher.push(published, model, reference_old=reference_scores(reference))
    return model, report


def _downloaded_adapters(split: Split) -> list[str]:
    """The adapter folders the backend's worker downloaded (named by their weights' sha256)."""
    root = split.backend_home / "downloads" / "adapters"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and "." not in p.name)


def test_a_lora_version_is_swapped_over_http_and_verified(lora_split: Split, lora_v1) -> None:
    model, report = lora_v1
    folder = version_file(lora_split.trainer_home, MODEL_NAME, 1, "lora")
    assert (folder / WEIGHTS_FILE).is_file() and not lora_split.visible_to_backend(folder)
    assert report.outcome == "swapped", report.reason
    assert report.kind == "lora"
    assert report.delivery.startswith("http delivery")
    assert f"{folder / CONFIG_FILE} is not readable on this host" in report.delivery
    sizes = sum((folder / name).stat().st_size for name in (CONFIG_FILE, WEIGHTS_FILE))
    assert report.bytes_shipped == sizes  # both files came over the network
    assert _downloaded_adapters(lora_split) == [file_sha256(folder / WEIGHTS_FILE)]
    assert lora_split.backend_row().served_version == 1
    assert lora_split.adapters() == [f"{MODEL_NAME}@v1"]
    assert lora_split.served_diff(model, f"{MODEL_NAME}@v1") <= TOL
    assert lora_split.served_diff(model) > 100 * TOL  # the adapter really changes the model


def _assert_traffic_stays_on_v1(split: Split, model: torch.nn.Module) -> None:
    row = split.backend_row()
    assert (row.state, row.served_version) == ("active", 1)
    assert split.adapters() == [f"{MODEL_NAME}@v1"]
    assert split.served_diff(model, f"{MODEL_NAME}@v1") <= TOL


def test_a_bad_token_is_refused_for_an_adapter_and_traffic_stays(lora_split: Split, lora_v1):
    folder = version_file(lora_split.trainer_home, MODEL_NAME, 900, "lora")
    model = random_adapter(lora_split.model_dir, RANK, seed=900)
    model.save_pretrained(str(folder))
    with lora_split.publisher() as publisher:
        url = f"{publisher.source.base_url}/versions/{MODEL_NAME}/900"
        update = RemoteLora(
            folder,
            MODEL_NAME,
            900,
            config=ServedFile(f"{url}/lora-config", file_sha256(folder / CONFIG_FILE)),
            weights=ServedFile(f"{url}/lora-weights", file_sha256(folder / WEIGHTS_FILE)),
            token="not-the-token",
        )
        plan = SwapPlan(
            model_name=MODEL_NAME,
            model_id=publisher.model.id,
            parent_version=1,
            new_version=900,
            update=update,
            reference_new=reference_scores(model),  # never reached
            reference_old=reference_scores(lora_v1[0]),
        )
        (backend,) = publisher.coordinator.backends(publisher.model.id)
        report = publisher.coordinator.swap_backend(backend, plan)
        assert publisher.files_server.refusals >= 1
    shutil.rmtree(folder)
    assert report.outcome == "refused"
    assert "HTTP 403" in report.reason and "token was refused" in report.reason
    _assert_traffic_stays_on_v1(lora_split, lora_v1[0])


def _flip_a_mantissa_byte(weights: Path) -> int:
    """Change the lowest byte of one number in the middle of a safetensors file's data: the file
    still parses, every number stays finite, only the checksum can tell. Returns its offset."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # after the header's length and the header
    offset = start + (len(data) - start) // 8 * 4  # a number's first (lowest, mantissa) byte
    data[offset] ^= 0x01
    weights.write_bytes(bytes(data))
    return offset


def test_a_corrupted_adapter_download_is_refused_with_traffic_on_the_old_one(
    lora_split: Split, lora_v1
) -> None:
    model = random_adapter(lora_split.model_dir, RANK, seed=22)
    with lora_split.publisher() as publisher:
        parent, reference = publisher.latest()
        assert parent == 1
        published = publisher.record(parent, model, LoraAdapter)
        weights = Path(published.update.path) / WEIGHTS_FILE
        original = weights.read_bytes()
        _flip_a_mantissa_byte(weights)  # after the checksum was recorded
        try:
            assert not published.update.problems()  # the trainer's own check cannot tell
            (report,) = publisher.push(published, model, reference_old=reference_scores(reference))
        finally:
            weights.write_bytes(original)
    assert report.outcome == "refused"
    assert "checksum mismatch" in report.reason and "nothing was read" in report.reason
    assert f"{MODEL_NAME}@v2" not in lora_split.adapters()  # never loaded
    _assert_traffic_stays_on_v1(lora_split, lora_v1[0])
    root = lora_split.backend_home / "downloads" / "adapters"
    assert not list(root.rglob("*.part"))
    served = version_file(lora_split.trainer_home, MODEL_NAME, 1, "lora") / WEIGHTS_FILE
    assert _downloaded_adapters(lora_split) == [file_sha256(served)]  # v1's, still loaded
