"""The relay answers the events of one read of the backend in one write to the client (not one
per event), ends the response with its last events (not in a write of its own), and the client
still gets every event, each recorded. (And a started gateway keeps
what its startup made out of the garbage collector's walks: gc.freeze.)"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from gateway.main import create_app
from rlgw.db.migrate import upgrade

from conftest import ADMIN_KEY, LiveServer, fetch_record, free_port, gateway_settings
from fakes import FAKE_BACKEND, FAKE_MODEL, _sse_chunks

CHUNKS = _sse_chunks(True, FAKE_MODEL)  # two token events, then [DONE]


@pytest.fixture(scope="module")
def database(make_database: Callable[[], str]) -> str:
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO models (id, name) VALUES (1, :m)"), {"m": FAKE_MODEL})
        conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (1, :url, 'active', 0)"
            ),
            {"url": FAKE_BACKEND},
        )
    engine.dispose()
    return url


def backend(reads: list[bytes]) -> Callable[[httpx.Request], httpx.Response]:
    async def body():
        for data in reads:
            yield data

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return answer


class CountingWrites:
    """ASGI wrapper: the body messages the app sent, (path, body, more_body)."""

    def __init__(self, app: Any) -> None:
        self.app, self.writes = app, []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counting(message: Any) -> None:
            if message["type"] == "http.response.body":
                body, more = message.get("body", b""), message.get("more_body", False)
                self.writes.append((scope["path"], body, more))
            await send(message)

        await self.app(scope, receive, counting if scope["type"] == "http" else send)


@pytest.fixture
def gateway(database: str) -> Iterator[Callable[[list[bytes]], tuple[str, CountingWrites]]]:
    servers: list[LiveServer] = []

    def start(reads: list[bytes]) -> tuple[str, CountingWrites]:
        app = create_app(
            gateway_settings(database), upstream_transport=httpx.MockTransport(backend(reads))
        )
        counted = CountingWrites(app)
        servers.append(LiveServer(counted, free_port()).__enter__())
        return servers[-1].url, counted

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def stream(url: str) -> tuple[str, httpx.Response]:
    with httpx.Client(base_url=url, timeout=30) as http:
        body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "x"}]}
        reply = http.post("/v1/chat/completions", json=body | {"stream": True})
    return reply.text, reply


@pytest.mark.parametrize("together", [True, False], ids=["one-read", "a-read-per-event"])
def test_events_of_one_read_go_out_in_one_write(gateway, together: bool):
    reads = [b"".join(CHUNKS)] if together else CHUNKS
    url, counted = gateway(reads)
    body, reply = stream(url)
    assert reply.status_code == 200
    assert body.count("data: ") == 3 and body.endswith("data: [DONE]\n\n")
    writes = [(w, more) for path, w, more in counted.writes if path == "/v1/chat/completions"]
    # The token events: one write when they came in one read, one each otherwise; then the
    # stream's [DONE] (after the record is stored) with the end of the response.
    assert len(writes) == (2 if together else 3)
    assert writes[-1] == (b"data: [DONE]\n\n", False)
    assert all(more for _, more in writes[:-1])
    with httpx.Client(base_url=url, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        record = fetch_record(admin, reply.headers["X-Completion-Id"])
    assert record["status"] == "complete" and record["output_token_ids"] == [7, 8]


def test_what_startup_made_is_frozen_out_of_the_collector(gateway):
    gateway(CHUNKS)  # a gateway in this process, started
    assert gc.get_freeze_count() > 0
