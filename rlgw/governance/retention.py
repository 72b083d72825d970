"""Retention: drop completion texts after RLGW_RETENTION_TEXT_DAYS (the token arrays stay, so
training and the ledger are unaffected) and whole sessions after RLGW_RETENTION_RECORDS_DAYS.

One sweep serves the gateway's periodic task and `rlgw retention sweep`. It works in batches,
each its own transaction, skipping rows another sweep holds (several gateways may run it).
Sessions claimed by an update in progress are kept until a later sweep; the ledger keeps the
tenant, tokens and version of what is deleted (its references become null).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, insert, text

from rlgw.db.models import AuditEvent
from rlgw.session_status import SessionStatus

BATCH = 1000
ACTOR = "retention-sweep"

_DROP_TEXT = text(
    """
    UPDATE completions SET request = '{}'::json, response = NULL, backend_request = NULL,
                           text_dropped_at = :now
    WHERE id IN (SELECT id FROM completions
                 WHERE text_dropped_at IS NULL AND created_at < :cutoff
                 ORDER BY created_at LIMIT :batch FOR UPDATE SKIP LOCKED)
    """
)
_DELETE_SESSIONS = text(
    f"""
    DELETE FROM sessions WHERE id IN (
        SELECT id FROM sessions WHERE created_at < :cutoff AND status <> '{SessionStatus.CLAIMED}'
        ORDER BY created_at LIMIT :batch FOR UPDATE SKIP LOCKED)
    """
)
_DELETE_EMPTY_GROUPS = text(
    """
    DELETE FROM groups g WHERE g.created_at < :cutoff
      AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.group_id = g.id)
    """
)


@dataclass
class SweepResult:
    texts_dropped: int = 0
    sessions_deleted: int = 0


def _in_batches(conn: Connection, statement, params: dict) -> int:
    total = 0
    while True:
        count = conn.execute(statement, {**params, "batch": BATCH}).rowcount
        conn.commit()
        total += count
        if count < BATCH:
            return total


def sweep(
    conn: Connection,
    *,
    text_days: float | None,
    records_days: float | None,
    now: datetime,
) -> SweepResult:
    """Apply both retention periods once (None: keep forever); commits as it goes."""
    for days in (text_days, records_days):
        if days is not None and days < 0:
            raise ValueError(f"a retention period cannot be negative ({days} days)")
    result = SweepResult()
    if text_days is not None:
        cutoff = now - timedelta(days=text_days)
        result.texts_dropped = _in_batches(conn, _DROP_TEXT, {"cutoff": cutoff, "now": now})
    if records_days is not None:
        cutoff = now - timedelta(days=records_days)
        result.sessions_deleted = _in_batches(conn, _DELETE_SESSIONS, {"cutoff": cutoff})
        conn.execute(_DELETE_EMPTY_GROUPS, {"cutoff": cutoff})
        conn.commit()
    if result.texts_dropped or result.sessions_deleted:  # the audit log says what went
        conn.execute(
            insert(AuditEvent).values(
                actor=ACTOR,
                action="retention",
                at=now,
                detail={
                    "text_days": text_days,
                    "records_days": records_days,
                    "texts_dropped": result.texts_dropped,
                    "sessions_deleted": result.sessions_deleted,
                },
            )
        )
        conn.commit()
    return result
