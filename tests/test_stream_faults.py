"""Faults a real vLLM cannot produce on demand (a cut stream, a 5xx), injected with a transport
stand-in and served by a real failing socket server (tests/raw_backend.py, met by the gateway's
own aiohttp client): the client is told, and the record is marked incomplete or error, never
complete."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from gateway.main import create_app
from migrations.runner import upgrade

from conftest import ADMIN_KEY, LiveServer, fetch_record, free_port, gateway_settings
from raw_backend import STREAM_HEAD, RawBackend, chunk, respond

FAKE_BACKEND = "http://fake-backend.invalid"


def _chunk(i: int, finish: str | None = None) -> bytes:
    body = {
        "id": "up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "delta": {"content": f"t{i}"},
                "token_ids": [i],
                "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.5}]},
                "finish_reason": finish,
            }
        ],
    }
    if i == 0:
        body["prompt_token_ids"] = [1, 2, 3]
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def cut_after_two_chunks(request: httpx.Request) -> httpx.Response:
    async def body():
        yield _chunk(0)
        yield _chunk(1)
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message")

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def ends_without_done(request: httpx.Request) -> httpx.Response:
    async def body():
        yield _chunk(0)
        yield _chunk(1)

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def server_error(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "engine dead: /srv/secret/path"}})


# The same faults from a real server, written on its socket.
def _raw_cut(conn, head) -> None:
    conn.sendall(STREAM_HEAD + chunk(_chunk(0)) + chunk(_chunk(1)))
    conn.close()  # no terminating chunk


def _raw_no_done(conn, head) -> None:
    conn.sendall(STREAM_HEAD + chunk(_chunk(0)) + chunk(_chunk(1)) + b"0\r\n\r\n")
    conn.close()


def _raw_server_error(conn, head) -> None:
    body = json.dumps({"error": {"message": "engine dead: /srv/secret/path"}}).encode()
    conn.sendall(respond(500, body))
    conn.close()


RAW = {
    cut_after_two_chunks: _raw_cut,
    ends_without_done: _raw_no_done,
    server_error: _raw_server_error,
}


def _database_with_backend(make_database: Callable[[], str], backend_url: str) -> str:
    url = make_database()
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO models (id, name) VALUES (1, 'fake')"))
        conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (1, :url, 'active', 0)"
            ),
            {"url": backend_url},
        )
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def fake_backend_db(make_database: Callable[[], str]) -> str:
    return _database_with_backend(make_database, FAKE_BACKEND)


@pytest.fixture(scope="module")
def raw_backend(make_database: Callable[[], str]) -> Iterator[tuple[list, str]]:
    """A real failing server (its script replaceable) and a database routing to it."""
    script: list = [None]
    backend = RawBackend(lambda conn, head: script[0](conn, head))
    yield script, _database_with_backend(make_database, backend.url)
    backend.close()


def healthy(handler: Callable) -> Callable:
    """The fault is in generation: `/health` answers 200, as a live vLLM's does (a failing one
    would take the backend out of the gateway's routing, see tests/test_backend_health.py)."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200) if request.url.path == "/health" else handler(request)

    return answer


@pytest.fixture(params=["mock", "socket"])
def gateway_with(request, fake_backend_db: str, raw_backend) -> Iterator[Callable]:
    """Starts a gateway whose backend answers with a fault: through an injected transport
    ("mock"), or from a real socket server reached by the gateway's own client ("socket")."""
    servers: list[LiveServer] = []

    def start(handler: Callable) -> str:
        if request.param == "mock":
            transport = httpx.MockTransport(healthy(handler))
            app = create_app(gateway_settings(fake_backend_db), upstream_transport=transport)
        else:
            script, db = raw_backend
            script[0] = RAW[handler]
            app = create_app(gateway_settings(db))
        servers.append(LiveServer(app, free_port()).__enter__())
        return servers[-1].url

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def _stream_until_error(url: str) -> tuple[list[str], Exception | None]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    ids: list[str] = []
    try:
        for chunk in client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "x"}], stream=True
        ):
            ids.append(chunk.id)
    except openai.APIError as exc:
        return ids, exc
    return ids, None


@pytest.mark.parametrize(
    "handler", [cut_after_two_chunks, ends_without_done], ids=["connection-cut", "no-done"]
)
def test_cut_stream_is_reported_and_recorded_incomplete(gateway_with, handler):
    url = gateway_with(handler)
    ids, error = _stream_until_error(url)
    assert error is not None, "the client must learn that the stream did not complete"
    with httpx.Client(base_url=url, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        record = fetch_record(admin, ids[0])
    assert record["status"] == "incomplete"
    assert record["eligible"] is False
    assert record["output_token_ids"] == [0, 1]  # what was produced before the cut is kept


def test_backend_5xx_becomes_502_without_leaking_details_and_is_recorded(gateway_with):
    url = gateway_with(server_error)
    with httpx.Client(base_url=url, timeout=30) as http:
        reply = http.post(
            "/v1/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "x"}]},
        )
    assert reply.status_code == 502
    assert "/srv/secret" not in reply.text
    assert reply.json()["error"]["code"] == "backend_error"
    with httpx.Client(base_url=url, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        record = fetch_record(admin, reply.headers["X-Completion-Id"])
    assert record["status"] == "error" and record["eligible"] is False
    assert "500" in record["status_reason"]
