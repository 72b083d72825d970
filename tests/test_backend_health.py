"""A dead backend leaves routing by itself (failover, probes) and comes back by itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from bench.fake_upstream import start_fake_upstream, stop
from gateway.main import create_app
from gateway.proxy.routing import BackendPool
from migrations.runner import upgrade
from rlgw.backend_state import CHANNEL
from rlgw.db.engine import async_session_factory, make_async_engine

from conftest import ADMIN_KEY, MODEL_NAME, LiveServer, fetch_record, free_port, gateway_settings

GHOST = "ghost"  # a model whose only backend is dead
LIVE_ID, DEAD_ID, GHOST_ID = 2, 1, 3
PROBE_INTERVAL_S = 0.3


@dataclass
class Stack:
    db_url: str
    dead_url: str  # a backend of MODEL_NAME beside the live one; nothing listens there
    ghost_port: int
    probing: str  # a gateway probing every PROBE_INTERVAL_S
    passive: str  # a gateway that probes only at its start: it learns of failures from requests

    def admin(self, base: str) -> httpx.Client:
        return httpx.Client(base_url=base, timeout=60, headers={"X-Admin-Key": ADMIN_KEY})

    def seen(self, base: str, backend_id: int) -> dict:
        with self.admin(base) as admin:
            (row,) = [b for b in admin.get("/admin/backends").json() if b["id"] == backend_id]
        return row


def insert_backend(db_url: str, backend_id: int, model_id: int, url: str) -> None:
    """An ACTIVE backend serving version 0, inserted directly (no probe of the URL at all), with
    the NOTIFY that makes running gateways re-read the registry."""
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO backends (id, model_id, url, state, served_version) "
                "VALUES (:id, :model_id, :url, 'active', 0)"
            ),
            {"id": backend_id, "model_id": model_id, "url": url},
        )
        conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": str(backend_id)})
    engine.dispose()


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def stack(make_database: Callable[[], str], vllm_url: str) -> Iterator[Stack]:
    db_url = make_database()
    upgrade(db_url)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO models (id, name) VALUES (1, :a), (2, :b)"),
            {"a": MODEL_NAME, "b": GHOST},
        )
    engine.dispose()
    ghost_port = free_port()
    insert_backend(db_url, LIVE_ID, 1, vllm_url)
    insert_backend(db_url, GHOST_ID, 2, f"http://127.0.0.1:{ghost_port}")
    fast = gateway_settings(db_url, backend_health_interval_s=PROBE_INTERVAL_S)
    slow = gateway_settings(db_url, backend_health_interval_s=3600.0)
    with (
        LiveServer(create_app(fast), free_port()) as probing,
        LiveServer(create_app(slow), free_port()) as passive,
    ):
        yield Stack(db_url, f"http://127.0.0.1:{free_port()}", ghost_port, probing.url, passive.url)


def test_requests_fail_over_from_a_dead_backend_and_all_succeed(stack: Stack):
    # The dead backend gets the lower id, so least-in-flight routing (ties by id) tries it
    # first; it joins after the passive gateway's only probe, so requests must find it dead.
    insert_backend(stack.db_url, DEAD_ID, 1, stack.dead_url)
    with stack.admin(stack.passive) as admin:
        wait_for(
            lambda: any(b["id"] == DEAD_ID for b in admin.get("/healthz").json()["backends"]),
            10,
            "the passive gateway sees the new backend",
        )
    assert stack.seen(stack.passive, DEAD_ID)["reachable_here"] is True  # not probed yet
    ids = []
    for base in (stack.passive, stack.probing):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        for i in range(6):
            messages = [{"role": "user", "content": f"hello {i}"}]
            if i % 2:
                stream = client.chat.completions.create(
                    model=MODEL_NAME, messages=messages, max_tokens=4, stream=True
                )
                ids.append(list(stream)[0].id)
            else:
                reply = client.chat.completions.create(
                    model=MODEL_NAME, messages=messages, max_tokens=4
                )
                ids.append(reply.id)
        ids.append(client.completions.create(model=MODEL_NAME, prompt="abc", max_tokens=4).id)
    with stack.admin(stack.passive) as admin:
        for completion_id in ids:
            record = fetch_record(admin, completion_id)
            assert record["status"] == "complete", record["status_reason"]
            assert (record["backend"], record["policy_version"]) == (LIVE_ID, 0)
    dead = stack.seen(stack.passive, DEAD_ID)  # found by the first request, not by a probe
    assert (dead["reachable_here"], dead["unreachable_reason"]) == (False, "ConnectError")
    assert dead["state"] == "active"  # health is this process's view; the registry is untouched


def test_probes_take_a_dead_backend_out_of_routing(stack: Stack):
    wait_for(
        lambda: stack.seen(stack.probing, GHOST_ID)["reachable_here"] is False,
        10 * PROBE_INTERVAL_S,
        "the probing gateway marks the dead backend",
    )
    assert stack.seen(stack.probing, GHOST_ID)["unreachable_reason"] == "ConnectError"
    health = httpx.get(f"{stack.probing}/healthz", timeout=30).json()
    routable = {b["id"]: b["routable"] for b in health["backends"]}
    assert routable[GHOST_ID] is False and routable[LIVE_ID] is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_model_with_only_dead_backends_gets_503_at_once_and_a_record(stack: Stack, stream):
    t0 = time.monotonic()
    reply = httpx.post(
        f"{stack.probing}/v1/chat/completions",
        json={"model": GHOST, "messages": [{"role": "user", "content": "x"}], "stream": stream},
        timeout=60,
    )
    assert time.monotonic() - t0 < 5  # not the 30 s hold of a weight swap
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "backend_unavailable"
    assert int(reply.headers["Retry-After"]) > 0
    with stack.admin(stack.probing) as admin:
        record = fetch_record(admin, reply.headers["X-Completion-Id"])
    assert record["status"] == "error" and record["eligible"] is False
    assert GHOST in record["status_reason"]


def test_a_call_whose_backend_refuses_the_connection_is_recorded_against_it(stack: Stack):
    # A model the passive gateway has never probed: the call itself finds its backend dead.
    engine = create_engine(stack.db_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO models (id, name) VALUES (3, 'phantom')"))
    engine.dispose()
    insert_backend(stack.db_url, 4, 3, f"http://127.0.0.1:{free_port()}")
    with stack.admin(stack.passive) as admin:
        wait_for(
            lambda: any(b["id"] == 4 for b in admin.get("/healthz").json()["backends"]),
            10,
            "the passive gateway sees the new backend",
        )
        reply = admin.post(
            "/v1/completions", json={"model": "phantom", "prompt": "x", "max_tokens": 4}
        )
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "backend_unavailable"
        record = fetch_record(admin, reply.headers["X-Completion-Id"])
    assert record["status"] == "error" and record["backend"] == 4
    assert "backend 4: ConnectError" in record["status_reason"]


def test_a_backend_that_answers_again_comes_back(stack: Stack, tmp_path: Path):
    # Fault injection (the brief permits it here): a stand-in server brings the dead port to
    # life, answering /health and generation for the model `ghost`.
    upstream = start_fake_upstream(stack.ghost_port, GHOST, log_path=tmp_path / "ghost.log")
    try:
        wait_for(
            lambda: stack.seen(stack.probing, GHOST_ID)["reachable_here"] is True,
            10 * PROBE_INTERVAL_S,
            "the backend is reachable again",
        )
        assert stack.seen(stack.probing, GHOST_ID)["unreachable_reason"] is None
        client = openai.OpenAI(base_url=f"{stack.probing}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model=GHOST, messages=[{"role": "user", "content": "x"}], max_tokens=4
        )
        with stack.admin(stack.probing) as admin:
            assert fetch_record(admin, reply.id)["backend"] == GHOST_ID
    finally:
        stop(upstream)


async def test_a_registry_refresh_keeps_this_process_health_view(stack: Stack):
    engine = make_async_engine(stack.db_url)
    try:
        pool = BackendPool(async_session_factory(engine))
        await pool.refresh()
        await pool.mark(LIVE_ID, "HTTP 503")
        await pool.refresh()
        views = {b.id: b for b in pool.backends()}
        assert views[LIVE_ID].unreachable_reason == "HTTP 503"
        assert not views[LIVE_ID].routable
    finally:
        await engine.dispose()
