"""Binds a generation request to its session: named (path or X-Session-Id) or implicit."""

from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker

from .errors import APIError

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
IMPLICIT_PREFIX = "auto-"

# One round trip: create the session if it is new, and read its status either way.
_OPEN_OR_CREATE = text(
    """
    WITH created AS (
        INSERT INTO sessions (id) VALUES (:id) ON CONFLICT (id) DO NOTHING RETURNING status
    )
    SELECT status FROM created
    UNION ALL
    SELECT status FROM sessions WHERE id = :id
    LIMIT 1
    """
)


def validate_session_id(session_id: str) -> str:
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        raise APIError(
            400,
            "session id must be 1-128 characters of letters, digits and . _ : - "
            "(starting with a letter or digit)",
            code="invalid_session_id",
        )
    return session_id


async def open_session(sessions: async_sessionmaker, session_id: str) -> None:
    """Create the named session on first use; refuse if it is no longer open (409)."""
    validate_session_id(session_id)
    async with sessions() as db, db.begin():
        status = (await db.execute(_OPEN_OR_CREATE, {"id": session_id})).scalar_one_or_none()
    if status is None:  # created by a concurrent request after this statement's snapshot
        async with sessions() as db:
            status = (
                await db.execute(
                    text("SELECT status FROM sessions WHERE id = :id"), {"id": session_id}
                )
            ).scalar_one()
    if status != "open":
        raise APIError(
            409,
            f"session {session_id} is {status}: it accepts no more completions",
            code="session_not_open",
        )


def implicit_session_id(completion_id: str) -> str:
    """A call that names no session gets a one-completion session of its own."""
    return IMPLICIT_PREFIX + completion_id
