"""The Responses API surface: served through the recorded chat path and translated back."""

from __future__ import annotations

from typing import Any

from ..errors import APIError
from ..proxy.assembly import StreamAssembly
from ..proxy.shaping import CHAT, NOTHING_EXTRA
from ..proxy.sse import sse_event
from ..proxy.surface import StreamShaper, Surface
from .translate import (
    function_call_item,
    message_item,
    new_item_id,
    output_items,
    response_object,
    to_chat,
    token_logprobs,
    wants_logprobs,
)

RESPONSES = "responses"


class ResponsesSurface(Surface):
    translated = True

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(
            api=RESPONSES,
            wire=CHAT,
            body=body,
            wire_body=to_chat(body),
            asks=NOTHING_EXTRA,
            record_prefix="resp_",
        )
        self.logprobs = wants_logprobs(body)

    def reply(self, payload: dict[str, Any], record_id: str) -> tuple[dict, list[dict]]:
        choice = (payload.get("choices") or [{}])[0]
        response = response_object(
            self.body,
            record_id,
            model=payload.get("model"),
            created=payload.get("created"),
            output=output_items(choice, self.logprobs),
            finish_reason=choice.get("finish_reason"),
            chat_usage=payload.get("usage"),
        )
        return response, [response]

    def shaper(self, assembly: StreamAssembly, record_id: str) -> StreamShaper:
        return ResponsesStream(self, assembly, record_id)


class ResponsesStream(StreamShaper):
    """Chat chunks as Responses stream events: `response.created`, output items with their
    text and argument deltas, and `response.completed` once the record is stored."""

    surface: ResponsesSurface

    def __init__(self, surface: ResponsesSurface, assembly: StreamAssembly, record_id: str):
        super().__init__(surface, assembly, record_id)
        self.sequence = 0
        # Output items in order: messages as {"id", "type": "message", "text": [...],
        # "logprobs": [...]}, function calls as their Responses item.
        self.items: list[dict[str, Any]] = []
        self.text_item: dict[str, Any] | None = None  # the open message item
        self.calls: dict[int, dict[str, Any]] = {}  # open function calls by chat tool index

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(kind, payload)

    def _response(self, in_progress: bool = False) -> dict[str, Any]:
        first = self.assembly.first or {}
        slot = self.assembly.choices.get(0)
        return response_object(
            self.surface.body,
            self.record_id,
            model=first.get("model"),
            created=first.get("created"),
            output=[] if in_progress else self._final_items(),
            finish_reason=slot.tokens.finish_reason if slot else None,
            chat_usage=self.assembly.usage,
            in_progress=in_progress,
        )

    def _final_items(self) -> list[dict[str, Any]]:
        out = []
        for item in self.items:
            if item["type"] == "message":
                out.append(self._message(item, done=True))
            else:
                out.append({**item, "status": "completed"})
        if not out:  # nothing generated at all: one empty message, as a whole reply has
            out.append(message_item(new_item_id("msg"), "", [], done=True))
        return out

    def _message(self, item: dict[str, Any], done: bool) -> dict[str, Any]:
        logprobs = item["logprobs"] if self.surface.logprobs else []
        return message_item(item["id"], "".join(item["text"]), logprobs, done)

    def start(self) -> list[bytes]:
        response = self._response(in_progress=True)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _open_text(self) -> list[bytes]:
        item_id = new_item_id("msg")
        self.text_item = {"id": item_id, "type": "message", "text": [], "logprobs": []}
        self.items.append(self.text_item)
        index = len(self.items) - 1
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=message_item(item_id, "", [], done=False),
            ),
            self._event(
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def _close_text(self) -> list[bytes]:
        item = self.text_item
        if item is None:
            return []
        final = self._message(item, done=True)
        self.text_item = None
        index = self.items.index(item)
        part = final["content"][0]
        return [
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=part["logprobs"],
            ),
            self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self._event("response.output_item.done", output_index=index, item=final),
        ]

    def _close_calls(self) -> list[bytes]:
        events = []
        for item in self.calls.values():
            index = self.items.index(item)
            final = {**item, "status": "completed"}
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            events.append(self._event("response.output_item.done", output_index=index, item=final))
        self.calls.clear()
        return events

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.text_item is None:
                    events += self._open_text()
                lps = token_logprobs(choice.get("logprobs")) if self.surface.logprobs else []
                self.text_item["text"].append(text)  # type: ignore[index]
                self.text_item["logprobs"].extend(lps)  # type: ignore[index]
                events.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.text_item["id"],  # type: ignore[index]
                        output_index=self.items.index(self.text_item),
                        content_index=0,
                        delta=text,
                        logprobs=lps,
                    )
                )
            for call in delta.get("tool_calls") or ():
                events += self._tool_delta(call)
        return events

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            events += self._close_text()
            item = function_call_item(
                new_item_id("fc"),
                {"id": call.get("id"), "function": {"name": fn.get("name") or ""}},
                done=False,
            )
            self.calls[index] = item
            self.items.append(item)
            events.append(
                self._event(
                    "response.output_item.added", output_index=len(self.items) - 1, item=item
                )
            )
        elif fn.get("name"):
            item["name"] += fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.items.index(item),
                    delta=fn["arguments"],
                )
            )
        return events

    def finish(self) -> list[bytes]:
        events = self._close_text() + self._close_calls()
        # vLLM ends every stream with response.completed, an incomplete one included (its
        # status says so); so does the gateway.
        return [*events, self._event("response.completed", response=self._response())]

    def error(self, exc: APIError) -> bytes:
        return self._event("error", code=exc.code or exc.type, message=exc.message, param=exc.param)

    def backend_error(self, chunk: dict[str, Any]) -> bytes:
        detail = chunk.get("error") if isinstance(chunk.get("error"), dict) else {}
        return self._event(
            "error",
            code=str(detail.get("code") or "backend_error"),
            message=str(detail.get("message") or "the backend failed"),
            param=None,
        )

    def record_response(self, index: int) -> dict[str, Any]:
        return self._response()
