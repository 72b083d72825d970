"""Telling an unreachable database (restarting, cut off, too slow) from a failing statement."""

from __future__ import annotations

import psycopg
from sqlalchemy import exc as sa_exc


class DatabaseUnavailable(Exception):
    """The database could not be reached in the time allowed."""


def is_connection_error(exc: BaseException) -> bool:
    """True when `exc` says the database connection failed or timed out, not that the statement
    was wrong: worth retrying on a new connection, and a 503 (not a 500) when it persists.

    Postgres restarting or terminating the backend, a refused or timed-out connect, a connection
    dropped mid-statement, a full pool and a serialization or deadlock failure all count
    (psycopg raises them as OperationalError); constraint violations and programming errors
    do not."""
    if isinstance(exc, DatabaseUnavailable | TimeoutError | ConnectionError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) or (
            is_connection_error(exc.orig) if exc.orig is not None else False
        )
    if isinstance(exc, sa_exc.TimeoutError):  # no pooled connection came free in time
        return True
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def describe(exc: BaseException) -> str:
    """`exc` for a log line: its type, and its message when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def is_timeout(exc: BaseException) -> bool:
    """True when the database did not answer in the time allowed (an attempt cut off, or no
    pooled connection free in time): a slow database and an unreachable one look the same here,
    unlike a refused or dropped connection, which says the database is down."""
    return isinstance(exc, TimeoutError | sa_exc.TimeoutError)
