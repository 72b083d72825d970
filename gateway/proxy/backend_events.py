"""Keeps this replica's backend view current: LISTEN for registry changes, re-read on reconnect."""

from __future__ import annotations

import asyncio
import logging

import psycopg

from rlgw.backend_state import CHANNEL
from rlgw.db.engine import DEFAULT_CONNECT_TIMEOUT_S, connect_args
from rlgw.db.urls import to_libpq_uri

from .routing import BackendPool

log = logging.getLogger("rlgw.backend_events")

LISTENER_NAME = "rlgw-registry-listener"
# Short: while disconnected, the completions this process records are excluded from training.
MAX_BACKOFF_S = 2.0


async def follow_registry(
    pool: BackendPool,
    database_url: str,
    *,
    poll_s: float,
    ready: asyncio.Event | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> None:
    """Refresh `pool` on every NOTIFY, and every `poll_s` seconds as a safety net.

    On (re)connection the registry is re-read in full, so a change made while the connection was
    down is never missed.
    """
    backoff = 0.5
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                to_libpq_uri(database_url),
                autocommit=True,
                application_name=LISTENER_NAME,
                **connect_args(connect_timeout_s),
            ) as conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                await pool.refresh()
                pool.follow(connected=True)
                backoff = 0.5
                if ready is not None:
                    ready.set()
                while True:
                    try:
                        async with asyncio.timeout(poll_s):
                            async for _ in conn.notifies():
                                await pool.refresh()
                    except TimeoutError:
                        await pool.refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database went away: keep the last view, reconnect
            pool.follow(connected=False)
            log.warning("registry listener lost its connection (%s); reconnecting", exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
