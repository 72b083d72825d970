"""What the sync and async clients share: the requests, the retry rule, reading answers.

The retry rule: a call is sent again, at most `max_retries` times with a short growing pause,
after a connection failure or a 429, 502 or 503 answer, and only when sending it twice cannot
do anything twice: reads (GET), closing a session, posting a reward (always under an
Idempotency-Key), and creating a session under an id the caller chose. Creating a session without
an id is never retried: a lost answer would leave a second, unseen session behind.
"""

from __future__ import annotations

import email.utils
import functools
import math
import random
import ssl
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ._exceptions import APIStatusError, GatewayConnectionError, GatewayError, error_class

VERSION = "0.1.0"

RETRY_STATUSES = frozenset({429, 502, 503})
DEFAULT_MAX_RETRIES = 2
RETRY_BASE_DELAY = 0.25  # seconds before the first retry; doubled for each later one
MAX_RETRY_DELAY = 5.0  # cap, also on a server's Retry-After

SESSIONS = "/v1/sessions"


@dataclass(frozen=True)
class Call:
    """One API call. `idempotent`: sending it again cannot act twice, so it may be retried."""

    method: str
    path: str
    json: Any = None
    headers: Mapping[str, str] | None = None
    idempotent: bool = False


def headers(api_key: str | None) -> dict[str, str]:
    out = {"User-Agent": f"rlgw-sdk/{VERSION}", "Accept": "application/json"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def session_path(session_id: str, suffix: str = "") -> str:
    return f"{SESSIONS}/{quote(session_id, safe=':')}{suffix}"


def session_base_url(gateway_url: str, session_id: str) -> str:
    """The OpenAI base URL of a session, as the gateway builds it."""
    return f"{gateway_url}/sessions/{quote(session_id, safe=':')}/v1"


def openai_api_key(api_key: str | None) -> str:
    return api_key or "unused"  # the openai client refuses to start without one


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context (the CA bundle httpx trusts) for every session's openai client: a new
    client builds its own otherwise, 20-150 ms of CPU holding the event loop, once per session."""
    try:
        import certifi
    except ImportError:  # pragma: no cover - certifi comes with httpx
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


def openai_kwargs(api_key: str | None, kwargs: dict[str, Any], http_client: type) -> dict:
    """The keyword arguments of a session's openai client: the gateway's key, a connection pool
    of its own on the shared TLS context (`http_client`: openai's default client class), and
    whatever the caller passed (which wins)."""
    kwargs.setdefault("api_key", openai_api_key(api_key))
    if "http_client" not in kwargs:
        kwargs["http_client"] = http_client(verify=tls_context())
    return kwargs


# ----------------------------------------------------------------------------- calls


def create_call(
    *,
    id: str | None,
    group_id: str | None,
    group_size: int | None,
    normalization: str | None,
    task_id: str | None,
    metadata: Mapping[str, Any] | None,
    train: bool,
    sibling_normalization: str | None = None,
) -> Call:
    fields = {
        "id": id,
        "group_id": group_id,
        "group_size": group_size,
        "normalization": normalization,
        "sibling_normalization": sibling_normalization,
        "task_id": task_id,
        "metadata": dict(metadata) if metadata is not None else None,
    }
    body = {k: v for k, v in fields.items() if v is not None}
    body["train"] = train
    return Call("POST", SESSIONS, json=body, idempotent=id is not None)


def get_call(session_id: str, suffix: str = "") -> Call:
    return Call("GET", session_path(session_id, suffix), idempotent=True)


def close_call(session_id: str) -> Call:
    return Call("POST", session_path(session_id, "/close"), idempotent=True)


def reward_call(
    session_id: str, value: float, completion_id: str | None, idempotency_key: str | None
) -> Call:
    if isinstance(value, bool):
        raise TypeError("a reward value is a number, not a bool")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"a reward value must be finite, not {value}")
    body: dict[str, Any] = {"value": value}
    if completion_id is not None:
        body["completion_id"] = completion_id
    key = idempotency_key if idempotency_key is not None else f"rlgw-sdk-{uuid.uuid4().hex}"
    return Call(
        "POST",
        session_path(session_id, "/rewards"),
        json=body,
        headers={"Idempotency-Key": key},
        idempotent=True,
    )


# ----------------------------------------------------------------------------- retries


def attempts(call: Call, max_retries: int) -> int:
    return 1 + (max(0, max_retries) if call.idempotent else 0)


def is_retryable_failure(exc: httpx.TransportError) -> bool:
    return not isinstance(exc, httpx.UnsupportedProtocol)  # a bad URL stays bad


def retry_delay(retry: int, response: httpx.Response | None = None) -> float:
    """Seconds to wait before retry number `retry` (1, 2, ...)."""
    if response is not None:
        after = _retry_after(response)
        if after is not None:
            return min(after, MAX_RETRY_DELAY)
    base = RETRY_BASE_DELAY * 2 ** (retry - 1)
    return min(base + random.uniform(0, RETRY_BASE_DELAY), MAX_RETRY_DELAY)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def connection_error(call: Call, exc: httpx.TransportError) -> GatewayConnectionError:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    return GatewayConnectionError(f"{call.method} {call.path} {kind}: {exc!r}")


# ----------------------------------------------------------------------------- answers


def status_error(response: httpx.Response) -> APIStatusError:
    message, code, type_, param = None, None, None, None
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        message, code = error.get("message"), error.get("code")
        type_, param = error.get("type"), error.get("param")
    if not message:
        message = response.text.strip()[:500] or response.reason_phrase or "error"
    cls = error_class(response.status_code)
    return cls(response.status_code, code, str(message), type=type_, param=param, response=response)


def error_code(response: httpx.Response) -> str | None:
    return status_error(response).code if response.is_error else None


def read(response: httpx.Response) -> Any:
    """The JSON of a successful answer; raises the matching error for any other."""
    if response.is_error:
        raise status_error(response)
    try:
        return response.json()
    except ValueError as exc:
        raise GatewayError(
            f"{response.request.method} {response.request.url.path}: the gateway answered "
            f"{response.status_code} with a body that is not JSON"
        ) from exc


def same_session(existing: Mapping[str, Any], call: Call) -> bool:
    """Whether a session found under the id a retried create asked for is the one it asked for."""
    body = call.json
    return (
        existing.get("group_id") == body.get("group_id")
        and existing.get("task_id") == body.get("task_id")
        and existing.get("metadata", {}) == body.get("metadata", {})
        and existing.get("train") == body.get("train")
    )
