"""The one place that creates `sessions` rows: every statement inserting a session is built here.

A named session is created open: by the sessions API, on its first use by a generation request
(owned by the caller's tenant, remembering the agent key it was opened with; pinned to a
canary's candidate when drawn into one), or by the trainer's gate for its evaluations. An
implicit session holds exactly the one completion of a call that named no session: it is born
closed, when its completion is created, by the statement that inserts that completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import CTE
from sqlalchemy.dialects.postgresql import Insert, insert

from rlgw.db.models import AgentSession
from rlgw.session_status import SessionStatus

_SESSIONS = AgentSession.__table__


# ----------------------------------------------------------------------------- named sessions


def insert_named(**columns: Any) -> Insert:
    """INSERT of a new named session with `columns` (id, tenant, agent_key_id, ...): open."""
    return insert(AgentSession).values(**columns)


def insert_named_sql(*, pinned: bool = False) -> str:
    """INSERT (text) of a named session on its first use by a generation request: `:id`, owned
    by `:tenant`, opened with `:agent_key_id`, and with `pinned` pinned to `:pin_version` of
    `:pin_model`. A session that exists is left as it is; RETURNING is the caller's."""
    columns, values = "id, tenant, agent_key_id", ":id, :tenant, :agent_key_id"
    if pinned:
        columns += ", pinned_model, pinned_version"
        values += ", :pin_model, :pin_version"
    return f"INSERT INTO sessions ({columns}) VALUES ({values}) ON CONFLICT (id) DO NOTHING"


# ----------------------------------------------------------------------------- implicit sessions


def implicit_session(
    session_id: Any, created_at: Any, tenant: Any, agent_key_id: Any
) -> dict[str, Any]:
    """The row of an implicit session whose one completion was created at `created_at`. It holds
    nothing else, so it is born closed. The values may be Python values, bound parameters or SQL
    placeholders (`insert_implicit_sql`)."""
    return {
        "id": session_id,
        "implicit": True,
        "status": SessionStatus.CLOSED,
        "closed_at": created_at,
        "tenant": tenant,
        "agent_key_id": agent_key_id,
    }


def insert_implicit() -> Insert:
    """INSERT of `implicit_session` rows (executemany); one that exists is left as it is."""
    return insert(_SESSIONS).on_conflict_do_nothing()


def insert_implicit_cte(
    name: str, *, session_id: Any, created_at: Any, tenant: Any, agent_key_id: Any
) -> CTE:
    """A CTE `name` inserting one implicit session (values: usually bound parameters), to go
    ahead of the INSERT of its completion in the same statement."""
    row = implicit_session(session_id, created_at, tenant, agent_key_id)
    return insert(_SESSIONS).values(row).on_conflict_do_nothing().cte(name)


def insert_implicit_sql(placeholders: Sequence[tuple[str, str, str, str]]) -> str:
    """INSERT (text) of implicit sessions, one per tuple of server-side placeholders ($n) for
    its id, its completion's creation time, its tenant and its agent key."""
    rows = [implicit_session(*p) for p in placeholders]
    values = ", ".join("(" + ", ".join(_sql(v) for v in row.values()) + ")" for row in rows)
    return f"INSERT INTO sessions ({', '.join(rows[0])}) VALUES {values} ON CONFLICT DO NOTHING"


def _sql(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SessionStatus):
        return f"'{value}'"
    return value  # a placeholder
