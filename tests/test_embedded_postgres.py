"""With no database URL, the project runs on an embedded Postgres under RLGW_HOME that keeps its
data when the processes using it stop and a later one starts it again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pgserver")

WRITE = """
import psycopg
from rlgw_cli.database import resolve_database_url
from rlgw.db.urls import to_libpq_uri
from rlgw.settings import Settings
url = resolve_database_url(Settings())
with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
    conn.execute("CREATE TABLE kept (note text)")
    conn.execute("INSERT INTO kept VALUES ('written before the restart')")
print(url)
"""
READ = """
import psycopg
from rlgw_cli.database import resolve_database_url
from rlgw.db.urls import to_libpq_uri
from rlgw.settings import Settings
url = resolve_database_url(Settings())
with psycopg.connect(to_libpq_uri(url)) as conn:
    print(conn.execute("SELECT note FROM kept").fetchone()[0])
"""


def _run(code: str, home: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RLGW_DATABASE_URL"}
    env["RLGW_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_embedded_postgres_keeps_data_across_restarts(tmp_path: Path) -> None:
    home = tmp_path / "rlgw-home"
    first = _run(WRITE, home)
    assert (home / "pgdata" / "PG_VERSION").exists()  # under RLGW_HOME, not elsewhere
    assert "postgresql+psycopg://" in first
    assert not (home / "pgdata" / "postmaster.pid").exists()  # that server stopped with it
    assert "written before the restart" in _run(READ, home)  # a new server, the same data
