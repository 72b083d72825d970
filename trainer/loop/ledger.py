"""The ledger of an update: one `consumptions` row per sample it trained on (used) and per one it
skipped (with the reason), and its sessions marked consumed (or returned to the queue while
another model they called has still to train on them: trainer/loop/settle.py), written in the
transaction that records the version, so an update either happened completely or not at all."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession, Consumption

from .settle import settle_consumed


def record_ledger(
    db: Session,
    model_id: int,
    version: int,
    samples: Sequence[Any],
    skips: Sequence[Any],
    session_ids: list[str],
) -> None:
    """The ledger and the consumed sessions, in the transaction that records `version`."""
    now = datetime.now(UTC)
    agent_sessions = {sid: db.get(AgentSession, sid) for sid in session_ids}
    tenant = {sid: s.tenant for sid, s in agent_sessions.items()}  # provenance, kept after a purge
    key = {sid: s.agent_key_id for sid, s in agent_sessions.items()}
    db.add_all(
        Consumption(
            model_id=model_id,
            version=version,
            session_id=s.session_id,
            completion_id=s.completion_id,
            tenant=tenant.get(s.session_id),
            agent_key_id=key.get(s.session_id),
            used=True,
            tokens=s.trained_tokens,  # the output tokens that carried loss
            advantage=s.advantage,
        )
        for s in samples
    )
    db.add_all(
        Consumption(
            model_id=model_id,
            version=version,
            session_id=s.session_id,
            completion_id=s.completion_id,
            tenant=tenant.get(s.session_id),
            agent_key_id=key.get(s.session_id),
            used=False,
            reason=s.reason,
        )
        for s in skips
    )
    for session in agent_sessions.values():  # consumed; or back to the queue for another model
        settle_consumed(db, session, model_id, now)
