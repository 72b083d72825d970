"""The one generation entry of every API surface: `add_generation_routes` registers a surface's
route on the plain base URL, its twin on the per-session base URL and (by marking both) their
fast lanes (gateway/fast_lane.py). However a request was read, one `GenerationEntry.serve`
answers it: the surface's caps, then `ProxyService.generate`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from rlgw.settings import Settings

from .context import GatewayContext
from .deps import AnthropicCallerDep, CallerDep, ContextDep
from .proxy.params import GenerationCall, HeaderSession, IdempotencyKey, generation_call
from .proxy.surface import Surface

SESSION_PREFIX = "/sessions/{session_id}"  # the per-session base URL, before the surface's path
# The attribute that marks an endpoint as a generation entry's, for the fast lanes.
ENTRY_ATTRIBUTE = "generation_entry"


@dataclass(frozen=True, slots=True)
class GenerationEntry:
    """What a surface makes of a generation request its body model accepted."""

    model: type[BaseModel]  # the body model (the request body of the OpenAPI schema)
    check: Callable[[Any, Settings], None]  # the surface's caps on the typed body (400)
    surface: Callable[[dict[str, Any]], Surface]  # the surface of the client's own JSON
    anthropic: bool = False  # its callers may present the key as `x-api-key`

    async def serve(self, body: Any, call: GenerationCall, ctx: GatewayContext) -> Response:
        """The answer to one call, whichever way its request was read (a route or its lane)."""
        self.check(body, ctx.settings)
        call.note_model()
        return await ctx.proxy.generate(self.surface(call.body), call)


def add_generation_routes(
    router: APIRouter,
    path: str,
    entry: GenerationEntry,
    *,
    name: str,
    summary: str,
    session_summary: str,
) -> None:
    """Register POST `path` (the session from `X-Session-Id` or the caller's session token) and
    POST `/sessions/{session_id}` + `path`, both answered by `entry`. The endpoints are named
    `name` and `session_` + `name` (their OpenAPI operation ids)."""
    caller = AnthropicCallerDep if entry.anthropic else CallerDep
    router.add_api_route(
        path,
        _endpoint(entry, _signature(entry.model, caller, session_in_path=False)),
        methods=["POST"],
        name=name,
        summary=summary,
    )
    router.add_api_route(
        SESSION_PREFIX + path,
        _endpoint(entry, _signature(entry.model, caller, session_in_path=True)),
        methods=["POST"],
        name="session_" + name,
        summary=session_summary,
    )


def _endpoint(entry: GenerationEntry, signature: inspect.Signature) -> Callable[..., Any]:
    async def endpoint(
        *,
        body: Any,
        request: Request,
        ctx: GatewayContext,
        caller: Any,
        session_id: str | None,
        idempotency_key: str | None = None,
    ) -> Response:
        call = await generation_call(request, caller, session_id, idempotency_key)
        return await entry.serve(body, call, ctx)

    # FastAPI reads the parameters (and so the OpenAPI schema) from this signature.
    endpoint.__signature__ = signature  # type: ignore[attr-defined]
    setattr(endpoint, ENTRY_ATTRIBUTE, entry)
    return endpoint


def _signature(model: type[BaseModel], caller: Any, *, session_in_path: bool) -> inspect.Signature:
    """The parameters of a generation route, in the order they take in the OpenAPI schema: the
    session id from the path, or else from the `X-Session-Id` header after the caller."""

    def param(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> Any:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Parameter(name, kind, default=default, annotation=annotation)

    params = [param("session_id", str)] if session_in_path else []
    params += [
        param("body", model),
        param("request", Request),
        param("ctx", ContextDep),
        param("caller", caller),
    ]
    if not session_in_path:
        params.append(param("session_id", HeaderSession))
    params.append(param("idempotency_key", IdempotencyKey, None))
    return inspect.Signature(params)
