"""Engines and session factories: async for the gateway, sync for the trainer and CLI."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

DEFAULT_CONNECT_TIMEOUT_S = 5


def connect_args(connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """libpq options that bound how long a dead or unreachable database can stall a caller.

    `connect_timeout` bounds a connect to a host that does not answer (libpq's minimum is 2 s;
    without it psycopg waits 130 s). Keepalives and `tcp_user_timeout` drop an established
    connection whose peer vanished (network partition, crashed host) within about 15 s instead
    of the kernel's ~15 minutes. A restart or a terminated backend closes the socket and is seen
    at once; `pool_pre_ping` then replaces stale pooled connections on checkout. Unix sockets
    ignore the TCP options."""
    return {
        "connect_timeout": max(2, round(connect_timeout_s)),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 15_000,
    }


def make_async_engine(
    url: str, *, pool_size: int = 10, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
) -> AsyncEngine:
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=10,
        pool_pre_ping=True,
        connect_args=connect_args(connect_timeout_s),
    )


def make_sync_engine(url: str, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> Engine:
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args(connect_timeout_s))


def async_session_factory(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


def sync_session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
