"""Backend routing states, and the one way to change them: an UPDATE plus a NOTIFY in the same
transaction, so every gateway replica re-reads the registry as soon as the change commits."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Update, func, select, text, update
from sqlalchemy.orm import Session

from rlgw.db.models import Backend

CHANNEL = "rlgw_backends"

ACTIVE = "active"  # routed to
DRAINING = "draining"  # no new requests; in-flight ones finish
PAUSED = "paused"  # vLLM paused, weights being applied
VERIFYING = "verifying"  # resumed, parity being checked; still not routed
FAILED = "failed"  # out of routing until an admin resumes it; state_reason says why
STATES = (ACTIVE, DRAINING, PAUSED, VERIFYING, FAILED)

NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def set_state(
    backend_id: int,
    state: str,
    reason: str | None = None,
    *,
    served_version: int | None = None,
    bump_epoch: bool = False,
) -> Update:
    """The UPDATE for a state change; run `notify_args()` with NOTIFY in the same transaction."""
    if state not in STATES:
        raise ValueError(f"unknown backend state {state!r}")
    values: dict[str, Any] = {"state": state, "state_reason": reason, "updated_at": func.now()}
    if served_version is not None:
        values["served_version"] = served_version
    if bump_epoch:
        values["swap_epoch"] = Backend.swap_epoch + 1
    return update(Backend).where(Backend.id == backend_id).values(**values)


def notify_args(backend_id: int) -> dict[str, str]:
    return {"channel": CHANNEL, "payload": str(backend_id)}


def model_notify_args(model_id: int) -> dict[str, str]:
    """NOTIFY arguments for a change of what a model's backends may serve (its promoted or
    candidate version, a canary, a version's status): gateways re-read the registry."""
    return {"channel": CHANNEL, "payload": f"model:{model_id}"}


def backends_of(model_id: int):
    return select(Backend).where(Backend.model_id == model_id).order_by(Backend.id)


def fail(db: Session, backend_id: int, reason: str) -> None:
    """Take a backend out of routing with `reason` (its process died, say), and tell every
    gateway replica, in the caller's transaction."""
    db.execute(set_state(backend_id, FAILED, reason))
    db.execute(NOTIFY, notify_args(backend_id))
