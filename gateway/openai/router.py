"""Routes of the OpenAI surface, on the plain base URL and on the per-session base URL."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from rlgw.settings import Settings

from ..auth import Caller
from ..deps import CallerDep, ContextDep
from ..errors import OPENAI_TAG, APIError
from ..proxy.params import HeaderSession, IdempotencyKey, bind_session, check_token_cap, raw_body
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


async def _generate(
    api: str,
    body: GenerationRequest,
    request: Request,
    ctx: ContextDep,
    caller: Caller,
    session_id: str | None,
    idempotency_key: str | None,
):
    session_id = bind_session(caller, session_id)
    check_limits(body, ctx.settings)
    return await ctx.proxy.generate(
        OpenAISurface(api, await raw_body(request)),
        session_id,
        idempotency_key,
        request.receive,
        tenant=caller.tenant,
        key_id=caller.key_id,
    )


@router.post("/v1/chat/completions", summary="Chat completion (recorded)")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    session_id: HeaderSession,
    idempotency_key: IdempotencyKey = None,
):
    return await _generate(CHAT, body, request, ctx, caller, session_id, idempotency_key)


@router.post("/sessions/{session_id}/v1/chat/completions", summary="Chat completion in a session")
async def session_chat_completions(
    session_id: str,
    body: ChatCompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
):
    return await _generate(CHAT, body, request, ctx, caller, session_id, idempotency_key)


@router.post("/v1/completions", summary="Text completion (recorded)")
async def completions(
    body: CompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    session_id: HeaderSession,
    idempotency_key: IdempotencyKey = None,
):
    return await _generate(COMPLETIONS, body, request, ctx, caller, session_id, idempotency_key)


@router.post("/sessions/{session_id}/v1/completions", summary="Text completion in a session")
async def session_completions(
    session_id: str,
    body: CompletionRequest,
    request: Request,
    ctx: ContextDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
):
    return await _generate(COMPLETIONS, body, request, ctx, caller, session_id, idempotency_key)


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
