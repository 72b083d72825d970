"""Finding the database: the configured URL, or an embedded Postgres under RLGW_HOME."""

from __future__ import annotations

import os

from rlgw.embedded_pg import start_embedded_postgres
from rlgw.settings import Settings


def resolve_database_url(settings: Settings) -> str:
    """The configured URL, else an embedded server's; exported so child processes share it."""
    url = settings.database_url or start_embedded_postgres(settings.home)
    os.environ["RLGW_DATABASE_URL"] = url
    return url
