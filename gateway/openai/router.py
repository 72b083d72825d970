"""Routes of the OpenAI surface, on the plain base URL and on the per-session base URL."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response

from rlgw.settings import Settings

from ..context import GatewayContext
from ..deps import CallerDep, ContextDep
from ..errors import OPENAI_TAG, APIError
from ..proxy.params import (
    GenerationCall,
    HeaderSession,
    IdempotencyKey,
    bind_session,
    check_token_cap,
    generation_call,
)
from ..proxy.shaping import CHAT, COMPLETIONS
from .protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest
from .surface import OpenAISurface

router = APIRouter(tags=[OPENAI_TAG])


def check_limits(body: GenerationRequest, settings: Settings) -> None:
    check_token_cap(
        {name: getattr(body, name) for name in ("max_tokens", "max_completion_tokens")},
        settings.max_tokens_cap,
    )
    if body.n is not None and body.n > settings.max_n:
        raise APIError(
            400,
            f"n {body.n} exceeds this gateway's cap of {settings.max_n} (RLGW_MAX_N)",
            code="n_too_large",
            param="n",
        )


async def generate(
    api: str, body: GenerationRequest, call: GenerationCall, ctx: GatewayContext
) -> Response:
    """A chat or text completion, whichever way its request was read (the routes below, or
    their fast lanes: gateway/fast_lane.py)."""
    session_id = bind_session(call.caller, call.session_id)
    check_limits(body, ctx.settings)
    call.note_model()
    return await ctx.proxy.generate(
        OpenAISurface(api, call.body),
        session_id,
        call.idempotency_key,
        call.receive,
        tenant=call.caller.tenant,
        key_id=call.caller.key_id,
    )


async def generate_chat(
    body: ChatCompletionRequest, call: GenerationCall, ctx: GatewayContext
) -> Response:
    return await generate(CHAT, body, call, ctx)


async def generate_text(
    body: CompletionRequest, call: GenerationCall, ctx: GatewayContext
) -> Response:
    return await generate(COMPLETIONS, body, call, ctx)


@router.post("/v1/chat/completions", summary="Chat completion (recorded)")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    session_id: HeaderSession,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await generate_chat(body, call, ctx)


@router.post("/sessions/{session_id}/v1/chat/completions", summary="Chat completion in a session")
async def session_chat_completions(
    session_id: str,
    body: ChatCompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await generate_chat(body, call, ctx)


@router.post("/v1/completions", summary="Text completion (recorded)")
async def completions(
    body: CompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    session_id: HeaderSession,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await generate_text(body, call, ctx)


@router.post("/sessions/{session_id}/v1/completions", summary="Text completion in a session")
async def session_completions(
    session_id: str,
    body: CompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
):
    call = await generation_call(request, caller, session_id, idempotency_key)
    return await generate_text(body, call, ctx)


# The routes a fast lane serves (gateway/fast_lane.py): path, body model, handler.
FAST_LANES = (
    ("/v1/chat/completions", ChatCompletionRequest, generate_chat),
    ("/sessions/{session_id}/v1/chat/completions", ChatCompletionRequest, generate_chat),
    ("/v1/completions", CompletionRequest, generate_text),
    ("/sessions/{session_id}/v1/completions", CompletionRequest, generate_text),
)


def _model_list(ctx: ContextDep) -> dict[str, Any]:
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "rlgw"}
            for name in ctx.pool.models()
        ],
    }


@router.get("/v1/models", summary="Models served through the gateway")
async def list_models(ctx: ContextDep, caller: CallerDep) -> dict[str, Any]:
    return _model_list(ctx)


@router.get("/sessions/{session_id}/v1/models", summary="Models (per-session base URL)")
async def session_list_models(
    session_id: str, ctx: ContextDep, caller: CallerDep
) -> dict[str, Any]:
    caller.require_session(session_id, "completions")
    return _model_list(ctx)
