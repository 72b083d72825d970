"""A model's promoted version and the lineage of a version: read by the trainer (staleness) and by
the gateway's training view (the same verdicts, without importing the trainer)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from rlgw.db.models import PolicyVersion, RegisteredModel


def head_version(db: Session, model_id: int) -> int:
    """The model's promoted version (`models.current_version`): what its backends serve and
    what every new version is built on. A rejected candidate or a rollback moves it back."""
    return db.scalar(select(RegisteredModel.current_version).where(RegisteredModel.id == model_id))


def lineage(db: Session, model_id: int, version: int) -> dict[int, int]:
    """`version` and its ancestors, each with its distance from `version` (0 for itself): the
    versions whose data is on-policy enough to train `version`'s successor, by the staleness
    bound. A rejected or rolled-back branch is not on it."""
    parents = dict(
        db.execute(
            select(PolicyVersion.version, PolicyVersion.parent_version).where(
                PolicyVersion.model_id == model_id
            )
        ).all()
    )
    depths: dict[int, int] = {}
    current: int | None = version
    while current is not None and current not in depths:
        depths[current] = len(depths)
        current = parents.get(current)
    return depths
