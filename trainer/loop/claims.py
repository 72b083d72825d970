"""Claiming eligible sessions for an update, without double-claiming across trainers.

A session is eligible when it is closed, meant for training, has a reward that counts, its
tenant consents to training this model (rlgw/governance/consent.py: checked at claim time, so a
policy change applies to every session not consumed yet), and its group (if any) is ready.
Claims take row locks with SKIP LOCKED, then mark the sessions `claimed` by this trainer
instance with a lease (`sessions.lease_expires_at`, the database's clock) that the trainer's
heartbeat renews (trainer/loop/leases.py); every claim pass first returns to the queue the claims
whose lease passed. A trainer also holds a Postgres advisory lock on its instance id for its whole
life, so a claim whose owner's lock is free belongs to a dead trainer and is released at start.
`batch_sessions` counts sessions; a session that calls several models is eligible for each model
until that model has consumed or dropped it (docs/training.md, "Claims").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, DateTime, Engine, and_, func, select, text, tuple_, update
from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession, SessionGroup
from rlgw.governance.consent import consented_sql
from rlgw.session_status import SessionStatus
from rlgw.settings import Settings
from rlgw.trajectory import group_verdict

INSTANCE_LOCK_NAMESPACE = 7_262_002


def _for_model_sql(session: str) -> str:
    """A SQL boolean: the session row `session` holds completions of `:model` and that model has
    neither consumed it (its ledger) nor dropped it (session_model_drops): a session that calls
    several models is eligible for each of them until each has had it once."""
    return f"""
    (EXISTS (SELECT 1 FROM completions c WHERE c.session_id = {session}.id AND c.model = :model)
     AND NOT EXISTS (SELECT 1 FROM consumption k JOIN models km ON km.id = k.model_id
                     WHERE k.session_id = {session}.id AND km.name = :model)
     AND NOT EXISTS (SELECT 1 FROM session_model_drops d JOIN models dm ON dm.id = d.model_id
                     WHERE d.session_id = {session}.id AND dm.name = :model))
"""


_FOR_MODEL = _for_model_sql("s")
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
    released: list[str] = field(default_factory=list)  # expired leases returned to the queue
    # The next ready group did not fit in what was left: the batch is as full as whole groups
    # allow (an update then need not wait for `min_sessions`).
    full: bool = False


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
                .values(
                    status=SessionStatus.CLOSED,
                    claimed_by=None,
                    claimed_at=None,
                    lease_expires_at=None,
                )
            ).rowcount
    return released


DEFAULT_LEASE_S = Settings.model_fields["claim_lease_s"].default  # RLGW_CLAIM_LEASE_S's
MIN_CLAIM_IDLE_S = 30.0  # the claim transaction's idle bound when the lease is shorter
GROUP_PAGE = 64  # candidate groups judged per query while looking for ready ones
# Pages judged per claim pass at most: a bound on the work of one pass (two queries a group)
# when very many groups wait for rewards; a ready group behind more pending ones than this
# waits until some of them are ready or dropped.
MAX_GROUP_PAGES = 16


def _candidate_groups(
    db: Session, params: dict, after: tuple[datetime, str] | None
) -> list[SessionGroup]:
    """The next page, in age order, of open groups with a member eligible for `:model` (row
    locks, SKIP LOCKED: a group another trainer is claiming is left to it)."""
    query = (
        select(SessionGroup)
        .where(
            SessionGroup.status == "open",
            text(
                "EXISTS (SELECT 1 FROM sessions s WHERE s.group_id = groups.id "
                f"AND s.status = '{SessionStatus.CLOSED}' AND s.train "
                f"AND {_FOR_MODEL} AND {_CONSENTED})"
            ),
        )
        .order_by(SessionGroup.created_at, SessionGroup.id)
        .with_for_update(skip_locked=True)
        .limit(GROUP_PAGE)
    )
    if after is not None:
        query = query.where(tuple_(SessionGroup.created_at, SessionGroup.id) > after)
    return list(db.scalars(query, params).all())


def _claim_groups(
    db: Session, model: str, budget: int, now: datetime, claim: Claim, consent: bool
) -> None:
    """Whole ready groups, oldest first, while they fit in `budget` sessions. Readiness is
    judged over the candidates page by page (MAX_GROUP_PAGES at most), so pending groups never
    hide a ready one behind them. A ready group larger than the budget is taken whole when
    nothing is claimed yet (a group is never split: its advantages are normalized over it);
    otherwise the first ready group that does not fit ends the pass, so no newer group
    overtakes it."""
    params = {"model": model, "consent_default": consent}
    after = None
    for _ in range(MAX_GROUP_PAGES):
        if len(claim.session_ids) >= budget:
            return
        page = _candidate_groups(db, params, after)
        if not page:
            return
        after = (page[-1].created_at, page[-1].id)
        for group in page:
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
                    text(_for_model_sql("sessions")),
                )
                .order_by(AgentSession.id)
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
            room = budget - len(claim.session_ids)
            if len(members) > room and claim.session_ids:
                claim.full = True  # the oldest ready group that does not fit waits for the next
                return
            claim.session_ids.extend(m.id for m in members)
            if len(claim.session_ids) >= budget:
                return


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


def release_expired_claims(db: Session) -> list[str]:
    """Return to `closed` every claim whose lease has passed (its trainer stopped renewing it:
    stopped, frozen, cut off), by the database's clock; rows being committed are skipped."""
    return list(
        db.execute(
            text(f"""
        UPDATE sessions s SET status = '{SessionStatus.CLOSED}', claimed_by = NULL,
               claimed_at = NULL, lease_expires_at = NULL
        WHERE s.id IN (
            SELECT s.id FROM sessions s
            WHERE s.status = '{SessionStatus.CLAIMED}' AND s.lease_expires_at < clock_timestamp()
            FOR UPDATE OF s SKIP LOCKED)
        RETURNING s.id
    """)
        )
        .scalars()
        .all()
    )


