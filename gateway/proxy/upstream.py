"""The client of the backends' generation endpoints: aiohttp (C parser, uvloop transport), errors
in httpx's vocabulary, or an httpx client over an injected transport (fault tests)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx

from .fastjson import dumps, loads

_JSON = {"Content-Type": "application/json"}
# Below uvicorn's (vLLM's) 5 s keep-alive: a pooled connection is dropped before the backend
# drops it, not reused as it closes.
_KEEPALIVE_S = 4.0


@dataclass(slots=True)
class UpstreamReply:
    """A backend's whole answer."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        return loads(self.content)


class UpstreamStream(Protocol):
    """A backend's answer whose body is read as it comes (httpx.Response is one)."""

    status_code: int

    async def aread(self) -> bytes: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    async def post(self, url: str, body: Any) -> UpstreamReply: ...

    async def stream(self, url: str, body: Any) -> UpstreamStream: ...

    async def aclose(self) -> None: ...


@contextlib.contextmanager
def _as_httpx() -> Iterator[None]:
    """aiohttp's errors as the httpx errors the proxy tells apart: a failure to connect (nothing
    reached the backend: another may take the request), a timeout, a cut answer."""
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc)) from exc
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
    except aiohttp.SocketTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
    except aiohttp.ClientError as exc:
        raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
    except TimeoutError as exc:  # aiohttp's total timeout (unset here), to be safe
        raise httpx.ReadTimeout(str(exc) or "timed out") from exc


class _AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status

    async def aread(self) -> bytes:
        with _as_httpx():
            return await self._response.read()

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            with _as_httpx():
                data = await content.readany()
            if not data:
                return
            yield data

    async def aclose(self) -> None:
        # Cut before its end: the connection is closed (the backend sees the hang-up and stops
        # generating), not returned to the pool.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpUpstream:
    """The gateway's client of its backends. Read timeout `timeout_s` (between two reads, as
    httpx's), connect timeout `connect_timeout_s`; no proxy from the environment (backends are
    reached at the addresses registration pinned); no cookies kept between requests."""

    def __init__(self, *, timeout_s: float, connect_timeout_s: float) -> None:
        self._timeout_s, self._connect_timeout_s = timeout_s, connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the running loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=1000, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=self._connect_timeout_s,
                    sock_connect=self._connect_timeout_s,
                    sock_read=self._timeout_s,
                ),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),  # one backend's cookie is nobody's business
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def post(self, url: str, body: Any) -> UpstreamReply:
        with _as_httpx():
            async with self._client().post(url, data=dumps(body), headers=_JSON) as response:
                return UpstreamReply(response.status, await response.read())

    async def stream(self, url: str, body: Any) -> UpstreamStream:
        with _as_httpx():
            response = await self._client().post(url, data=dumps(body), headers=_JSON)
        return _AiohttpStream(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpxUpstream:
    """An httpx client as the upstream: the fault tests inject their transport this way."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def post(self, url: str, body: Any) -> UpstreamReply:
        reply = await self._http.post(url, content=dumps(body), headers=_JSON)
        return UpstreamReply(reply.status_code, reply.content)

    async def stream(self, url: str, body: Any) -> UpstreamStream:
        request = self._http.build_request("POST", url, content=dumps(body), headers=_JSON)
        return await self._http.send(request, stream=True)

    async def aclose(self) -> None:
        pass  # the client is the app's, closed with it
