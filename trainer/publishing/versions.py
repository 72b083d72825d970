"""Policy versions on disk and in the registry: where each version's weights are, which version
is the latest, and how to rebuild any version's reference model (its base checkpoint, then full
files or deltas in order), and the training mode (full weights or a LoRA adapter) that a model's
versions fix (`settle_mode`)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rlgw.adapters import LoraSpec
from rlgw.db.models import PolicyVersion, RegisteredModel

from ..config import TrainerConfig
from ..errors import LoraMismatch
from ..models.lora import spec_of
from ..models.weights import load_reference_model
from ..weight_update.stored import STORED_KINDS, stored_update

BASE_KIND = "base"  # the checkpoint the model was registered with (version 0)


def version_file(home: Path, model: str, version: int, kind: str) -> Path:
    """Where a version's payload is kept: a safetensors file, or a LoRA adapter's folder."""
    name = f"v{version:06d}-{kind}"
    return home / "versions" / model / (name if kind == "lora" else f"{name}.safetensors")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def latest_version(db: Session, model_id: int) -> int:
    """The newest recorded version: the next one is numbered after it (numbers are never reused,
    not even after a rejection or a rollback)."""
    newest = select(func.max(PolicyVersion.version)).where(PolicyVersion.model_id == model_id)
    latest = db.scalar(newest)
    return 0 if latest is None else latest


def chain(db: Session, model: RegisteredModel, version: int) -> list[PolicyVersion]:
    """The versions to replay to rebuild `version`: from the last base or full one onwards."""
    rows = {
        v.version: v
        for v in db.scalars(select(PolicyVersion).where(PolicyVersion.model_id == model.id))
    }
    steps: list[PolicyVersion] = []
    current: int | None = version
    while current is not None:
        row = rows.get(current)
        if row is None:
            raise LookupError(f"{model.name} has no version {current}")
        steps.append(row)
        if row.kind == BASE_KIND or not STORED_KINDS[row.kind].relative:
            break
        current = row.parent_version
    return steps[::-1]


def materialize(db: Session, model: RegisteredModel, version: int) -> torch.nn.Module:
    """The reference model (transformers, fp32) of one version; a LoRA version's is a peft
    model (its base with the version's adapter, trainable: `trainer.models.lora.merged` merges
    it)."""
    steps = chain(db, model, version)
    if not model.path:  # a full file still needs the checkpoint for the architecture
        raise LookupError(f"{model.name} has no base checkpoint path on record")
    reference = load_reference_model(model.path)
    for step in steps:
        if step.kind != BASE_KIND:
            update = stored_update(step.kind, step.weights_path, model.name, step.version)
            reference = update.load_onto(reference)
    return reference


def settle_mode(db: Session, model: RegisteredModel, config: TrainerConfig) -> TrainerConfig:
    """The config to train `model` with, agreed with the mode it records (`models.lora`, in the
    caller's transaction): a model without trained versions takes the trainer's mode; one with
    them keeps its own (a trainer without LoRA flags adopts its adapter settings; other flags
    are a LoraMismatch). A model's mode never changes once it has trained versions: a
    full-weight version and an adapter cannot be stacked on the same backend."""
    row = db.get(RegisteredModel, model.id, with_for_update=True)
    recorded = LoraSpec.from_json(row.lora)
    wanted = spec_of(config)
    trained = latest_version(db, model.id) > 0
    if recorded == wanted:
        return config
    if not trained:
        row.lora = wanted.as_json() if wanted else None
        model.lora = row.lora
        return config
    if recorded is not None and wanted is None:
        return dataclasses.replace(
            config,
            lora_rank=recorded.rank,
            lora_alpha=recorded.alpha,
            lora_targets=recorded.targets,
        )
    have = f"LoRA rank {recorded.rank}, alpha {recorded.alpha:g}" if recorded else "full weights"
    raise LoraMismatch(
        f"{model.name} has trained versions made with {have}; train it with the same settings "
        "(or register the checkpoint as a new model)"
    )
