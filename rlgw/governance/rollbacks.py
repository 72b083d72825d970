"""Rollback requests: which versions a model may be rolled back to, and the audited request.

`rlgw rollback` carries a request out at once; one made over the admin API waits in the audit log
(`state` pending) until the model's trainer carries it out (trainer/publishing/rollback.py does
both).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rlgw.db.models import AuditEvent, PolicyVersion, RegisteredModel

from . import audit
from .version_status import CANDIDATE, REJECTED

ACTION = "rollback"
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


class RollbackRefused(Exception):
    """The rollback cannot be made: `status` and `code` for the API, the message for both."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def model_named(db: Session, name: str) -> RegisteredModel:
    model = db.scalar(select(RegisteredModel).where(RegisteredModel.name == name))
    if model is None:
        raise RollbackRefused(404, "model_not_found", f"no model named {name!r} is registered")
    return model


def target(db: Session, name: str, to: int) -> tuple[RegisteredModel, PolicyVersion]:
    """The model and the version it may be rolled back to, or RollbackRefused."""
    model = model_named(db, name)
    row = db.scalar(
        select(PolicyVersion).where(PolicyVersion.model_id == model.id, PolicyVersion.version == to)
    )
    if row is None:
        newest = db.scalar(
            select(func.max(PolicyVersion.version)).where(PolicyVersion.model_id == model.id)
        )
        raise RollbackRefused(
            404, "version_not_found", f"{name} has no version {to} (its versions: 0 to {newest})"
        )
    if row.status == REJECTED:
        raise RollbackRefused(
            409,
            "version_rejected",
            f"version {to} of {name} was rejected by its promotion gate "
            f"({(row.gate_report or {}).get('reason', 'see its gate report')}): roll back to a "
            "version that served",
        )
    if row.status == CANDIDATE:
        raise RollbackRefused(
            409, "version_is_candidate", f"version {to} of {name} is still under its gate"
        )
    return model, row


def request(
    db: Session, name: str, to: int, *, actor: str, reason: str | None, state: str = PENDING
) -> AuditEvent:
    """Record a rollback of `name` to version `to` (checked first), in the caller's transaction."""
    model, _ = target(db, name, to)
    return audit.record(
        db,
        ACTION,
        actor=actor,
        model=name,
        from_version=model.current_version,
        to_version=to,
        reason=reason,
        state=state,
    )


def pending(db: Session, name: str) -> list[AuditEvent]:
    return list(
        db.scalars(
            select(AuditEvent)
            .where(
                AuditEvent.model == name, AuditEvent.action == ACTION, AuditEvent.state == PENDING
            )
            .order_by(AuditEvent.id)
        )
    )


def rolled_back_since(db: Session, name: str, moment: datetime) -> bool:
    """Whether a rollback of `name` was asked for since `moment`."""
    return (
        db.scalar(
            select(AuditEvent.id)
            .where(AuditEvent.model == name, AuditEvent.action == ACTION, AuditEvent.at >= moment)
            .limit(1)
        )
        is not None
    )
