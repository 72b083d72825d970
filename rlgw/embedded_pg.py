"""Embedded PostgreSQL (the `pgserver` package) for machines where no database URL is configured."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import psycopg

from rlgw.db.urls import to_sqlalchemy_url

DATABASE_NAME = "rlgw"

_servers: dict[Path, Any] = {}  # keep handles alive: pgserver stops the server when the last goes


def start_embedded_postgres(home: Path, database: str = DATABASE_NAME) -> str:
    """Start (or join) the Postgres server under <home>/pgdata; return a psycopg SQLAlchemy URL.

    Data persists across restarts. The server stops when the last process using it exits.
    """
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver  # imported lazily: it sets up a lock directory on import

    pgdata = (home / "pgdata").resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    print(f"[rlgw] embedded Postgres at {pgdata}", file=sys.stderr, flush=True)
    server = _servers.get(pgdata) or pgserver.get_server(pgdata, cleanup_mode="stop")
    _servers[pgdata] = server
    admin_uri = server.get_uri()
    _ensure_database(admin_uri, database)
    return to_sqlalchemy_url(server.get_uri(database))


def _ensure_database(admin_uri: str, database: str) -> None:
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
