"""Every reason a completion is not trained on is stored and shown, none overwriting another.

Real Postgres, a gateway on a fake vLLM upstream that answers slowly, so that facts can change
while a request is in flight: its session is closed and its backend enters a weight swap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import psycopg
import pytest

from gateway.main import create_app
from gateway.recording.store import mark_doubtful
from rlgw.db.engine import make_async_engine
from rlgw.db.urls import to_libpq_uri
from rlgw.eligibility import CROSSED_SWAP, DOUBTFUL_COMMIT, session_reason

from conftest import ADMIN_KEY, LiveServer, free_port, gateway_settings
from fakes import FAKE_MODEL, fake_backend_database, vllm_like

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
DELAY_S = 2.0  # how long the fake backend takes to answer


@pytest.fixture(scope="module")
def db_url(make_database: Callable[[], str]) -> str:
    return fake_backend_database(make_database)


@contextmanager
def slow_gateway(db_url: str) -> Iterator[tuple[httpx.Client, object]]:
    app = create_app(
        gateway_settings(db_url), upstream_transport=httpx.MockTransport(vllm_like(DELAY_S))
    )
    with (
        LiveServer(app, free_port()) as live,
        httpx.Client(base_url=live.url, timeout=60, headers={"X-Admin-Key": ADMIN_KEY}) as http,
    ):
        yield http, app.state.context.pool


def _wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _excluded_twice(db_url: str, http: httpx.Client, pool, session_id: str) -> str:
    """One completion of `session_id` whose session is closed and whose backend's swap epoch
    moves while the backend is generating it; returns its id."""
    (backend,) = pool.backends()
    epoch = backend.swap_epoch
    with ThreadPoolExecutor(1) as runner:
        pending = runner.submit(http.post, f"/sessions/{session_id}/v1/chat/completions", json=CHAT)
        _wait_until(lambda: backend.in_flight == 1)
        assert http.post(f"/v1/sessions/{session_id}/close").status_code == 200
        with psycopg.connect(to_libpq_uri(db_url), autocommit=True) as db:
            db.execute(
                "UPDATE backends SET swap_epoch = swap_epoch + 1 WHERE id = %s", (backend.id,)
            )
            db.execute("SELECT pg_notify('rlgw_backends', %s)", (str(backend.id),))
        _wait_until(lambda: backend.swap_epoch == epoch + 1)  # the gateway heard of it
        reply = pending.result(timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


def test_a_completion_excluded_for_two_causes_shows_both(db_url):
    with slow_gateway(db_url) as (http, pool):
        completion_id = _excluded_twice(db_url, http, pool, "two-causes")
        record = http.get(f"/admin/completions/{completion_id}").json()
        summary = http.get("/v1/sessions/two-causes").json()["completions"][0]
        (step,) = http.get("/v1/sessions/two-causes/trajectory").json()["steps"]

    both = [session_reason("closed"), CROSSED_SWAP]
    assert record["status"] == "complete"  # its evidence is complete: only the facts exclude it
    assert record["ineligible_reasons"] == both
    assert record["eligible"] is False and record["eligibility_reason"] == "; ".join(both)
    assert record["is_orphan"] is False and record["orphan_reason"] is None
    assert summary["ineligible_reasons"] == both and summary["eligible"] is False
    assert step["ineligible_reasons"] == both and step["eligibility_reason"] == "; ".join(both)


async def test_a_doubtful_commit_adds_its_reason_once_and_keeps_the_others(db_url):
    with slow_gateway(db_url) as (http, pool):
        completion_id = _excluded_twice(db_url, http, pool, "three-causes")
    engine = make_async_engine(db_url)
    try:
        doubtful = {completion_id: "three-causes"}
        assert await mark_doubtful(engine, doubtful) == [completion_id]
        assert await mark_doubtful(engine, doubtful) == []  # already there: not added twice
    finally:
        await engine.dispose()
    with slow_gateway(db_url) as (http, _):
        record = http.get(f"/admin/completions/{completion_id}").json()
    assert record["ineligible_reasons"] == [
        session_reason("closed"),
        CROSSED_SWAP,
        DOUBTFUL_COMMIT,
    ]
