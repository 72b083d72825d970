"""Routes of the OpenAI surface, on the plain base URL and on the per-session base URL."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from fastapi import APIRouter

from rlgw.settings import Settings

from ..deps import CallerDep, ContextDep
from ..errors import OPENAI_TAG, APIError
from ..generation import GenerationEntry, add_generation_routes
from ..proxy.params import check_token_cap
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


add_generation_routes(
    router,
    "/v1/chat/completions",
    GenerationEntry(ChatCompletionRequest, check_limits, partial(OpenAISurface, CHAT)),
    name="chat_completions",
    summary="Chat completion (recorded)",
    session_summary="Chat completion in a session",
)
add_generation_routes(
    router,
    "/v1/completions",
    GenerationEntry(CompletionRequest, check_limits, partial(OpenAISurface, COMPLETIONS)),
    name="completions",
    summary="Text completion (recorded)",
    session_summary="Text completion in a session",
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