def claim_sessions(
    db: Session,
    *,
    model: str,
    instance_id: int,
    max_sessions: int,
    reward_deadline_s: float,
    now: datetime,
    lease_s: float = DEFAULT_LEASE_S,
    consent: str = "all",
) -> Claim:
    """Release the claims whose lease passed, then claim up to `max_sessions` eligible sessions
    (whole ready groups in age order while they fit, then rewarded singletons) whose tenants
    consent to training `model` (`consent`: RLGW_TRAINING_CONSENT, for tenants without a
    policy), each with a lease of `lease_s` seconds; commit before use."""
    # A trainer stopped in the middle of this transaction would keep its rows locked, and every
    # other trainer skipping them, until it is continued: the server ends it once idle this long.
    idle_ms = int(max(lease_s, MIN_CLAIM_IDLE_S) * 1000)
    db.execute(select(func.set_config("idle_in_transaction_session_timeout", str(idle_ms), True)))
    claim = Claim(released=release_expired_claims(db))
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
            .values(
                status=SessionStatus.CLAIMED,
                claimed_by=instance_id,
                claimed_at=now,
                lease_expires_at=lease_from_now(lease_s),
            )
        )
    return claim


def _clock():
    """The database's clock now (not the transaction's start): leases are judged by one clock
    for every trainer, whatever their machines' clocks say."""
    return func.clock_timestamp(type_=DateTime(timezone=True))


def lease_from_now(lease_s: float):
    """The SQL expression of a lease that ends `lease_s` seconds from now (database clock)."""
    return _clock() + timedelta(seconds=lease_s)


def held(instance_id: int):
    """The SQL condition of a session this trainer instance still holds: claimed by it, with a
    lease that has not passed (a passed lease is lost even before anyone releases it)."""
    return and_(
        AgentSession.status == SessionStatus.CLAIMED,
        AgentSession.claimed_by == instance_id,
        AgentSession.lease_expires_at > _clock(),
    )


def unclaim(db: Session, session_ids: list[str], instance_id: int) -> None:
    """Give back the claimed sessions this instance still holds (an update that could not be
    made); a session it lost is another trainer's now and is left alone."""
    db.execute(
        update(AgentSession)
        .where(AgentSession.id.in_(session_ids), held(instance_id))
        .values(
            status=SessionStatus.CLOSED, claimed_by=None, claimed_at=None, lease_expires_at=None
        )
    )
