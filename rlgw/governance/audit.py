"""The audit log: one row per governance action, saying who, when, on what, and why."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from rlgw.db.models import AuditEvent

ADMIN_API = "admin-api"


def command_actor() -> str:
    """Who runs a command on this machine: its OS user."""
    try:
        return f"os:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return "os:unknown"


def api_actor(declared: str | None, address: str) -> str:
    """Who called an admin route: the admin key is shared, so the record says it was the API, from
    which address, and who the caller said it was (unverified)."""
    who = f"{ADMIN_API}@{address}"
    return f"{who} as {declared}"[:128] if declared else who[:128]


def record(
    db: Session,
    action: str,
    *,
    actor: str,
    model: str | None = None,
    tenant: str | None = None,
    from_version: int | None = None,
    to_version: int | None = None,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
    state: str | None = None,
) -> AuditEvent:
    """Add an event to the caller's transaction (it is kept only if that commits)."""
    event = AuditEvent(
        actor=actor,
        action=action,
        model=model,
        tenant=tenant,
        from_version=from_version,
        to_version=to_version,
        reason=reason,
        detail=detail or {},
        state=state,
        at=datetime.now(UTC),
    )
    db.add(event)
    db.flush()
    return event
