"""What the generation routes of every API surface take from a request besides its typed body:
the session header, the idempotency key, the raw body, and the checks they share."""

from __future__ import annotations

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


async def raw_body(request: Request) -> dict[str, Any]:
    # The typed model validated the body; the backend gets the client's own fields, unchanged.
    body = await request.json()
    model = body.get("model")  # for the request metrics (gateway/metrics/middleware.py)
    setattr(request.state, MODEL_STATE_KEY, model if isinstance(model, str) else None)
    return body


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
