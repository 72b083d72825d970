"""The common write in one round trip: a batch of records in implicit sessions, stored by one
statement in its own transaction (their sessions inserted by a CTE of the same statement)."""

from __future__ import annotations

import contextlib
import functools
import json
import time
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rlgw.session_rows import insert_implicit_sql

from .record import CompletionRecord

# The json columns: written as SQLAlchemy's JSON type writes them (json.dumps; None too, as the
# JSON `null`, not SQL NULL), so that both write paths store the same text.
_JSON_COLUMNS = frozenset({"request", "response", "backend_request", "sampling"})
_SESSION_COLUMNS = 4  # id, closed_at, tenant, agent_key_id
# A held connection idle this long is given back for a pinged one: after a quiet spell (when a
# database restart or an idle timeout may have closed it) no write has to fail to find out.
IDLE_S = 10.0


def fits(records: list[CompletionRecord], settle_first: bool) -> bool:
    """Whether `records` can be stored by `ImplicitWriter`: all in implicit sessions, none to be
    settled first, none whose swap doubt must be settled against the registry and the swap
    boundaries."""
    return not settle_first and all(r.implicit_session and r.swap_doubt is None for r in records)


def _placeholders(start: int, count: int) -> str:
    return "(" + ", ".join(f"${i}" for i in range(start, start + count)) + ")"


@functools.cache
def _statement(keys: tuple[str, ...], n: int) -> str:
    """INSERT of `n` completions with columns `keys`, a CTE inserting their sessions first.
    Server-side placeholders ($1, ...): the driver has nothing to parse."""
    sessions = [
        tuple(f"${1 + i * _SESSION_COLUMNS + j}" for j in range(_SESSION_COLUMNS)) for i in range(n)
    ]
    base = 1 + n * _SESSION_COLUMNS
    rows = [_placeholders(base + i * len(keys), len(keys)) for i in range(n)]
    return (
        "WITH implicit_sessions AS ("
        + insert_implicit_sql(sessions)
        + ") INSERT INTO completions ("
        + ", ".join(keys)
        + ") VALUES "
        + ", ".join(rows)
    )


def _value(key: str, value: Any) -> Any:
    return json.dumps(value) if key in _JSON_COLUMNS else value


class ImplicitWriter:
    """Stores batches that `fit` with one statement each, on one autocommit connection held
    between batches (no pool checkout, liveness ping or BEGIN/COMMIT per batch). Any failure
    drops the connection: a dead one is never reused, and the next batch takes a fresh one.
    Used by one task at a time (the recorder's writer)."""

    def __init__(self, engine: AsyncEngine, *, idle_s: float = IDLE_S) -> None:
        self._engine = engine
        self._idle_s = idle_s
        self._conn: AsyncConnection | None = None
        self._cursor: psycopg.AsyncRawCursor | None = None
        self._used = 0.0  # time.monotonic() of the last statement

    async def _connect(self) -> psycopg.AsyncRawCursor:
        conn = await self._engine.connect()
        try:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            driver = (await conn.get_raw_connection()).driver_connection
            self._conn, self._cursor = conn, psycopg.AsyncRawCursor(driver)
        except BaseException:
            await _discard(conn)
            raise
        return self._cursor

    async def store(self, records: list[CompletionRecord]) -> None:
        """Store `records` (see `fits`): all of them or none. Its success is the commit's (a
        statement outside a transaction commits before it answers)."""
        if not records:
            return
        rows = [r.row() for r in records]
        keys = tuple(rows[0])
        params: list[Any] = []
        for r in records:
            params += (r.session_id, r.created_at, r.tenant, r.agent_key_id)
        for row in rows:
            params += (_value(k, v) for k, v in row.items())
        if self._conn is not None and time.monotonic() - self._used > self._idle_s:
            conn, self._conn, self._cursor = self._conn, None, None
            await conn.close()  # back to the pool, which pings it before its next use
        cursor = self._cursor or await self._connect()
        try:
            # Not prepared: each statement carries its text, so that what commits is visible on
            # the wire (tests/pg_fault_proxy.py traps it like a COMMIT).
            await cursor.execute(_statement(keys, len(rows)), params, prepare=False)
        except BaseException:
            await self.close()
            raise
        self._used = time.monotonic()

    async def close(self) -> None:
        """Drop the held connection (it is never returned to the pool: its state is unknown)."""
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            await _discard(conn)


async def _discard(conn: AsyncConnection) -> None:
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()
