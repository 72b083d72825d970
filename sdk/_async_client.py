"""The asynchronous client: `AsyncGateway` and the `AsyncSession`s it hands out.

The twin of `_client`: every method that talks to the gateway is a coroutine. `session()` and
`AsyncSession.openai()` send nothing, so they are plain methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import httpx

from . import _base
from ._models import Reward, SessionInfo

if TYPE_CHECKING:
    import openai

__all__ = ["AsyncGateway", "AsyncSession"]


class AsyncGateway:
    """The async client of an RL Gateway's session and reward API; see `Gateway`.

    `transport` is an `httpx.AsyncBaseTransport` (`httpx.MockTransport` works). Use it as an
    async context manager, or `await close()`, to release its connections.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        max_retries: int = _base.DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = str(base_url).rstrip("/")
        self.api_key = api_key
        self.max_retries = max_retries
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_base.headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    # -- sessions

    async def create_session(
        self,
        *,
        id: str | None = None,
        group_id: str | None = None,
        group_size: int | None = None,
        normalization: Literal["none", "mean", "mean_std"] | None = None,
        sibling_normalization: Literal["none", "mean", "mean_std"] | None = None,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        train: bool = True,
    ) -> AsyncSession:
        """Create a session (`POST /v1/sessions`); see `Gateway.create_session`."""
        call = _base.create_call(
            id=id,
            group_id=group_id,
            group_size=group_size,
            normalization=normalization,
            sibling_normalization=sibling_normalization,
            task_id=task_id,
            metadata=metadata,
            train=train,
        )
        response, retried = await self._send(call)
        if retried and _base.error_code(response) == "session_exists":
            assert id is not None
            existing = _base.read((await self._send(_base.get_call(id)))[0])
            if _base.same_session(existing, call):
                return AsyncSession(self, existing["id"], existing["base_url"])
        data = _base.read(response)
        return AsyncSession(self, data["id"], data["base_url"])

    def session(self, id: str) -> AsyncSession:
        """Bind to an existing session by id, without a request; see `Gateway.session`."""
        return AsyncSession(self, id, _base.session_base_url(self.base_url, id))

    # -- lifecycle

    async def close(self) -> None:
        """Release the connections. (To close a session, await `AsyncSession.close()`.)"""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGateway:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncGateway({self.base_url!r})"

    # -- plumbing

    async def _send(self, call: _base.Call) -> tuple[httpx.Response, bool]:
        tries = _base.attempts(call, self.max_retries)
        for attempt in range(1, tries + 1):
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, headers=call.headers
                )
            except httpx.TransportError as exc:
                if attempt == tries or not _base.is_retryable_failure(exc):
                    raise _base.connection_error(call, exc) from exc
                await asyncio.sleep(_base.retry_delay(attempt))
                continue
            if attempt < tries and response.status_code in _base.RETRY_STATUSES:
                await asyncio.sleep(_base.retry_delay(attempt, response))
                continue
            return response, attempt > 1
        raise AssertionError("unreachable")

    async def _call(self, call: _base.Call) -> Any:
        return _base.read((await self._send(call))[0])


class AsyncSession:
    """One agent episode; the async twin of `Session`.

    `async with session:` closes it when the block ends normally and leaves it open when the
    block raises.
    """

    def __init__(self, gateway: AsyncGateway, id: str, base_url: str) -> None:
        self._gateway = gateway
        self.id = id
        self.base_url = base_url

    def openai(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` client bound to this session's base URL (no request), on the
        SDK's shared TLS context (its own connection pool)."""
        import openai

        kwargs = _base.openai_kwargs(self._gateway.api_key, kwargs, openai.DefaultAsyncHttpxClient)
        return openai.AsyncOpenAI(base_url=self.base_url, **kwargs)

    async def reward(
        self,
        value: float,
        *,
        completion_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Reward:
        """Reward a completion of this session; see `Session.reward` for the idempotency rule."""
        call = _base.reward_call(self.id, value, completion_id, idempotency_key)
        response, _ = await self._gateway._send(call)
        data = _base.read(response)
        return Reward.model_validate({**data, "replayed": response.status_code == 200})

    async def close(self) -> None:
        """Close the session: it accepts no more completions (rewards still). Idempotent."""
        await self._gateway._call(_base.close_call(self.id))

    async def info(self) -> SessionInfo:
        """The session with its completions and rewards."""
        return SessionInfo.model_validate(await self._gateway._call(_base.get_call(self.id)))

    async def trajectory(self) -> dict[str, Any]:
        """The export: steps with prompt and output token ids, log-probs and rewards."""
        return await self._gateway._call(_base.get_call(self.id, "/trajectory"))

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r}, base_url={self.base_url!r})"
