"""The synchronous client: `Gateway` and the `Session`s it hands out."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import httpx

from . import _base
from ._models import Reward, SessionInfo

if TYPE_CHECKING:
    import openai

__all__ = ["Gateway", "Session"]


class Gateway:
    """A client of an RL Gateway's session and reward API.

    `base_url` is the gateway's root (`http://host:8000`), not an OpenAI base URL. `api_key` is
    sent as `Authorization: Bearer <key>` on every call and handed to `Session.openai()`.
    `transport` replaces httpx's network transport (tests inject `httpx.MockTransport`).
    `max_retries` bounds the retries of the calls that are safe to send twice (reads, close,
    rewards, create with an `id`) after a connection failure or a 429/502/503 answer.
    Use it as a context manager, or call `close()`, to release its connections.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        max_retries: int = _base.DEFAULT_MAX_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = str(base_url).rstrip("/")
        self.api_key = api_key
        self.max_retries = max_retries
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_base.headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    # -- sessions

    def create_session(
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
    ) -> Session:
        """Create a session (`POST /v1/sessions`). Raises ConflictError if `id` is taken.

        Retried on connection failures and 429/502/503 only when `id` is given. If such a retry
        finds the id taken, the session under it is read back and returned when it has the group,
        task, metadata and train flag asked for (the earlier attempt made it); otherwise the
        ConflictError stands.
        """
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
        response, retried = self._send(call)
        if retried and _base.error_code(response) == "session_exists":
            assert id is not None
            existing = _base.read(self._send(_base.get_call(id))[0])
            if _base.same_session(existing, call):
                return Session(self, existing["id"], existing["base_url"])
        data = _base.read(response)
        return Session(self, data["id"], data["base_url"])

    def session(self, id: str) -> Session:
        """Bind to an existing session by id, without a request.

        Its `base_url` is built from this client's `base_url`; a session from `create_session`
        carries the one the gateway announced (which honours RLGW_PUBLIC_URL).
        """
        return Session(self, id, _base.session_base_url(self.base_url, id))

    # -- lifecycle

    def close(self) -> None:
        """Release the connections. (To close a session, call `Session.close()`.)"""
        self._http.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Gateway({self.base_url!r})"

    # -- plumbing

    def _send(self, call: _base.Call) -> tuple[httpx.Response, bool]:
        """The answer to `call`, retried as the retry rule allows; and whether it was retried."""
        tries = _base.attempts(call, self.max_retries)
        for attempt in range(1, tries + 1):
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, headers=call.headers
                )
            except httpx.TransportError as exc:
                if attempt == tries or not _base.is_retryable_failure(exc):
                    raise _base.connection_error(call, exc) from exc
                time.sleep(_base.retry_delay(attempt))
                continue
            if attempt < tries and response.status_code in _base.RETRY_STATUSES:
                time.sleep(_base.retry_delay(attempt, response))
                continue
            return response, attempt > 1
        raise AssertionError("unreachable")

    def _call(self, call: _base.Call) -> Any:
        return _base.read(self._send(call)[0])


class Session:
    """One agent episode on the gateway. Get it from `Gateway.create_session` or `.session`.

    As a context manager it closes the session when the block ends normally, and leaves it open
    when the block raises, so the harness can decide (retry the episode, reward it, close it).
    """

    def __init__(self, gateway: Gateway, id: str, base_url: str) -> None:
        self._gateway = gateway
        self.id = id
        self.base_url = base_url

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        """An `openai.OpenAI` client bound to this session's base URL.

        Its api_key is the gateway's key (or "unused"); it shares the SDK's TLS context (its
        own connection pool); other keyword arguments are passed on.
        """
        import openai

        kwargs = _base.openai_kwargs(self._gateway.api_key, kwargs, openai.DefaultHttpxClient)
        return openai.OpenAI(base_url=self.base_url, **kwargs)

    def reward(
        self,
        value: float,
        *,
        completion_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Reward:
        """Reward a completion of this session (without `completion_id`: its final kept one).

        Every call is sent under an Idempotency-Key: `idempotency_key`, or a fresh uuid4 made for
        this call, so the SDK's own retries of it store one reward. Two separate calls without a
        key are two rewards; to make a reward safe to repeat across calls (or processes), pass
        the same `idempotency_key` each time. `Reward.replayed` says the key was already stored.
        """
        call = _base.reward_call(self.id, value, completion_id, idempotency_key)
        response, _ = self._gateway._send(call)
        data = _base.read(response)
        return Reward.model_validate({**data, "replayed": response.status_code == 200})

    def close(self) -> None:
        """Close the session: it accepts no more completions (rewards still). Idempotent."""
        self._gateway._call(_base.close_call(self.id))

    def info(self) -> SessionInfo:
        """The session with its completions and rewards."""
        return SessionInfo.model_validate(self._gateway._call(_base.get_call(self.id)))

    def trajectory(self) -> dict[str, Any]:
        """The export: steps with prompt and output token ids, log-probs and rewards."""
        return self._gateway._call(_base.get_call(self.id, "/trajectory"))

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()

    def __repr__(self) -> str:
        return f"Session({self.id!r}, base_url={self.base_url!r})"
