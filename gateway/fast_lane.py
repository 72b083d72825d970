"""The generation routes' fast lane: a request that passes every check of its route is served
without Starlette's walk of the route table, FastAPI's dependency solving and its Request object;
any other request goes to the route itself, unchanged, so every refusal is the route's own.

A lane is a route placed ahead of the table. It reads the body, then hands the request on (with
the messages it read replayed) unless the body is a JSON object that its route's body model
accepts, read by orjson exactly as the route would read it with the stdlib, sent as
`application/json`, with headers the route accepts. A lane serves as its route would: the same
caller admission, the same handler, the route's own scope entries (metrics, error envelopes),
exceptions left to the app's handlers. The routes stay the definition: the OpenAPI schema and
every error answer. The routes a lane serves are the generation entries' (gateway/generation.py).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.routing import BaseRoute, Match

from .context import GatewayContext
from .deps import ANTHROPIC_SENT_AS, BEARER_SENT_AS, admit, bearer_credential
from .generation import ENTRY_ATTRIBUTE, GenerationEntry
from .proxy.params import GenerationCall

# orjson reads an integer beyond 64 bits as a float, the stdlib as an int: such a body (or one
# with any run of 19 digits, in a string too) goes to the route.
_LONG_DIGITS = re.compile(rb"\d{19}")
_IDEMPOTENCY_KEY_MAX = 256  # the route's Header(max_length=...) (gateway/proxy/params.py)
_HEADERS = (b"authorization", b"x-api-key", b"x-session-id", b"idempotency-key", b"content-type")


class LaneCounts:
    """How many requests the lanes served themselves and handed to their routes."""

    def __init__(self) -> None:
        self.served = 0
        self.handed_on = 0


class FastLane(BaseRoute):
    """Serves the requests its `route` would accept, with its generation `entry`; hands it every
    other."""

    def __init__(self, route: APIRoute, entry: GenerationEntry, counts: LaneCounts) -> None:
        self.route, self.entry, self.counts = route, entry, counts
        self.model = entry.model
        self.path, self.name = route.path, route.name
        self.anthropic = entry.anthropic  # its callers may send `x-api-key`
        self.session_in_path = "session_id" in route.param_convertors

    def matches(self, scope: Any) -> tuple[Match, dict[str, Any]]:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return Match.NONE, {}
        match, child_scope = self.route.matches(scope)  # its "route" entry is the route's
        return (match, child_scope) if match is Match.FULL else (Match.NONE, {})

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        return self.route.url_path_for(name, **path_params)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        messages, body = await _read_body(receive)
        headers = _headers(scope)
        typed = self._accepted(body, headers) if messages[-1]["type"] == "http.request" else None
        if typed is None:
            self.counts.handed_on += 1
            await self.route.handle(scope, _replay(messages, receive), send)
            return
        self.counts.served += 1
        model, raw = typed
        ctx: GatewayContext = scope["app"].state.context
        credential = bearer_credential(headers.get(b"authorization"))
        if self.anthropic and credential is None:
            credential = headers.get(b"x-api-key") or None
        caller = await admit(
            ctx, scope, credential, ANTHROPIC_SENT_AS if self.anthropic else BEARER_SENT_AS
        )
        session_id = (
            scope["path_params"]["session_id"]
            if self.session_in_path
            else headers.get(b"x-session-id")
        )
        call = GenerationCall.bound(
            raw, scope, receive, caller, session_id, headers.get(b"idempotency-key")
        )
        response = await self.entry.serve(model, call, ctx)
        await response(scope, receive, send)

    def _accepted(self, body: bytes, headers: dict[bytes, str]) -> tuple[Any, dict] | None:
        """The typed body and the raw one, when the route would accept both body and headers."""
        content_type = headers.get(b"content-type")  # FastAPI reads a body without it as no JSON
        if content_type is None or content_type.split(";")[0].strip().lower() != "application/json":
            return None
        key = headers.get(b"idempotency-key")
        if key is not None and len(key) > _IDEMPOTENCY_KEY_MAX:
            return None
        if _LONG_DIGITS.search(body):
            return None
        try:
            raw = orjson.loads(body)  # NaN, Infinity, lone surrogates, not UTF-8: the route's
        except orjson.JSONDecodeError:
            return None
        if not isinstance(raw, dict):
            return None
        try:
            return self.model.model_validate(raw), raw
        except ValidationError:
            return None


async def _read_body(receive: Any) -> tuple[list[Any], bytes]:
    """The messages of the request's body (to replay) and the body; the last message is the
    body's end or the client's leaving."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    if len(messages) == 1:
        return messages, messages[0].get("body", b"")
    return messages, b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")


def _headers(scope: Any) -> dict[bytes, str]:
    """The first value of each header a lane reads, decoded as Starlette decodes it."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _HEADERS and name not in found:
            found[name] = value.decode("latin-1")
    return found


def _replay(messages: list[Any], receive: Any) -> Callable[[], Awaitable[Any]]:
    pending = list(messages)

    async def replayed() -> Any:
        return pending.pop(0) if pending else await receive()

    return replayed


def install_fast_lanes(app: FastAPI) -> LaneCounts:
    """Put a lane ahead of the route table for each route of a generation entry."""
    counts = LaneCounts()
    lanes = [
        FastLane(route, getattr(route.endpoint, ENTRY_ATTRIBUTE), counts)
        for route in app.router.routes
        if isinstance(route, APIRoute) and hasattr(route.endpoint, ENTRY_ATTRIBUTE)
    ]
    app.router.routes[:0] = lanes
    return counts
