"""The one-statement write of implicit records: it stores exactly what the transactional write
stores, all of a batch or none of it, committed when it returns, in one statement; its held
connection is dropped when it fails (a terminated backend is ridden out by the recorder)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import event, text

from gateway.errors import APIError
from gateway.recording import implicit_batch
from gateway.recording.record import CompletionRecord
from gateway.recording.recorder import Recorder
from gateway.recording.store import store_batch
from migrations.runner import upgrade
from rlgw.db.engine import make_async_engine
from rlgw.eligibility import CROSSED_SWAP, NOT_FOLLOWING


def record(
    record_id: str | None = None, *, translated: bool = False, stream: bool = False
) -> CompletionRecord:
    rid = record_id or "chatcmpl-" + uuid.uuid4().hex
    now = datetime.now(UTC)
    return CompletionRecord(
        id=rid,
        session_id="implicit-" + rid,
        implicit_session=True,
        tenant="acme",
        agent_key_id=None,
        api="chat.completions",
        model="tiny",
        stream=stream,
        request={"model": "tiny", "messages": [{"role": "user", "content": "héllo \u2028"}]},
        backend_request={"model": "tiny", "x": [1, 2.5, None]} if translated else None,
        created_at=now,
        finished_at=now,
        policy_version=3,
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[7, 8],
        output_logprobs=[-0.25, -0.5],
        finish_reason="stop",
        status="complete",
        response={"id": rid, "choices": [{"index": 0, "text": "ok"}]},
        latency_ms=12.5,
        ttft_ms=None,
        continuation_hash="ab" * 32,
        continuation_len=5,
    )


@pytest.fixture
async def engine(make_database: Callable[[], str]) -> AsyncIterator:
    url = make_database()
    upgrade(url)
    engine = make_async_engine(url)
    yield engine
    await engine.dispose()


@pytest.fixture
async def writer(engine) -> AsyncIterator[implicit_batch.ImplicitWriter]:
    writer = implicit_batch.ImplicitWriter(engine)
    yield writer
    await writer.close()


async def terminate_backends(engine) -> int:
    """What a Postgres restart does to the clients of the database."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        ).scalar_one()


async def rows(engine, table: str, key: str, ids: list[str]) -> list[dict]:
    """The stored rows, every column as text, without `key` (the ids differ by design)."""
    async with engine.connect() as conn:
        found = await conn.execute(
            text(
                f"SELECT to_jsonb(t) AS row FROM {table} t WHERE {key} = ANY(:ids) ORDER BY {key}"
            ),
            {"ids": ids},
        )
        out = []
        for (row,) in found:
            for name in ("id", "session_id", "created_at", "closed_at", "finished_at"):
                row.pop(name, None)
            response = row.get("response")
            if isinstance(response, dict):
                response.pop("id", None)
            out.append(row)
        return out


@pytest.mark.parametrize("translated", [False, True])
async def test_stores_exactly_what_the_transactional_write_stores(engine, writer, translated: bool):
    fast, slow = record(translated=translated), record(translated=translated)
    assert implicit_batch.fits([fast], settle_first=False)
    await store_batch(engine, [[fast]], settle_first=False, implicit=writer)  # one statement
    await store_batch(engine, [[slow]], settle_first=True)  # the transactional write
    got = await rows(engine, "completions", "id", [fast.id, slow.id])
    assert len(got) == 2 and got[0] == got[1]
    sessions = await rows(engine, "sessions", "id", [fast.session_id, slow.session_id])
    assert len(sessions) == 2 and sessions[0] == sessions[1]
    async with engine.connect() as conn:  # the JSON text itself, too (json, not jsonb)
        texts = (
            await conn.execute(
                text(
                    "SELECT request::text, backend_request::text, backend_request IS NULL "
                    "FROM completions WHERE id = ANY(:ids)"
                ),
                {"ids": [fast.id, slow.id]},
            )
        ).all()
    assert texts[0] == texts[1]


