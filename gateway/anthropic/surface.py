"""The Anthropic Messages API surface: served through the recorded chat path and translated back."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from ..errors import APIError, anthropic_type
from ..proxy.assembly import StreamAssembly
from ..proxy.shaping import CHAT, NOTHING_EXTRA
from ..proxy.sse import sse_event
from ..proxy.surface import StreamShaper, Surface, backend_error_message
from .translate import message_object, stop_reason, to_chat, tool_input, usage

MESSAGES = "messages"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class MessagesSurface(Surface):
    translated = True

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(
            api=MESSAGES,
            wire=CHAT,
            body=body,
            wire_body=to_chat(body),
            asks=NOTHING_EXTRA,
            record_prefix="msg_",
        )

    def reply(self, payload: dict[str, Any], record_id: str) -> tuple[dict, list[dict]]:
        choice = (payload.get("choices") or [{}])[0]
        message = message_object(record_id, payload.get("model"), choice, payload.get("usage"))
        return message, [message]

    def shaper(self, assembly: StreamAssembly, record_id: str) -> StreamShaper:
        return MessagesStream(self, assembly, record_id)

    def relay_error(self, status: int, content: bytes, headers: dict[str, str]) -> JSONResponse:
        message, _ = backend_error_message(status, content)
        return APIError(
            502 if status >= 500 else status, message, code="backend_error", headers=headers
        ).anthropic_response()


class MessagesStream(StreamShaper):
    """Chat chunks as Messages stream events: message_start, content blocks (text, tool_use)
    with their deltas, and message_delta + message_stop once the record is stored. Text the
    model writes while a tool_use block is open is sent as a text block after it."""

    surface: MessagesSurface

    def __init__(self, surface: MessagesSurface, assembly: StreamAssembly, record_id: str):
        super().__init__(surface, assembly, record_id)
        self.started = False
        self.blocks: list[dict[str, Any]] = []  # {"type": text|tool_use, ...} in order
        self.open: dict[str, Any] | None = None
        self.pending: list[str] = []  # text held back while a tool_use block is open
        self.tool_blocks: dict[int, dict[str, Any]] = {}  # by chat tool-call index

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse_event(kind, {"type": kind, **fields})

    def _start_block(self, block: dict[str, Any]) -> bytes:
        self.blocks.append(block)
        self.open = block
        wire = (
            {"type": "text", "text": ""}
            if block["type"] == "text"
            else {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        )
        return self._event("content_block_start", index=len(self.blocks) - 1, content_block=wire)

    def _stop_block(self) -> list[bytes]:
        events = []
        if self.open is not None:
            events.append(self._event("content_block_stop", index=self.blocks.index(self.open)))
            self.open = None
        if self.pending:
            text = "".join(self.pending)
            self.pending.clear()
            events.append(self._start_block({"type": "text", "text": [text]}))
            events.append(self._text_delta(text))
            events.append(self._event("content_block_stop", index=len(self.blocks) - 1))
            self.open = None
        return events

    def _text_delta(self, text: str) -> bytes:
        return self._event(
            "content_block_delta",
            index=len(self.blocks) - 1,
            delta={"type": "text_delta", "text": text},
        )

    def _message_start(self, chunk: dict[str, Any]) -> bytes:
        self.started = True
        start = usage(chunk.get("usage"))
        start["output_tokens"] = 0
        return self._event(
            "message_start",
            message={
                "id": self.record_id,
                "type": "message",
                "role": "assistant",
                "model": chunk.get("model"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": start,
            },
        )

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        if not self.started:
            events.append(self._message_start(chunk))
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.open is not None and self.open["type"] == "tool_use":
                    self.pending.append(text)
                else:
                    if self.open is None or self.open["type"] != "text":
                        events += self._stop_block()
                        events.append(self._start_block({"type": "text", "text": []}))
                    self.open["text"].append(text)  # type: ignore[index]
                    events.append(self._text_delta(text))
            for call in delta.get("tool_calls") or ():
                events += self._tool_delta(call)
        return events

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        fn = call.get("function") or {}
        block = self.tool_blocks.get(call.get("index", 0))
        if block is None or (call.get("id") and call["id"] != block["id"] and fn.get("name")):
            if not (call.get("id") and fn.get("name")):
                return events  # a call is announced with its id and name first
            events += self._stop_block()
            block = {"type": "tool_use", "id": call["id"], "name": fn["name"], "arguments": []}
            self.tool_blocks[call.get("index", 0)] = block
            events.append(self._start_block(block))
        if fn.get("arguments") and block is self.open:
            block["arguments"].append(fn["arguments"])
            events.append(
                self._event(
                    "content_block_delta",
                    index=self.blocks.index(block),
                    delta={"type": "input_json_delta", "partial_json": fn["arguments"]},
                )
            )
        return events

    def _stop(self) -> tuple[str | None, str | None]:
        slot = self.assembly.choices.get(0)
        tools = [b for b in self.blocks if b["type"] == "tool_use"]
        complete = bool(tools) and _is_json("".join(tools[-1]["arguments"]))
        return stop_reason(
            (slot.tokens.finish_reason if slot else None) or "stop",
            slot.stop_reason if slot else None,
            tool_used=bool(tools),
            tool_complete=complete,
        )

    def finish(self) -> list[bytes]:
        events = []
        if not self.started:
            events.append(self._message_start({"model": self.surface.model}))
        events += self._stop_block()
        reason, sequence = self._stop()
        out_usage = usage(self.assembly.usage)
        events.append(
            self._event(
                "message_delta",
                delta={"stop_reason": reason, "stop_sequence": sequence},
                usage=out_usage,
            )
        )
        events.append(self._event("message_stop"))
        return events

    def error(self, exc: APIError) -> bytes:
        return self._event(
            "error", error={"type": anthropic_type(exc.status), "message": exc.message}
        )

    def backend_error(self, chunk: dict[str, Any]) -> bytes:
        detail = chunk.get("error") if isinstance(chunk.get("error"), dict) else {}
        message = str(detail.get("message") or "the backend failed")
        return self._event("error", error={"type": "api_error", "message": message})

    def record_response(self, index: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for block in self.blocks:
            if block["type"] == "text":
                content.append({"type": "text", "text": "".join(block["text"])})
            else:
                args = "".join(block["arguments"])
                content.append(
                    {
                        "type": "tool_use",
                        "id": block["id"],
                        "name": block["name"],
                        "input": tool_input(args),
                    }
                )
        if self.pending:
            content.append({"type": "text", "text": "".join(self.pending)})
        if not content:
            content.append({"type": "text", "text": ""})
        reason, sequence = self._stop()
        first = self.assembly.first or {}
        return {
            "id": self.record_id,
            "type": "message",
            "role": "assistant",
            "model": first.get("model"),
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(self.assembly.usage),
        }
