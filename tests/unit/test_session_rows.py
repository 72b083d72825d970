"""Session rows are created in one module (rlgw/session_rows.py), statuses named in one enum."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import bindparam
from sqlalchemy.dialects import postgresql

from rlgw.session_rows import (
    implicit_session,
    insert_implicit_cte,
    insert_implicit_sql,
    insert_named,
    insert_named_sql,
)
from rlgw.session_status import FINISHED, FINISHED_SQL, SessionStatus

ROOT = Path(__file__).resolve().parents[2]
CREATES_A_SESSION = re.compile(
    r"INSERT INTO sessions|insert\(AgentSession|(?<!class )AgentSession\("
)


def test_an_implicit_session_is_born_closed_when_its_completion_is_created():
    created = datetime(2026, 1, 1, tzinfo=UTC)
    row = implicit_session("auto-1", created, "acme", "key-1")
    assert row == {
        "id": "auto-1",
        "implicit": True,
        "status": "closed",
        "closed_at": created,
        "tenant": "acme",
        "agent_key_id": "key-1",
    }


def test_the_implicit_sessions_text_takes_one_tuple_of_placeholders_per_session():
    sql = insert_implicit_sql([("$1", "$2", "$3", "$4"), ("$5", "$6", "$7", "$8")])
    assert sql == (
        "INSERT INTO sessions (id, implicit, status, closed_at, tenant, agent_key_id) VALUES "
        "($1, true, 'closed', $2, $3, $4), ($5, true, 'closed', $6, $7, $8) "
        "ON CONFLICT DO NOTHING"
    )


def test_the_implicit_session_cte_binds_the_completions_values():
    cte = insert_implicit_cte(
        "implicit_session",
        session_id=bindparam("sid"),
        created_at=bindparam("at"),
        tenant=bindparam("tenant"),
        agent_key_id=bindparam("key"),
    )
    compiled = cte.element.compile(dialect=postgresql.dialect())
    assert "ON CONFLICT DO NOTHING" in str(compiled)
    assert {"sid", "at", "tenant", "key"} <= set(compiled.params)
    assert "closed" in compiled.params.values()


def test_a_named_session_on_first_use_is_pinned_only_when_drawn():
    assert insert_named_sql() == (
        "INSERT INTO sessions (id, tenant, agent_key_id) VALUES (:id, :tenant, :agent_key_id) "
        "ON CONFLICT (id) DO NOTHING"
    )
    pinned = insert_named_sql(pinned=True)
    assert "pinned_model, pinned_version" in pinned
    assert ":pin_model, :pin_version" in pinned


def test_a_named_session_is_inserted_with_the_columns_given():
    compiled = insert_named(id="s", tenant="acme").compile(dialect=postgresql.dialect())
    assert (compiled.params["id"], compiled.params["tenant"]) == ("s", "acme")
    assert str(compiled).startswith("INSERT INTO sessions ")


def test_statuses_are_their_stored_text():
    assert [str(s) for s in SessionStatus] == ["open", "closed", "claimed", "consumed", "dropped"]
    assert f"'{SessionStatus.CLOSED}'" == "'closed'"
    assert "claimed" in FINISHED and "open" not in FINISHED
    assert FINISHED_SQL == "('closed', 'claimed', 'consumed')"


def test_no_other_module_creates_a_session_row():
    creators = {
        str(path.relative_to(ROOT))
        for package in ("gateway", "rlgw", "trainer")
        for path in (ROOT / package).rglob("*.py")
        if CREATES_A_SESSION.search(path.read_text())
    }
    assert creators == {"rlgw/session_rows.py"}
