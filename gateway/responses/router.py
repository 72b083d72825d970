"""Routes of the Responses API, on the plain base URL and on the per-session base URL."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..auth import Caller
from ..deps import CallerDep, ContextDep
from ..errors import OPENAI_TAG
from ..proxy.params import HeaderSession, IdempotencyKey, bind_session, check_token_cap, raw_body
from .protocol import ResponsesRequest
from .surface import ResponsesSurface

router = APIRouter(tags=[OPENAI_TAG])


async def _respond(
    body: ResponsesRequest,
    request: Request,
    ctx: ContextDep,
    caller: Caller,
    session_id: str | None,
    idempotency_key: str | None,
):
    session_id = bind_session(caller, session_id)
    check_token_cap({"max_output_tokens": body.max_output_tokens}, ctx.settings.max_tokens_cap)
    surface = ResponsesSurface(await raw_body(request))
    return await ctx.proxy.generate(
        surface,
        session_id,
        idempotency_key,
        request.receive,
        tenant=caller.tenant,
        key_id=caller.key_id,
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
    return await _respond(body, request, ctx, caller, session_id, idempotency_key)


@router.post("/sessions/{session_id}/v1/responses", summary="Response in a session")
async def session_create_response(
    session_id: str,
    body: ResponsesRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
):
    return await _respond(body, request, ctx, caller, session_id, idempotency_key)
