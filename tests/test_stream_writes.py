"""The relay answers the events of one read of the backend in one write to the client (not one
per event; the stream's first event alone, so that nothing delays the first byte), ends the
response with its last events (not in a write of its own), and the client still gets every
event, each recorded. (And a started gateway keeps
what its startup made out of the garbage collector's walks: gc.freeze.)"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.main import create_app

from conftest import ADMIN_KEY, LiveServer, fetch_record, free_port, gateway_settings
from fakes import FAKE_MODEL, fake_backend_database

TOKENS = 6


def _chunk(i: int, tokens: int = TOKENS) -> bytes:
    choice = {
        "index": 0,
        "delta": {"content": f"t{i}"},
        "token_ids": [10 + i],
        "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.5}]},
        "finish_reason": "stop" if i == tokens - 1 else None,
    }
    body: dict[str, Any] = {"id": "up", "object": "chat.completion.chunk", "created": 1}
    body |= {"model": FAKE_MODEL, "choices": [choice]}
    if i == 0:
        body["prompt_token_ids"] = [1, 2, 3]
    return b"data: " + json.dumps(body).encode() + b"\n\n"


CHUNKS = [*(_chunk(i) for i in range(TOKENS)), b"data: [DONE]\n\n"]


@pytest.fixture(scope="module")
def database(make_database: Callable[[], str]) -> str:
    return fake_backend_database(make_database)


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
    assert body.count("data: ") == TOKENS + 1 and body.endswith("data: [DONE]\n\n")
    writes = [(w, more) for path, w, more in counted.writes if path == "/v1/chat/completions"]
    # The token events: the first alone, the rest of one read in one write (one write each when
    # each came in a read of its own); then the stream's [DONE] (after the record is stored)
    # with the end of the response.
    assert len(writes) == (3 if together else TOKENS + 1)
    assert writes[0][0].count(b"data: ") == 1
    assert writes[-1] == (b"data: [DONE]\n\n", False)
    assert all(more for _, more in writes[:-1])
    with httpx.Client(base_url=url, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        record = fetch_record(admin, reply.headers["X-Completion-Id"])
    assert record["status"] == "complete"
    assert record["output_token_ids"] == [10 + i for i in range(TOKENS)]


def test_what_startup_made_is_frozen_out_of_the_collector(gateway):
    gateway(CHUNKS)  # a gateway in this process, started
    assert gc.get_freeze_count() > 0


def test_a_long_read_goes_out_in_bounded_writes(gateway):
    """70 events in one read: the first alone, then at most 32 per write."""
    long = b"".join(_chunk(i, 70) for i in range(70)) + b"data: [DONE]\n\n"
    url, counted = gateway([long])
    body, reply = stream(url)
    assert reply.status_code == 200 and body.count("data: ") == 71
    writes = [w for path, w, _ in counted.writes if path == "/v1/chat/completions"]
    assert [w.count(b"data: ") for w in writes] == [1, 32, 32, 5, 1]
