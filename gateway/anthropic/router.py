"""Routes of the Anthropic Messages API, on the plain base URL and on the per-session base URL.

Errors here take Anthropic's envelope (`{"type": "error", "error": {"type", "message"}}`), and
the agent key may come as `x-api-key`, as Anthropic clients send it."""

from __future__ import annotations

from fastapi import APIRouter, Request

from rlgw.settings import Settings

from ..deps import AnthropicCallerDep, ContextDep
from ..errors import ANTHROPIC_TAG
from ..generation import GenerationEntry, add_generation_routes
from ..proxy.params import check_token_cap, raw_body
from .protocol import CountTokensRequest, MessagesRequest
from .surface import MessagesSurface
from .translate import to_chat

router = APIRouter(tags=[ANTHROPIC_TAG])


def check_limits(body: MessagesRequest, settings: Settings) -> None:
    check_token_cap({"max_tokens": body.max_tokens}, settings.max_tokens_cap)


add_generation_routes(
    router,
    "/v1/messages",
    GenerationEntry(MessagesRequest, check_limits, MessagesSurface, anthropic=True),
    name="create_message",
    summary="Message (Anthropic Messages API, recorded)",
    session_summary="Message in a session",
)


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
