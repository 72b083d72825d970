"""Finding the database: the configured URL, or an embedded Postgres under RLGW_HOME; and making
sure a command finds the schema it needs."""

from __future__ import annotations

import os

from migrations.runner import current_revision, head_revision, upgrade
from rlgw.embedded_pg import start_embedded_postgres
from rlgw.settings import Settings


class SchemaOutOfDate(RuntimeError):
    """A configured database whose schema is not at this version's head revision."""


def resolve_database_url(settings: Settings) -> str:
    """The configured URL, else an embedded server's; exported so child processes share it."""
    url = settings.database_url or start_embedded_postgres(settings.home)
    os.environ["RLGW_DATABASE_URL"] = url
    return url


def ready_database_url(settings: Settings) -> str:
    """The database a command works on, with its schema up to date.

    The embedded database belongs to this state directory, so it is migrated here (a fresh
    RLGW_HOME works for any command). A configured database is shared with other processes and
    may be upgraded only on purpose: when it is behind, `SchemaOutOfDate` says what to run.
    """
    embedded = not settings.database_url
    url = resolve_database_url(settings)
    if embedded:
        upgrade(url)
        return url
    found, head = current_revision(url), head_revision()
    if found != head:
        raise SchemaOutOfDate(
            f"the database schema is at revision {found or 'none (empty database)'}, this rlgw "
            f"needs {head}: run `rlgw db upgrade`"
        )
    return url
