"""The recording transactions: store a batch of completions, first settling an earlier attempt
whose connection died, and mark ineligible the rows whose callers were told they failed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rlgw.db.models import AgentSession, Completion

from .lineage_store import link_into_session

if TYPE_CHECKING:
    from .recording import CompletionRecord

log = logging.getLogger("rlgw.recording")


async def store_batch(
    sessions: async_sessionmaker, groups: list[list[CompletionRecord]], *, settle_first: bool
) -> None:
    """Store `groups` (each stored whole or not at all) in one transaction.

    `settle_first`: an earlier attempt at this batch failed at the connection, maybe during its
    COMMIT. The groups it did commit are skipped, found after locking the batch's sessions, so
    that a transaction the server is still finishing is waited out, not raced."""
    records = [r for g in groups for r in g]
    # An implicit session holds exactly this one completion: it is born closed.
    implicit = [
        {
            "id": r.session_id,
            "implicit": True,
            "status": "closed",
            "closed_at": r.created_at,
            "tenant": r.tenant,
        }
        for r in records
        if r.implicit_session
    ]
    async with sessions() as db, db.begin():
        if implicit:  # waits for a transaction still inserting the same session
            await db.execute(insert(AgentSession).on_conflict_do_nothing(), implicit)
        if settle_first:
            await _lock_sessions(db, {r.session_id for r in records if not r.implicit_session})
            stored = await _already_stored(db, groups)
            records = [r for r in records if r.id not in stored]
        named: dict[str, list[CompletionRecord]] = {}
        for r in records:
            if not r.implicit_session:
                named.setdefault(r.session_id, []).append(r)
        for session_id in sorted(named):  # a fixed lock order: no deadlock between writers
            await link_into_session(db, session_id, named[session_id])
        if records:
            await db.execute(insert(Completion), [r.row() for r in records])


async def mark_ineligible(
    sessions: async_sessionmaker, doubtful: dict[str, str], reason: str
) -> list[str]:
    """Mark the still-eligible completions among `doubtful` (id -> session id) ineligible, with
    `reason`; return the ids marked. Their sessions are locked first, as in `store_batch`."""
    async with sessions() as db, db.begin():
        await _lock_sessions(db, set(doubtful.values()))
        marked = await db.execute(
            update(Completion)
            .where(Completion.id.in_(doubtful), Completion.eligible.is_(True))
            .values(eligible=False, eligibility_reason=reason)
            .returning(Completion.id)
        )
        return list(marked.scalars().all())


async def _lock_sessions(db: AsyncSession, session_ids: set[str]) -> None:
    """Lock these session rows in a fixed order. A transaction that wrote to them and whose
    connection died may still be committing on the server: this waits until it has finished."""
    if session_ids:
        await db.execute(
            select(AgentSession.id)
            .where(AgentSession.id.in_(session_ids))
            .order_by(AgentSession.id)
            .with_for_update()
        )


async def _already_stored(db: AsyncSession, groups: list[list[CompletionRecord]]) -> set[str]:
    """The ids of the records that an earlier attempt did commit. A group is stored whole or not
    at all, so one stored id settles its group."""
    ids = [r.id for g in groups for r in g]
    found = set((await db.execute(select(Completion.id).where(Completion.id.in_(ids)))).scalars())
    stored = {r.id for g in groups if any(r.id in found for r in g) for r in g}
    if stored:
        log.warning(
            "completion(s) %s were committed by an attempt whose connection failed: "
            "not written again",
            ", ".join(sorted(stored)),
        )
    return stored
