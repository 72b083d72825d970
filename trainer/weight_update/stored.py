"""The update of a stored version (`policy_versions.kind`, `.weights_path`), of any method."""

from __future__ import annotations

from pathlib import Path

from .base import WeightUpdate
from .files import FILE_KINDS, file_update
from .lora import LoraAdapter

STORED_KINDS: dict[str, type[WeightUpdate]] = {**FILE_KINDS, LoraAdapter.kind: LoraAdapter}


def stored_update(kind: str, path: str | Path, model_name: str, version: int) -> WeightUpdate:
    """The update that installs `version` of `model_name` from its stored payload."""
    if kind == LoraAdapter.kind:
        return LoraAdapter(path, model_name, version)
    return file_update(kind, path)
