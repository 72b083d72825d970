"""What one API surface makes of a recorded exchange with the backend.

The backend is always spoken to in one of its two token-returning APIs (the *wire* API: chat
completions or text completions). A surface says what the client sent, which wire body stands for
it, what the client sees of the backend's reply (whole or streamed) and how errors look to it.
The defaults here pass the wire API through, as the OpenAI surfaces do (gateway/openai/); the
Responses and Messages surfaces translate (gateway/responses/, gateway/anthropic/).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from ..errors import APIError
from .assembly import StreamAssembly
from .shaping import ClientAsks, make_visible, only_choice, upstream_body
from .sse import sse


def backend_error_message(status: int, content: bytes) -> tuple[str, dict[str, Any] | None]:
    """The message of a backend's error reply (a generic one for a 5xx), and its payload."""
    try:
        payload = json.loads(content)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        payload = None
    if status >= 500:
        return "the backend failed to answer", payload
    detail = (payload or {}).get("error")
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        return detail["message"], payload
    if isinstance(detail, str):
        return detail, payload
    return "the backend refused the request", payload


class StreamShaper:
    """Turns the backend's chunks into the client's stream. The pass-through: each chunk as it
    came (ids and unrequested extras rewritten), `[DONE]` once the records are stored."""

    def __init__(self, surface: Surface, assembly: StreamAssembly, record_id: str) -> None:
        self.surface = surface
        self.assembly = assembly
        self.record_id = record_id

    def start(self) -> list[bytes]:
        """Sent before the backend's first chunk."""
        return []

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        """A chunk of the backend's stream, already added to the assembly."""
        make_visible(self.surface.wire, chunk, self.surface.asks, self.record_id)
        return [sse(chunk)]

    def finish(self) -> list[bytes]:
        """Sent once every choice is stored: the end of a successful stream."""
        return [b"data: [DONE]\n\n"]

    def error(self, exc: APIError) -> bytes:
        """The stream ends in an error of the gateway's."""
        return sse(exc.envelope())

    def backend_error(self, chunk: dict[str, Any]) -> bytes:
        """The backend sent an error object in its stream."""
        return sse(chunk)

    def record_response(self, index: int) -> dict[str, Any]:
        """What the record of choice `index` keeps as the response the client received."""
        return self.assembly.response(self.record_id, only=index)


class Surface:
    """One API surface of a generation request. Unless a surface overrides them, the backend's
    reply and errors reach the client as the wire API gave them."""

    translated = False  # the wire body is a translation of the client's (stored beside it)

    def __init__(
        self,
        *,
        api: str,
        wire: str,
        body: dict[str, Any],
        wire_body: dict[str, Any],
        asks: ClientAsks,
        record_prefix: str,
    ) -> None:
        self.api = api  # recorded as the completion's api
        self.wire = wire  # the backend API spoken
        self.body = body  # the client's body, stored verbatim
        self.wire_body = wire_body  # the same request in the wire API's terms
        self.asks = asks  # which recorded extras the client itself asked for
        self.record_prefix = record_prefix  # of the record ids (the reply's id)

    @property
    def choices(self) -> int:
        n = self.wire_body.get("n")
        return n if isinstance(n, int) and n > 1 else 1

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def model(self) -> str:
        return self.wire_body["model"]

    def upstream(
        self, served_name: str | None = None, record_id: str | None = None
    ) -> dict[str, Any]:
        """The body sent to the backend: under `served_name` when the backend serves the model's
        version under another name (a LoRA adapter, `model@vN`); with `record_id` as vLLM's
        request id, so that a swap pausing the backend names the request in its boundary
        (rlgw/swap_boundaries.py)."""
        body = upstream_body(self.wire, self.wire_body)
        if served_name is not None:
            body["model"] = served_name
        if record_id is not None:
            body["request_id"] = record_id
        return body

    def reply(self, payload: dict[str, Any], record_id: str) -> tuple[dict, list[dict]]:
        """The client's reply to a whole backend reply, and each choice's stored response."""
        make_visible(self.wire, payload, self.asks, record_id)
        if self.choices == 1:
            return payload, [payload]
        return payload, [only_choice(payload, i) for i in range(self.choices)]

    def shaper(self, assembly: StreamAssembly, record_id: str) -> StreamShaper:
        return StreamShaper(self, assembly, record_id)

    def relay_error(self, status: int, content: bytes, headers: dict[str, str]) -> JSONResponse:
        """Pass a backend's 4xx through in the OpenAI envelope; a backend 5xx becomes a 502."""
        message, payload = backend_error_message(status, content)
        if status < 500 and payload is not None and isinstance(payload.get("error"), dict):
            return JSONResponse(payload, status_code=status, headers=headers)
        return APIError(
            502 if status >= 500 else status, message, code="backend_error", headers=headers
        ).response()
