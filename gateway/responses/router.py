"""Routes of the Responses API, on the plain base URL and on the per-session base URL."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..context import GatewayContext
from ..deps import CallerDep, ContextDep
from ..errors import OPENAI_TAG
from ..proxy.params import (
    GenerationCall,
    HeaderSession,
    IdempotencyKey,
    bind_session,
    check_token_cap,
    generation_call,
)
from .protocol import ResponsesRequest
from .surface import ResponsesSurface

router = APIRouter(tags=[OPENAI_TAG])


async def respond(body: ResponsesRequest, call: GenerationCall, ctx: GatewayContext) -> Response:
    """A response, whichever way its request was read (the routes below, or their fast lanes:
    gateway/fast_lane.py)."""
    session_id = bind_session(call.caller, call.session_id)
    check_token_cap({"max_output_tokens": body.max_output_tokens}, ctx.settings.max_tokens_cap)
    call.note_model()
    return await ctx.proxy.generate(
        ResponsesSurface(call.body),
        session_id,
        call.idempotency_key,
        call.receive,
        tenant=call.caller.tenant,
        key_id=call.caller.key_id,
    )


@router.post("/v1/responses", summary="Response (Responses API, recorded)")
async def create_response(
    body: ResponsesRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    session_id: HeaderSession,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await respond(body, call, ctx)


@router.post("/sessions/{session_id}/v1/responses", summary="Response in a session")
async def session_create_response(
    session_id: str,
    body: ResponsesRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await respond(body, call, ctx)


# The routes a fast lane serves (gateway/fast_lane.py): path, body model, handler.
FAST_LANES = (
    ("/v1/responses", ResponsesRequest, respond),
    ("/sessions/{session_id}/v1/responses", ResponsesRequest, respond),
)
