"""Runs the Alembic migrations in this folder against a database URL, and tells how far a
database's schema is behind them."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would treat '%' in a password as a directive.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> None:
    command.current(alembic_config(url), verbose=True)


def head_revision() -> str:
    """The newest revision in migrations/."""
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(url: str) -> str | None:
    """The database's revision; None for a database that has never been migrated."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
