"""The aiohttp upstream client against real sockets: its answers, and every fault a failing
backend produces, raised as the httpx errors the proxy tells apart (connect vs cut vs timeout)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from gateway.proxy.upstream import AiohttpUpstream

from raw_backend import STREAM_HEAD, RawBackend, chunk, respond, wait_until_closed


@pytest.fixture
def backend() -> Iterator[callable]:
    made: list[RawBackend] = []

    def make(script) -> RawBackend:
        made.append(RawBackend(script))
        return made[-1]

    yield make
    for b in made:
        b.close()


def run(coro_fn, timeout_s: float = 30.0, connect_timeout_s: float = 5.0):
    async def main():
        upstream = AiohttpUpstream(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
        try:
            return await coro_fn(upstream)
        finally:
            await upstream.aclose()

    return asyncio.run(main())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_whole_answer_and_its_request(backend):
    seen: list[bytes] = []

    def answer(conn, head):
        seen.append(head)
        conn.sendall(respond(201, b'{"ok": true}'))

    b = backend(answer)
    reply = run(lambda up: up.post(b.url + "/v1/chat/completions", {"model": "m", "x": "é"}))
    assert reply.status_code == 201 and reply.json() == {"ok": True}
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1")
    assert b"content-type: application/json" in seen[0].lower()


def test_a_refused_connection_is_a_connect_error():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(httpx.ConnectError):
        run(lambda up: up.post(url + "/v1/completions", {}))
    with pytest.raises(httpx.ConnectError):
        run(lambda up: up.stream(url + "/v1/completions", {}))


def test_a_hang_up_before_answering_is_not_a_connect_error(backend):
    """The request reached the backend (it may be generating): never retried elsewhere."""
    b = backend(lambda conn, head: conn.close())
    with pytest.raises(httpx.HTTPError) as caught:
        run(lambda up: up.post(b.url + "/v1/completions", {}))
    assert not isinstance(caught.value, httpx.ConnectError | httpx.ConnectTimeout)


def test_a_stream_arrives_as_sent_and_a_cut_raises_after_the_data(backend):
    def cut(conn, head):
        conn.sendall(STREAM_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: 2\n\n"))
        conn.close()  # no terminating chunk

    b = backend(cut)

    async def read(up):
        stream = await up.stream(b.url + "/v1/chat/completions", {"stream": True})
        got = b""
        try:
            async for data in stream.aiter_bytes():
                got += data
        except httpx.HTTPError as exc:
            return stream.status_code, got, exc
        finally:
            await stream.aclose()
        return stream.status_code, got, None

    status, got, error = run(read)
    assert status == 200 and got == b"data: 1\n\ndata: 2\n\n"
    assert isinstance(error, httpx.RemoteProtocolError)


def test_a_stalled_stream_is_a_read_timeout(backend):
    release = threading.Event()

    def stall(conn, head):
        conn.sendall(STREAM_HEAD + chunk(b"data: 1\n\n"))
        release.wait(10)

    b = backend(stall)

    async def read(up):
        stream = await up.stream(b.url + "/v1/chat/completions", {"stream": True})
        try:
            return [data async for data in stream.aiter_bytes()]
        finally:
            await stream.aclose()

    try:
        with pytest.raises(httpx.ReadTimeout):
            run(read, timeout_s=0.5)
    finally:
        release.set()


def test_closing_a_stream_early_hangs_up_on_the_backend(backend):
    """The backend must see the client leave (vLLM then aborts the generation)."""
    hung_up = threading.Event()

    def endless(conn, head):
        conn.sendall(STREAM_HEAD + chunk(b"data: 1\n\n"))
        if wait_until_closed(conn, 10):
            hung_up.set()

    b = backend(endless)

    async def read_one(up):
        stream = await up.stream(b.url + "/v1/chat/completions", {"stream": True})
        async for data in stream.aiter_bytes():
            assert data == b"data: 1\n\n"
            break
        await stream.aclose()

    run(read_one)
    assert hung_up.wait(5)


def test_an_error_status_and_its_body(backend):
    body = json.dumps({"error": {"message": "no"}}).encode()
    b = backend(lambda conn, head: conn.sendall(respond(500, body)))

    async def both(up):
        whole = await up.post(b.url + "/v1/completions", {})
        stream = await up.stream(b.url + "/v1/completions", {"stream": True})
        content = await stream.aread()
        await stream.aclose()
        return whole, stream.status_code, content

    whole, status, content = run(both)
    assert (whole.status_code, whole.content) == (500, body)
    assert (status, content) == (500, body)


def test_no_cookie_goes_back_to_a_backend(backend):
    seen: list[bytes] = []

    def answer(conn, head):
        seen.append(head)
        body = b"{}"
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nset-cookie: sid=secret; Path=/\r\ncontent-type: application/json"
            b"\r\ncontent-length: 2\r\nconnection: close\r\n\r\n" + body
        )

    b = backend(answer)
    url = b.url.replace("127.0.0.1", "localhost")  # a cookie jar refuses IP addresses' cookies

    async def twice(up):
        await up.post(url + "/v1/completions", {})
        await up.post(url + "/v1/completions", {})

    run(twice)
    assert len(seen) == 2 and b"cookie" not in seen[1].lower()
