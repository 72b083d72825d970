"""Weights as safetensors files in Hugging Face naming, read from a path by the worker extension
(`rlgw_vllm/extension.py`): a delta (theta_new - theta_parent) or full weights."""

from __future__ import annotations

import time
from abc import abstractmethod
from pathlib import Path
from typing import Any, Self

import torch

from rlgw.weight_files import validate_update
from trainer.backends.vllm_control import VllmControl
from trainer.models.weights import apply_delta, load_full, read_update, write_update

from .base import Staged, WeightUpdate

STAGE_POLL_S = 0.05  # between two status calls while a backend stages


def wait_for_stage(backend: VllmControl, started: list[Any]) -> list[Any]:
    """The workers' stage reports once none is still running (`rlgw_stage` answers "running"
    at once and stages in a thread; `rlgw_stage_status` is a quick call), each merged over what
    it answered first (a download's delivery fields stay)."""
    reports = started
    while any(isinstance(r, dict) and r.get("running") for r in reports):
        time.sleep(STAGE_POLL_S)
        reports = backend.rpc("rlgw_stage_status")
    if reports is started:
        return started
    return [
        {**first, **now} if isinstance(first, dict) and isinstance(now, dict) else now
        for first, now in zip(started, reports, strict=False)
    ]


class FileUpdate(WeightUpdate):
    """A payload file that every backend can read at `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    @classmethod
    def write(cls, tensors: dict[str, torch.Tensor], path: str | Path, *_version: object) -> Self:
        """Write `tensors` at `path` (the model name and version a stored update may take are
        not part of a file's)."""
        write_update(tensors, path)
        return cls(path)

    @property
    def nbytes(self) -> int:
        return Path(self.path).stat().st_size

    @property
    def payload_file(self) -> Path:
        """The file the version's checksum is taken of."""
        return Path(self.path)

    def tensors(self) -> dict[str, torch.Tensor]:
        return read_update(self.path)

    def load_onto(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` (the parent version's reference) with this update applied, in place."""
        self.apply_to(model, self.tensors())
        return model

    @classmethod
    def problems(
        cls, tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]
    ) -> list[str]:
        """What would make the worker refuse these tensors (names, shapes, dtype, NaN)."""
        return validate_update(tensors, cls.kind, expected)

    @staticmethod
    @abstractmethod
    def apply_to(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """The same update on a transformers model: the trainer's reference of the version."""

    # ------------------------------------------------------------------ the seam
    def stage(self, backend: VllmControl) -> Staged:
        # The worker stages in a background thread and answers "running" at once; the backend
        # keeps serving meanwhile, and a status call (a quick worker call) tells when it is done.
        staged = wait_for_stage(backend, backend.rpc("rlgw_stage", path=self.path, kind=self.kind))
        nbytes = sum(r.get("bytes", 0) for r in staged if isinstance(r, dict))
        return Staged(nbytes, staged)

    def apply(self, backend: VllmControl) -> Any:
        return backend.rpc("rlgw_apply")

    def commit(self, backend: VllmControl) -> None:
        backend.rpc("rlgw_commit")

    def rollback(self, backend: VllmControl) -> None:
        backend.rpc("rlgw_rollback")


class DeltaFile(FileUpdate):
    """theta_new - theta_parent for the parameters that changed."""

    kind = "delta"
    relative = True
    apply_to = staticmethod(apply_delta)


class FullFile(FileUpdate):
    """Every parameter's new value: installs the version whatever the backend served."""

    kind = "full"
    relative = False
    apply_to = staticmethod(load_full)


FILE_KINDS: dict[str, type[FileUpdate]] = {cls.kind: cls for cls in (DeltaFile, FullFile)}


def file_update(kind: str, path: str | Path) -> FileUpdate:
    """The update of a stored version file (`policy_versions.kind`, `.weights_path`); any stored
    version, a LoRA adapter's too: `stored.stored_update`."""
    return FILE_KINDS[kind](path)
