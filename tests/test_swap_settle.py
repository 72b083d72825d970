"""Records that crossed a swap's pause, settled when written (gateway/recording/swap_settle.py)
against the boundaries the swap stored (trainer/swap/boundary.py), on a real Postgres."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from gateway.recording.record import CompletionRecord
from gateway.recording.store import store_batch
from migrations.runner import upgrade
from rlgw import swap_boundaries as sb
from rlgw.db.engine import make_async_engine
from rlgw.db.models import Completion
from rlgw.eligibility import CROSSED_SWAP, SERVED_UNVERIFIED
from trainer.swap import boundary


@dataclass
class Registry:
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    backend_id: int


@pytest.fixture
def registry(make_database: Callable[[], str]) -> Iterator[Registry]:
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO models (id, name) VALUES (1, 'tiny')"))
        backend_id = conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (1, 'http://127.0.0.1:9', 'active', 4) RETURNING id"
            )
        ).scalar_one()
    yield Registry(url, engine, sessionmaker(engine), backend_id)
    engine.dispose()


def crossing(backend_id: int, lease_epoch: int, n_tokens: int) -> CompletionRecord:
    """A record leased at version 4 in `lease_epoch`, finished after a pause (the gateway's
    doubt: CROSSED_SWAP)."""
    rid = "chatcmpl-" + uuid.uuid4().hex
    now = datetime.now(UTC)
    return CompletionRecord(
        id=rid,
        session_id="implicit-" + rid,
        implicit_session=True,
        api="chat.completions",
        model="tiny",
        stream=True,
        request={"model": "tiny"},
        created_at=now,
        finished_at=now,
        backend_id=backend_id,
        policy_version=4,
        lease_epoch=lease_epoch,
        swap_doubt=CROSSED_SWAP,
        prompt_token_ids=[1, 2, 3],
        output_token_ids=list(range(10, 10 + n_tokens)),
        output_logprobs=[-0.5] * n_tokens,
        finish_reason="length",
        status="complete",
    )


def pause(registry: Registry, held: dict[str, int], finished: list[str] = ()) -> int:
    """A swap to version 5 pausing the backend, holding `held` (record id -> tokens so far)."""
    epoch = boundary.open_pause(
        registry.sessions, registry.backend_id, "applying version 5", from_version=4, to_version=5
    )
    state = {
        "running": {f"chatcmpl-{rid}-1a2b3c4d": n for rid, n in held.items()},
        "finished": [f"chatcmpl-{rid}-1a2b3c4d" for rid in finished],
    }
    boundary.store_counts(registry.sessions, registry.backend_id, epoch, state)
    return epoch


def write(registry: Registry, *records: CompletionRecord) -> None:
    async def store() -> None:
        engine = make_async_engine(registry.url)
        try:
            await store_batch(engine, [list(records)], settle_first=False)
        finally:
            await engine.dispose()

    asyncio.run(store())


def stored(registry: Registry, record: CompletionRecord) -> Completion:
    with registry.sessions() as db:
        return db.scalars(select(Completion).where(Completion.id == record.id)).one()


def test_a_record_held_by_a_pause_gets_one_version_per_token(registry):
    held, waiting, done = (crossing(registry.backend_id, 0, 6) for _ in range(3))
    epoch = pause(registry, {held.id: 4}, finished=[done.id])
    write(registry, held, waiting, done)
    row = stored(registry, held)
    assert row.output_versions == [4, 4, 4, 4, 5, 5] and row.policy_version == 4
    assert row.crossed_epochs == [epoch] and row.ineligible_reasons == []
    row = stored(registry, waiting)  # not started at the pause: every token from version 5
    assert row.output_versions is None and row.policy_version == 5
    assert row.ineligible_reasons == []
    row = stored(registry, done)  # finished before the pause: every token from version 4
    assert row.output_versions is None and row.policy_version == 4


def test_a_pause_without_a_boundary_leaves_the_record_untrained(registry):
    record = crossing(registry.backend_id, 0, 3)
    with registry.engine.begin() as conn:  # an epoch moved by hand: nobody counted
        conn.execute(text("UPDATE backends SET swap_epoch = swap_epoch + 1"))
    write(registry, record)
    row = stored(registry, record)
    assert row.ineligible_reasons == [str(CROSSED_SWAP)] and row.output_versions is None


def test_weights_that_fail_verification_mark_the_records_before_and_after(registry):
    early, late = crossing(registry.backend_id, 0, 5), crossing(registry.backend_id, 0, 5)
    epoch = pause(registry, {early.id: 2, late.id: 3})
    write(registry, early)  # finished while the new weights were being verified
    assert stored(registry, early).ineligible_reasons == []
    with registry.sessions() as db, db.begin():
        marked = boundary.close(db, registry.backend_id, epoch, sb.FAILED)
    assert marked == [early.id]
    assert stored(registry, early).ineligible_reasons == [str(SERVED_UNVERIFIED)]
    write(registry, late)  # finished after the failure was known
    assert stored(registry, late).ineligible_reasons == [str(SERVED_UNVERIFIED)]


def test_a_writer_waits_for_the_counts_of_a_pause_being_taken(registry):
    record = crossing(registry.backend_id, 0, 4)
    counted, written = threading.Event(), threading.Event()

    def swap() -> None:
        with boundary.boundary_lock(registry.engine, registry.backend_id):
            epoch = boundary.open_pause(
                registry.sessions, registry.backend_id, "v5", from_version=4, to_version=5
            )
            writer = threading.Thread(target=lambda: (write(registry, record), written.set()))
            writer.start()
            assert not written.wait(1.0)  # the writer waits for the counts
            boundary.store_counts(
                registry.sessions,
                registry.backend_id,
                epoch,
                {"running": {f"chatcmpl-{record.id}-1a2b3c4d": 1}, "finished": []},
            )
            counted.set()
        writer.join(30)

    swap()
    assert counted.is_set() and written.is_set()
    assert stored(registry, record).output_versions == [4, 5, 5, 5]
