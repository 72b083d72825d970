"""How a claimed session leaves one model's claim: consumed or dropped for that model, and back
to the queue (`closed`) while another model it called has still to train on it.

A session's `status` is one for all models; the per-model truth is the ledger (`consumption`,
which has model_id) and `session_model_drops`. A session whose completions are all one model's
(every session but a multi-model agent's) passes closed -> claimed -> consumed/dropped as always.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import exists, select, text
from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession, Consumption, SessionModelDrop
from rlgw.session_status import SessionStatus

_OTHERS_PENDING = text("""
    SELECT EXISTS (
        SELECT 1 FROM completions c JOIN models m ON m.name = c.model
        WHERE c.session_id = :sid AND m.id <> :model_id
          AND NOT EXISTS (SELECT 1 FROM consumption k
                          WHERE k.session_id = :sid AND k.model_id = m.id)
          AND NOT EXISTS (SELECT 1 FROM session_model_drops d
                          WHERE d.session_id = :sid AND d.model_id = m.id))
""")


def others_pending(db: Session, session_id: str, model_id: int) -> bool:
    """Whether another registered model has completions in the session it has neither consumed
    nor dropped."""
    return bool(db.execute(_OTHERS_PENDING, {"sid": session_id, "model_id": model_id}).scalar())


def _back_to_queue(session: AgentSession) -> None:
    session.status = SessionStatus.CLOSED
    session.claimed_by = session.claimed_at = session.lease_expires_at = None


def settle_consumed(db: Session, session: AgentSession, model_id: int, now: datetime) -> None:
    """The model has trained on the session (its ledger rows are in this transaction)."""
    if others_pending(db, session.id, model_id):
        _back_to_queue(session)
    else:
        session.status, session.consumed_at = SessionStatus.CONSUMED, now


def settle_dropped(
    db: Session, session: AgentSession, model_id: int, reason: str, now: datetime
) -> None:
    """The model will never train on the session (nothing of it was trainable): dropped for
    this model only while another still has to train on it; once none has, `consumed` if some
    model trained on it, else `dropped` with the reason."""
    if others_pending(db, session.id, model_id):
        db.add(SessionModelDrop(session_id=session.id, model_id=model_id, reason=reason))
        _back_to_queue(session)
    elif db.scalar(select(exists().where(Consumption.session_id == session.id))):
        session.status, session.consumed_at = SessionStatus.CONSUMED, now
    else:
        session.status, session.dropped_reason = SessionStatus.DROPPED, reason
