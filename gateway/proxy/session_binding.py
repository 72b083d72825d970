"""Binds a generation request to its session: named (path or X-Session-Id) or implicit."""

from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker

from rlgw.session_rows import insert_named_sql
from rlgw.session_status import SessionStatus

from ..auth import tenant_sees
from ..errors import APIError, session_not_found
from ..ids import SESSION_ID_PATTERN
from .canary import OPEN_AND_PIN, Draw

_SESSION_ID = re.compile(SESSION_ID_PATTERN)
IMPLICIT_PREFIX = "auto-"

# One round trip: create the session if it is new (owned by the caller's tenant, opened with the
# caller's agent key), and read its status, tenant and pinned version either way.
_OPEN_OR_CREATE = text(
    f"""
    WITH created AS (
        {insert_named_sql()} RETURNING status, tenant, pinned_model, pinned_version
    )
    SELECT status, tenant, pinned_model, pinned_version FROM created
    UNION ALL
    SELECT status, tenant, pinned_model, pinned_version FROM sessions WHERE id = :id
    LIMIT 1
    """
)


def validate_session_id(session_id: str) -> str:
    if not _SESSION_ID.fullmatch(session_id):
        raise APIError(
            400,
            "session id must be 1-128 characters of letters, digits and . _ : - "
            "(starting with a letter or digit)",
            code="invalid_session_id",
        )
    return session_id


async def open_session(
    db_sessions: async_sessionmaker,
    session_id: str,
    tenant: str | None = None,
    draw: Draw | None = None,
    key_id: str | None = None,
) -> tuple[str | None, int | None]:
    """Create the named session on first use; refuse if it is no longer open (409). With a
    `tenant` (auth on), another tenant's session is reported missing (404), as if it did not
    exist; without one (auth off) every session is reachable. A new session remembers the agent
    key `key_id` it was opened with (its training consent). A `draw` (a canary's) pins a new
    session to its version. Returns the session's pin: (model, version), or (None, None)."""
    validate_session_id(session_id)
    params = {
        "id": session_id,
        "tenant": tenant,
        "agent_key_id": key_id,
        **(draw.params() if draw else {}),
    }
    async with db_sessions() as db, db.begin():
        row = (await db.execute(OPEN_AND_PIN if draw else _OPEN_OR_CREATE, params)).first()
    if row is None:  # created by a concurrent request after this statement's snapshot
        async with db_sessions() as db:
            row = (
                await db.execute(
                    text(
                        "SELECT status, tenant, pinned_model, pinned_version FROM sessions "
                        "WHERE id = :id"
                    ),
                    params,
                )
            ).one()
    status, owner, pinned_model, pinned_version = row
    if not tenant_sees(tenant, owner):
        raise session_not_found(session_id)
    if status != SessionStatus.OPEN:
        raise APIError(
            409,
            f"session {session_id} is {status}: it accepts no more completions",
            code="session_not_open",
        )
    return pinned_model, pinned_version


def implicit_session_id(completion_id: str) -> str:
    """A call that names no session gets a one-completion session of its own."""
    return IMPLICIT_PREFIX + completion_id
