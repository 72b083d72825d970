"""Routes of the Anthropic Messages API, on the plain base URL and on the per-session base URL.

Errors here take Anthropic's envelope (`{"type": "error", "error": {"type", "message"}}`), and
the agent key may come as `x-api-key`, as Anthropic clients send it."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..auth import Caller
from ..deps import AnthropicCallerDep, ContextDep
from ..errors import ANTHROPIC_TAG
from ..proxy.params import HeaderSession, IdempotencyKey, bind_session, check_token_cap, raw_body
from .protocol import CountTokensRequest, MessagesRequest
from .surface import MessagesSurface
from .translate import to_chat

router = APIRouter(tags=[ANTHROPIC_TAG])


async def _messages(
    body: MessagesRequest,
    request: Request,
    ctx: ContextDep,
    caller: Caller,
    session_id: str | None,
    idempotency_key: str | None,
):
    session_id = bind_session(caller, session_id)
    check_token_cap({"max_tokens": body.max_tokens}, ctx.settings.max_tokens_cap)
    surface = MessagesSurface(await raw_body(request))
    return await ctx.proxy.generate(
        surface,
        session_id,
        idempotency_key,
        request.receive,
        tenant=caller.tenant,
        key_id=caller.key_id,
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
    return await _messages(body, request, ctx, caller, session_id, idempotency_key)


@router.post("/sessions/{session_id}/v1/messages", summary="Message in a session")
async def session_create_message(
    session_id: str,
    body: MessagesRequest,
    request: Request,
    ctx: ContextDep,
    caller: AnthropicCallerDep,
    idempotency_key: IdempotencyKey = None,
):
    return await _messages(body, request, ctx, caller, session_id, idempotency_key)


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
