"""A new session remembers the agent key that opened it, on every path that creates one: a named
session on first use (plain, or drawn into a canary and pinned) keeps the key of that first call,
never a later caller's. Real Postgres, no backend."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import create_engine, text

from gateway.proxy.canary import Draw
from gateway.proxy.session_binding import open_session
from migrations.runner import upgrade
from rlgw import agent_keys
from rlgw.db.engine import async_session_factory, make_async_engine, sync_session_factory

TENANT = "acme"


async def test_a_named_session_keeps_the_key_of_its_first_call(make_database):
    url = make_database()
    upgrade(url)
    sync = create_engine(url)
    with sync_session_factory(sync)() as db, db.begin():
        first, second = (agent_keys.mint(db, TENANT)[0].id for _ in range(2))
    engine = make_async_engine(url, pool_size=1)
    sessions = async_session_factory(engine)
    plain, drawn = f"plain-{uuid.uuid4().hex}", f"drawn-{uuid.uuid4().hex}"
    draw = Draw("tiny", 3, datetime.now(UTC) - timedelta(minutes=1))
    try:
        assert await open_session(sessions, plain, TENANT, None, first) == (None, None)
        assert await open_session(sessions, drawn, TENANT, draw, first) == ("tiny", 3)
        for session_id in (plain, drawn):  # a later call with another key changes nothing
            await open_session(sessions, session_id, TENANT, None, second)
    finally:
        await engine.dispose()
    with sync.connect() as conn:
        rows = conn.execute(
            text("SELECT id, tenant, agent_key_id FROM sessions WHERE id IN (:a, :b)"),
            {"a": plain, "b": drawn},
        ).all()
    sync.dispose()
    assert {tuple(r) for r in rows} == {(plain, TENANT, first), (drawn, TENANT, first)}
