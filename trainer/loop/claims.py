"""Claiming eligible sessions for an update, without double-claiming across trainers.

A session is eligible when it is closed, meant for training, has a reward that counts, its
tenant consents to training this model (rlgw/governance/consent.py: checked at claim time, so a
policy change applies to every session not consumed yet), and its group (if any) is ready.
Claims take row locks with SKIP LOCKED, then mark the sessions `claimed` by this trainer
instance; a trainer holds a Postgres advisory lock on its instance id for its whole life, so a
claim whose owner's lock is free belongs to a dead trainer and is released.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession, SessionGroup
from rlgw.governance.consent import consented_sql
from rlgw.session_status import SessionStatus
from rlgw.trajectory import group_verdict

INSTANCE_LOCK_NAMESPACE = 7_262_002

_FOR_MODEL = """
    EXISTS (SELECT 1 FROM completions c WHERE c.session_id = s.id AND c.model = :model)
"""
_CONSENTED = consented_sql("s")
_HAS_COUNTING_REWARD = """
    EXISTS (SELECT 1 FROM rewards r LEFT JOIN completions rc ON rc.id = r.completion_id
            WHERE r.session_id = s.id AND (rc.id IS NULL OR rc.orphan_reason IS NULL))
"""


class TrainerInstance:
    """This trainer's identity: an advisory lock held on a dedicated connection while it lives."""

    def __init__(self, engine: Engine) -> None:
        self.id = random.randrange(1, 2**31)
        self._conn: Connection = engine.connect()
        got = self._conn.execute(
            select(func.pg_try_advisory_lock(INSTANCE_LOCK_NAMESPACE, self.id))
        ).scalar_one()
        self._conn.commit()
        if not got:
            raise RuntimeError("could not take the trainer instance lock")

    def close(self) -> None:
        self._conn.close()  # the session ends: the lock is released with it


@dataclass
class Claim:
    session_ids: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # session id -> reason


def release_dead_claims(db: Session) -> int:
    """Return to `closed` every claim whose trainer no longer holds its instance lock."""
    owners = db.scalars(
        select(AgentSession.claimed_by)
        .distinct()
        .where(AgentSession.status == SessionStatus.CLAIMED)
    ).all()
    released = 0
    for owner in owners:
        alive = not db.execute(
            select(func.pg_try_advisory_lock(INSTANCE_LOCK_NAMESPACE, owner))
        ).scalar_one()
        if not alive:
            db.execute(select(func.pg_advisory_unlock(INSTANCE_LOCK_NAMESPACE, owner)))
            released += db.execute(
                update(AgentSession)
                .where(
                    AgentSession.status == SessionStatus.CLAIMED, AgentSession.claimed_by == owner
                )
                .values(status=SessionStatus.CLOSED, claimed_by=None, claimed_at=None)
            ).rowcount
    return released


def _claim_groups(
    db: Session, model: str, limit: int, now: datetime, claim: Claim, consent: bool
) -> None:
    params = {"model": model, "consent_default": consent}
    groups = db.scalars(
        select(SessionGroup)
        .where(
            SessionGroup.status == "open",
            text(
                "EXISTS (SELECT 1 FROM sessions s WHERE s.group_id = groups.id "
                f"AND s.status = '{SessionStatus.CLOSED}' AND s.train "
                f"AND {_FOR_MODEL} AND {_CONSENTED})"
            ),
        )
        .order_by(SessionGroup.created_at)
        .with_for_update(skip_locked=True)
        .limit(limit),
        params,
    ).all()
    for group in groups:
        verdict, _ = group_verdict(db, group, now)
        if verdict.status == "pending":
            continue
        members = db.scalars(
            select(AgentSession)
            .where(
                AgentSession.group_id == group.id,
                AgentSession.status == SessionStatus.CLOSED,
                AgentSession.train.is_(True),
                text(consented_sql("sessions")),
            )
            .with_for_update(),
            params,
        ).all()
        if verdict.status == "dropped":
            group.status, group.dropped_reason = "dropped", verdict.reason
            for member in members:
                member.status = SessionStatus.DROPPED
                member.dropped_reason = f"group {group.id} dropped: {verdict.reason}"
                claim.dropped[member.id] = member.dropped_reason
            continue
        claim.session_ids.extend(m.id for m in members)


def _claim_singletons(db: Session, model: str, limit: int, claim: Claim, consent: bool) -> None:
    rows = (
        db.execute(
            text(f"""
        SELECT s.id FROM sessions s
        WHERE s.status = '{SessionStatus.CLOSED}' AND s.group_id IS NULL AND s.train
          AND {_FOR_MODEL} AND {_HAS_COUNTING_REWARD} AND {_CONSENTED}
        ORDER BY s.closed_at, s.id
        LIMIT :limit
        FOR UPDATE OF s SKIP LOCKED
    """),
            {"model": model, "limit": limit, "consent_default": consent},
        )
        .scalars()
        .all()
    )
    claim.session_ids.extend(rows)


def _drop_unrewarded(db: Session, model: str, older_than: datetime, claim: Claim) -> None:
    reason = "closed without a reward before the deadline"
    rows = (
        db.execute(
            text(f"""
        UPDATE sessions s SET status = '{SessionStatus.DROPPED}', dropped_reason = :reason
        WHERE s.id IN (
            SELECT s.id FROM sessions s
            WHERE s.status = '{SessionStatus.CLOSED}' AND s.group_id IS NULL AND s.train
              AND s.closed_at < :older_than AND {_FOR_MODEL} AND NOT {_HAS_COUNTING_REWARD}
            FOR UPDATE OF s SKIP LOCKED)
        RETURNING s.id
    """),
            {"model": model, "older_than": older_than, "reason": reason},
        )
        .scalars()
        .all()
    )
    claim.dropped.update({sid: reason for sid in rows})


def claim_sessions(
    db: Session,
    *,
    model: str,
    instance_id: int,
    max_sessions: int,
    reward_deadline_s: float,
    now: datetime,
    consent: str = "all",
) -> Claim:
    """Claim up to about `max_sessions` eligible sessions (whole groups) whose tenants consent to
    training `model` (`consent`: RLGW_TRAINING_CONSENT, for tenants without a policy); commit
    before use."""
    claim = Claim()
    consents = consent == "all"
    _claim_groups(db, model, max_sessions, now, claim, consents)
    room = max_sessions - len(claim.session_ids)
    if room > 0:
        _claim_singletons(db, model, room, claim, consents)
    _drop_unrewarded(db, model, now - timedelta(seconds=reward_deadline_s), claim)
    if claim.session_ids:
        db.execute(
            update(AgentSession)
            .where(AgentSession.id.in_(claim.session_ids))
            .values(status=SessionStatus.CLAIMED, claimed_by=instance_id, claimed_at=now)
        )
    return claim


def unclaim(db: Session, session_ids: list[str]) -> None:
    """Give claimed sessions back (an update that could not be made)."""
    db.execute(
        update(AgentSession)
        .where(AgentSession.id.in_(session_ids), AgentSession.status == SessionStatus.CLAIMED)
        .values(status=SessionStatus.CLOSED, claimed_by=None, claimed_at=None)
    )
