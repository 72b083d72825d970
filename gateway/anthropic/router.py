"""Routes of the Anthropic Messages API, on the plain base URL and on the per-session base URL.

Errors here take Anthropic's envelope (`{"type": "error", "error": {"type", "message"}}`), and
the agent key may come as `x-api-key`, as Anthropic clients send it."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..context import GatewayContext
from ..deps import AnthropicCallerDep, ContextDep
from ..errors import ANTHROPIC_TAG
from ..proxy.params import (
    GenerationCall,
    HeaderSession,
    IdempotencyKey,
    bind_session,
    check_token_cap,
    generation_call,
    raw_body,
)
from .protocol import CountTokensRequest, MessagesRequest
from .surface import MessagesSurface
from .translate import to_chat

router = APIRouter(tags=[ANTHROPIC_TAG])


async def messages(body: MessagesRequest, call: GenerationCall, ctx: GatewayContext) -> Response:
    """A message, whichever way its request was read (the routes below, or their fast lanes:
    gateway/fast_lane.py)."""
    session_id = bind_session(call.caller, call.session_id)
    check_token_cap({"max_tokens": body.max_tokens}, ctx.settings.max_tokens_cap)
    call.note_model()
    return await ctx.proxy.generate(
        MessagesSurface(call.body),
        session_id,
        call.idempotency_key,
        call.receive,
        tenant=call.caller.tenant,
        key_id=call.caller.key_id,
    )


@router.post("/v1/messages", summary="Message (Anthropic Messages API, recorded)")
async def create_message(
    body: MessagesRequest,
    request: Request,
    ctx: ContextDep,
    caller: AnthropicCallerDep,
    session_id: HeaderSession,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await messages(body, call, ctx)


@router.post("/sessions/{session_id}/v1/messages", summary="Message in a session")
async def session_create_message(
    session_id: str,
    body: MessagesRequest,
    request: Request,
    ctx: ContextDep,
    caller: AnthropicCallerDep,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await messages(body, call, ctx)


async def _count(body: CountTokensRequest, request: Request, ctx: ContextDep) -> dict:
    count = await ctx.proxy.count_tokens(to_chat(await raw_body(request), count_only=True))
    return {"input_tokens": count}


@router.post("/v1/messages/count_tokens", summary="Count a message's input tokens")
async def count_tokens(
    body: CountTokensRequest, request: Request, ctx: ContextDep, caller: AnthropicCallerDep
) -> dict:
    return await _count(body, request, ctx)


@router.post(
    "/sessions/{session_id}/v1/messages/count_tokens",
    summary="Count a message's input tokens (per-session base URL)",
)
async def session_count_tokens(
    session_id: str,
    body: CountTokensRequest,
    request: Request,
    ctx: ContextDep,
    caller: AnthropicCallerDep,
) -> dict:
    caller.require_session(session_id, "completions")
    return await _count(body, request, ctx)


# The routes a fast lane serves (gateway/fast_lane.py): path, body model, handler. Their callers
# may present the key as `x-api-key`, as Anthropic clients do.
FAST_LANES = (
    ("/v1/messages", MessagesRequest, messages),
    ("/sessions/{session_id}/v1/messages", MessagesRequest, messages),
)