async def test_a_batch_is_one_statement_committed_when_it_returns(engine, writer):
    statements: list[str] = []
    event.listen(
        engine.sync_engine,
        "before_cursor_execute",
        lambda conn, cursor, sql, params, context, many: statements.append(sql),
    )
    await writer.store([record()])  # connected (its checkout pings)
    statements.clear()
    batch = [record() for _ in range(5)]
    await store_batch(engine, [[r] for r in batch], settle_first=False, implicit=writer)
    assert statements == []  # not through SQLAlchemy's cursor: no ping, no BEGIN, no COMMIT
    async with engine.connect() as conn:  # the last statement of the writer's own connection
        calls = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'WITH implicit_sessions%'"
                )
            )
        ).scalar_one()
    assert calls == 1
    # Committed: another connection sees every row (a rolled-back write would leave none).
    assert len(await rows(engine, "completions", "id", [r.id for r in batch])) == 5


async def test_one_bad_row_stores_none_of_the_batch(engine, writer):
    first = record()
    await writer.store([first])
    batch = [record(), record(first.id), record()]  # the second collides with a stored id
    with pytest.raises(psycopg.errors.UniqueViolation):
        await writer.store(batch)
    assert await rows(engine, "completions", "id", [batch[0].id, batch[2].id]) == []
    await writer.store([batch[0]])  # and the writer goes on, on a fresh connection
    assert len(await rows(engine, "completions", "id", [batch[0].id])) == 1


async def test_a_dead_connection_is_dropped_not_reused(engine, writer):
    await writer.store([record()])
    assert await terminate_backends(engine) >= 1  # the writer's held connection among them
    lost = record()
    with pytest.raises(psycopg.OperationalError):
        await writer.store([lost])
    assert await rows(engine, "completions", "id", [lost.id]) == []
    await writer.store([lost])
    assert len(await rows(engine, "completions", "id", [lost.id])) == 1


async def test_a_connection_idle_too_long_is_exchanged_for_a_pinged_one(engine):
    writer = implicit_batch.ImplicitWriter(engine, idle_s=0.0)
    try:
        await writer.store([record()])
        assert await terminate_backends(engine) >= 1
        after = record()
        await writer.store([after])  # no failure: the pool's ping replaced the dead connection
    finally:
        await writer.close()
    assert len(await rows(engine, "completions", "id", [after.id])) == 1


async def test_the_recorder_rides_out_a_terminated_connection(engine):
    recorder = Recorder(engine, queue_size=16, batch_size=16)
    recorder.start()
    try:
        await recorder.record(record())
        assert await terminate_backends(engine) >= 1
        after = record()
        await recorder.record(after)  # retried on a fresh connection: stored once
    finally:
        await recorder.stop()
    assert len(await rows(engine, "completions", "id", [after.id])) == 1
    assert recorder.written == 2 and recorder.failed == 0


async def test_the_recorder_still_stores_the_good_neighbours_of_a_bad_record(engine):
    first = record()
    recorder = Recorder(engine, queue_size=16, batch_size=16)
    recorder.start()
    try:
        await recorder.record(first)
        batch = [record(), record(first.id), record()]
        outcomes = await asyncio.gather(
            *(recorder.record(r) for r in batch), return_exceptions=True
        )
    finally:
        await recorder.stop()
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], APIError) and outcomes[1].status == 503
    assert len(await rows(engine, "completions", "id", [batch[0].id, batch[2].id])) == 2


def test_other_batches_take_the_transactional_write():
    named = record()
    named.implicit_session = False
    assert not implicit_batch.fits([record(), named], settle_first=False)
    assert not implicit_batch.fits([record()], settle_first=True)
    blind = record()
    blind.swap_doubt = NOT_FOLLOWING
    assert not implicit_batch.fits([blind], settle_first=False)
    crossed = record()  # its versions per token are resolved from the swap's boundary first
    crossed.swap_doubt = CROSSED_SWAP
    assert not implicit_batch.fits([crossed], settle_first=False)
