"""Migrations create exactly the schema the models declare, and downgrade cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from rlgw.db.migrate import downgrade, upgrade
from rlgw.db.models import Base

TABLES = {"models", "backends", "policy_versions", "sessions", "completions", "rewards"}


def test_upgrade_creates_the_declared_schema(make_database):
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) >= TABLES
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()


def test_downgrade_removes_everything_and_upgrade_again_works(make_database):
    url = make_database()
    upgrade(url)
    downgrade(url, "base")
    engine = create_engine(url)
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    upgrade(url)
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) >= TABLES
    engine.dispose()


def test_every_completion_query_path_has_an_index(make_database):
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        indexed = {tuple(ix["column_names"]) for ix in inspect(conn).get_indexes("completions")}
    engine.dispose()
    assert {("session_id", "created_at"), ("retry_group",), ("created_at",)} <= indexed
