"""Which database errors count as an unreachable database (retry, 503) and which do not (500)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg_errors
from sqlalchemy import exc as sa_exc

from rlgw.db.faults import DatabaseUnavailable, is_connection_error


def _wrapped(cls: type[sa_exc.DBAPIError], orig: Exception, **kwargs) -> sa_exc.DBAPIError:
    return cls("SELECT 1", {}, orig, **kwargs)


@pytest.mark.parametrize(
    "exc",
    [
        DatabaseUnavailable("down"),
        TimeoutError(),
        ConnectionResetError(),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        pg_errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.InterfaceError("the connection is closed"),
        _wrapped(sa_exc.OperationalError, psycopg.OperationalError("connection refused")),
        _wrapped(sa_exc.InterfaceError, psycopg.InterfaceError("connection closed")),
        _wrapped(sa_exc.DBAPIError, Exception("?"), connection_invalidated=True),
        sa_exc.TimeoutError("QueuePool limit reached"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_connection_failures_are_retried(exc: Exception) -> None:
    assert is_connection_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        _wrapped(sa_exc.IntegrityError, pg_errors.UniqueViolation("duplicate key")),
        _wrapped(sa_exc.ProgrammingError, pg_errors.UndefinedTable("no such table")),
        _wrapped(sa_exc.DataError, pg_errors.InvalidTextRepresentation("bad input")),
        pg_errors.UniqueViolation("duplicate key"),
        ValueError("not a database error"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_statement_errors_are_not(exc: Exception) -> None:
    assert not is_connection_error(exc)
