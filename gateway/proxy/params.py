"""What the generation routes of every API surface take from a request besides its typed body:
the session header, the idempotency key, the raw body, and the checks they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request

from ..auth import Caller
from ..errors import APIError

# Where a request's model name is left for the metrics middleware to read (request.state).
MODEL_STATE_KEY = "rlgw_model"


async def header_session_id(
    x_session_id: Annotated[
        str | None, Header(description="Bind the call to this session.")
    ] = None,
) -> str | None:
    return x_session_id


HeaderSession = Annotated[str | None, Depends(header_session_id)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=256,
        description="Requests of a session with the same key form one retry group.",
    ),
]


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """What a generation handler takes from its request, however the request was read (by a
    FastAPI route, or by its fast lane: gateway/fast_lane.py)."""

    body: dict[str, Any]  # the client's own JSON: what the backend gets, fields unchanged
    scope: Any  # the ASGI scope
    receive: Any  # the ASGI receive channel, watched for the client hanging up
    caller: Caller
    session_id: str | None  # the session it is made in (`bind_session`); None: an implicit one
    idempotency_key: str | None

    @classmethod
    def bound(
        cls,
        body: dict[str, Any],
        scope: Any,
        receive: Any,
        caller: Caller,
        session_id: str | None,
        idempotency_key: str | None,
    ) -> GenerationCall:
        """The call made with `session_id` (the path's, else the X-Session-Id header's), bound
        to the session it is made in (403/404 when the caller may not use that session)."""
        return cls(body, scope, receive, caller, bind_session(caller, session_id), idempotency_key)

    def note_model(self) -> None:
        note_model(self.scope, self.body)


def note_model(scope: Any, body: dict[str, Any]) -> None:
    """Leave the model a request names for the request metrics (gateway/metrics/middleware.py),
    in the request's state (where Starlette's `request.state` keeps it)."""
    model = body.get("model")
    scope.setdefault("state", {})[MODEL_STATE_KEY] = model if isinstance(model, str) else None


async def raw_body(request: Request) -> dict[str, Any]:
    # The typed model validated the body; the backend gets the client's own fields, unchanged.
    body = await request.json()
    note_model(request.scope, body)
    return body


async def generation_call(
    request: Request, caller: Caller, session_id: str | None, idempotency_key: str | None
) -> GenerationCall:
    """The call a FastAPI generation route was made with."""
    return GenerationCall.bound(
        await request.json(), request.scope, request.receive, caller, session_id, idempotency_key
    )


def check_token_cap(values: dict[str, int | None], cap: int) -> None:
    for name, value in values.items():
        if value is not None and value > cap:
            raise APIError(
                400,
                f"{name} {value} exceeds this gateway's cap of {cap} (RLGW_MAX_TOKENS_CAP)",
                code="max_tokens_too_large",
                param=name,
            )


def bind_session(caller: Caller, session_id: str | None) -> str | None:
    """The session a generation call is made in (None: an implicit one of its own)."""
    if caller.session_id is not None and session_id is None:
        session_id = caller.session_id  # a session token always works in its own session
    if session_id is not None:
        caller.require_session(session_id, "completions")
    return session_id
