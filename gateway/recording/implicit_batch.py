"""The common write in one round trip: a batch of records in implicit sessions, stored by one
statement in its own transaction (their sessions inserted by a CTE of the same statement)."""

from __future__ import annotations

import functools
import json
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from rlgw.eligibility import NOT_FOLLOWING

from .record import CompletionRecord

# The json columns: written as SQLAlchemy's JSON type writes them (json.dumps; None too, as the
# JSON `null`, not SQL NULL), so that both write paths store the same text.
_JSON_COLUMNS = frozenset({"request", "response", "backend_request"})
_SESSION_VALUES = "(%s, true, 'closed', %s, %s, %s)"  # id, closed_at, tenant, agent_key_id


def fits(records: list[CompletionRecord], settle_first: bool) -> bool:
    """Whether `records` can be stored by `store_implicit`: all in implicit sessions, none to be
    settled first, none whose swap doubt must be settled against the registry."""
    return not settle_first and all(
        r.implicit_session and r.swap_doubt != NOT_FOLLOWING for r in records
    )


@functools.cache
def _statement(keys: tuple[str, ...], n: int) -> str:
    """INSERT of `n` completions with columns `keys`, a CTE inserting their sessions first."""
    row = "(" + ", ".join(["%s"] * len(keys)) + ")"
    return (
        "WITH implicit_sessions AS (INSERT INTO sessions "
        "(id, implicit, status, closed_at, tenant, agent_key_id) VALUES "
        + ", ".join([_SESSION_VALUES] * n)
        + " ON CONFLICT DO NOTHING) INSERT INTO completions ("
        + ", ".join(keys)
        + ") VALUES "
        + ", ".join([row] * n)
    )


def _value(key: str, value: Any) -> Any:
    return json.dumps(value) if key in _JSON_COLUMNS else value


@functools.cache
def _autocommit(engine: AsyncEngine) -> AsyncEngine:
    return engine.execution_options(isolation_level="AUTOCOMMIT")


async def store_implicit(engine: AsyncEngine, records: list[CompletionRecord]) -> None:
    """Store `records` (see `fits`) with one statement: all of them or none. Its success is
    the commit's (a statement outside a transaction commits before it answers)."""
    if not records:
        return
    rows = [r.row() for r in records]
    keys = tuple(rows[0])
    params: list[Any] = []
    for r in records:
        params += (r.session_id, r.created_at, r.tenant, r.agent_key_id)
    for row in rows:
        params += (_value(k, v) for k, v in row.items())
    async with _autocommit(engine).connect() as conn:
        await conn.exec_driver_sql(_statement(keys, len(rows)), tuple(params))
