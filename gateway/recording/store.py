"""The recording transactions: store a batch of completions, first settling an earlier attempt
whose connection died, and mark ineligible the rows whose callers were told they failed."""

from __future__ import annotations

import functools
import logging
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rlgw.db.models import AgentSession, Completion
from rlgw.eligibility import DOUBTFUL_COMMIT, add_reason
from rlgw.session_rows import implicit_session, insert_implicit, insert_implicit_cte

from . import implicit_batch
from .lineage_store import link_into_session
from .record import CompletionRecord
from .swap_settle import settle_swap_doubts

log = logging.getLogger("rlgw.recording")

_SESSIONS = AgentSession.__table__
_COMPLETIONS = Completion.__table__


async def store_batch(
    engine: AsyncEngine,
    groups: list[list[CompletionRecord]],
    *,
    settle_first: bool,
    implicit: implicit_batch.ImplicitWriter | None = None,
) -> None:
    """Store `groups` (each stored whole or not at all) in one transaction.

    `settle_first`: an earlier attempt at this batch failed at the connection, maybe during its
    COMMIT. The groups it did commit are skipped, found after locking the batch's sessions, so
    that a transaction the server is still finishing is waited out, not raced.

    With `implicit`, a batch of implicit records only (the common case) is one statement in its
    own transaction, one round trip (`implicit_batch.py`). Otherwise Core statements, compiled
    once, not ORM sessions, in one transaction; an implicit session is inserted by the statement
    that inserts its completion."""
    records = [r for g in groups for r in g]
    if implicit is not None and implicit_batch.fits(records, settle_first):
        await implicit.store(records)
        return
    async with engine.begin() as conn:
        if settle_first:
            implicit = [_implicit_session(r) for r in records if r.implicit_session]
            if implicit:  # waits for a transaction still inserting the same session
                await conn.execute(insert_implicit(), implicit)
            await _lock_sessions(conn, {r.session_id for r in records if not r.implicit_session})
            stored = await _already_stored(conn, groups)
            records = [r for r in records if r.id not in stored]
        await settle_swap_doubts(conn, records)
        await _link_named(conn, records)
        await _insert(conn, records, sessions_inserted=settle_first)


def _implicit_session(r: CompletionRecord) -> dict[str, Any]:
    return implicit_session(r.session_id, r.created_at, r.tenant, r.agent_key_id)


async def _insert(
    conn: AsyncConnection, records: list[CompletionRecord], *, sessions_inserted: bool = False
) -> None:
    """Insert the completion rows; unless `sessions_inserted`, each implicit session in the
    same statement as its completion (executemany: psycopg pipelines the rows)."""
    plain = [r.row() for r in records if sessions_inserted or not r.implicit_session]
    with_session = [
        {"tenant": r.tenant, "agent_key_id": r.agent_key_id}
        | {"c_" + k: v for k, v in r.row().items()}
        for r in records
        if not sessions_inserted and r.implicit_session
    ]
    if with_session:
        keys = tuple(k for k in with_session[0] if k not in ("tenant", "agent_key_id"))
        await conn.execute(_with_session(keys), with_session)
    if plain:
        await conn.execute(insert(_COMPLETIONS), plain)


@functools.cache
def _with_session(keys: tuple[str, ...]) -> Insert:
    """INSERT of one completion whose implicit session a CTE inserts first: a constant statement
    (bound parameters only), so that it is compiled once and cached. The completion's values are
    bound as `c_<column>` (`keys`), apart from the columns of the session's insert."""
    session = insert_implicit_cte(
        "implicit_session",
        session_id=bindparam("c_session_id"),
        created_at=bindparam("c_created_at"),
        tenant=bindparam("tenant"),
        agent_key_id=bindparam("agent_key_id"),
    )
    columns = _COMPLETIONS.c
    values = {k[2:]: bindparam(k, type_=columns[k[2:]].type) for k in keys}
    return insert(_COMPLETIONS).values(values).add_cte(session)


async def _link_named(conn: AsyncConnection, records: list[CompletionRecord]) -> None:
    named: dict[str, list[CompletionRecord]] = {}
    for r in records:
        if not r.implicit_session:
            named.setdefault(r.session_id, []).append(r)
    for session_id in sorted(named):  # a fixed lock order: no deadlock between writers
        await link_into_session(conn, session_id, named[session_id])


async def mark_doubtful(engine: AsyncEngine, doubtful: dict[str, str]) -> list[str]:
    """Add DOUBTFUL_COMMIT to the reasons of the stored completions among `doubtful` (id ->
    session id) that lack it; return their ids. Their sessions are locked first, as in
    `store_batch`."""
    async with engine.begin() as conn:
        await _lock_sessions(conn, set(doubtful.values()))
        mark = update(Completion).where(Completion.id.in_(doubtful))
        marked = await conn.execute(
            add_reason(mark, Completion.ineligible_reasons, DOUBTFUL_COMMIT).returning(
                Completion.id
            )
        )
        return list(marked.scalars().all())


async def _lock_sessions(conn: AsyncConnection, session_ids: set[str]) -> None:
    """Lock these session rows in a fixed order. A transaction that wrote to them and whose
    connection died may still be committing on the server: this waits until it has finished."""
    if session_ids:
        await conn.execute(
            select(AgentSession.id)
            .where(AgentSession.id.in_(session_ids))
            .order_by(AgentSession.id)
            .with_for_update()
        )


async def _already_stored(conn: AsyncConnection, groups: list[list[CompletionRecord]]) -> set[str]:
    """The ids of the records that an earlier attempt did commit. A group is stored whole or not
    at all, so one stored id settles its group."""
    ids = [r.id for g in groups for r in g]
    found = set((await conn.execute(select(Completion.id).where(Completion.id.in_(ids)))).scalars())
    stored = {r.id for g in groups if any(r.id in found for r in g) for r in g}
    if stored:
        log.warning(
            "completion(s) %s were committed by an attempt whose connection failed: "
            "not written again",
            ", ".join(sorted(stored)),
        )
    return stored
