"""Migrations create exactly the schema the models declare, and downgrade cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from migrations.runner import downgrade, upgrade
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


_OLD_VERDICTS = "SELECT id, eligible, eligibility_reason, is_orphan, orphan_reason FROM completions"


def test_reasons_migration_keeps_every_stored_verdict_both_ways(make_database):
    """0008 turns `eligible` + `eligibility_reason` into the list of reasons and `is_orphan` into
    "orphan_reason is set"; its downgrade gives the old columns back from them."""
    url = make_database()
    upgrade(url, "0007")
    engine = create_engine(url)
    verdicts = [  # id, eligible, eligibility_reason, is_orphan, orphan_reason
        ("kept", True, None, False, None),
        ("cut", False, "status is incomplete", False, None),
        ("retry", True, None, True, "retry superseded by kept"),
        ("both", False, "status is error", True, "continues orphan retry"),
    ]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sessions (id) VALUES ('s')"))
        for row in verdicts:
            conn.execute(
                text(
                    "INSERT INTO completions (id, session_id, api, model, status, stream, "
                    "request, created_at, eligible, eligibility_reason, is_orphan, orphan_reason) "
                    "VALUES (:id, 's', 'completions', 'm', 'complete', false, '{}', now(), "
                    ":eligible, :reason, :is_orphan, :orphan_reason)"
                ),
                dict(
                    zip(
                        ("id", "eligible", "reason", "is_orphan", "orphan_reason"), row, strict=True
                    )
                ),
            )
    upgrade(url)
    with engine.connect() as conn:
        migrated = conn.execute(
            text("SELECT id, ineligible_reasons, orphan_reason FROM completions")
        ).all()
    assert {(i, tuple(reasons), orphan) for i, reasons, orphan in migrated} == {
        ("kept", (), None),
        ("cut", ("status is incomplete",), None),
        ("retry", (), "retry superseded by kept"),
        ("both", ("status is error",), "continues orphan retry"),
    }
    downgrade(url, "0007")
    with engine.connect() as conn:
        assert set(conn.execute(text(_OLD_VERDICTS)).all()) == set(verdicts)
    engine.dispose()


def test_sampling_migration_adds_a_nullable_column_old_rows_keep_null(make_database):
    """0014 adds `completions.sampling`: rows recorded before it read null (they were recorded
    with raw log-probs and train at temperature 1); the downgrade drops it and keeps the rows."""
    url = make_database()
    upgrade(url, "0013")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sessions (id) VALUES ('s')"))
        conn.execute(
            text(
                "INSERT INTO completions (id, session_id, api, model, status, stream, request, "
                "created_at) VALUES ('old', 's', 'chat', 'm', 'complete', false, '{}', now())"
            )
        )
    upgrade(url, "0014")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT sampling FROM completions")).scalar_one() is None
        conn.execute(
            text(
                "INSERT INTO completions (id, session_id, api, model, status, stream, request, "
                "created_at, sampling) VALUES ('new', 's', 'chat', 'm', 'complete', false, '{}', "
                "now(), CAST(:s AS jsonb))"
            ),
            {"s": '{"temperature": 0.3, "top_p": 0.9}'},
        )
        stored = conn.execute(text("SELECT sampling FROM completions WHERE id = 'new'"))
        assert stored.scalar_one() == {"temperature": 0.3, "top_p": 0.9}
    downgrade(url, "0013")
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("completions")}
        ids = set(conn.execute(text("SELECT id FROM completions")).scalars())
    assert "sampling" not in columns and ids == {"old", "new"}
    engine.dispose()
