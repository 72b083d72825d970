"""Routes of the Responses API, on the plain base URL and on the per-session base URL."""

from __future__ import annotations

from fastapi import APIRouter

from rlgw.settings import Settings

from ..errors import OPENAI_TAG
from ..generation import GenerationEntry, add_generation_routes
from ..proxy.params import check_token_cap
from .protocol import ResponsesRequest
from .surface import ResponsesSurface

router = APIRouter(tags=[OPENAI_TAG])


def check_limits(body: ResponsesRequest, settings: Settings) -> None:
    check_token_cap({"max_output_tokens": body.max_output_tokens}, settings.max_tokens_cap)


add_generation_routes(
    router,
    "/v1/responses",
    GenerationEntry(ResponsesRequest, check_limits, ResponsesSurface),
    name="create_response",
    summary="Response (Responses API, recorded)",
    session_summary="Response in a session",
)
