"""Pure functions that shape bodies between client and backend, and read tokens out of replies.

The gateway always asks the backend for token ids and per-token log-probs (they are the learning
record) and hands them to the client only when the client asked for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT = "chat.completions"
COMPLETIONS = "completions"


@dataclass(frozen=True)
class ClientAsks:
    """Which of the recorded extras the client itself requested."""

    logprobs: bool
    token_ids: bool


def client_asks(api: str, body: dict[str, Any]) -> ClientAsks:
    if api == CHAT:
        wants_logprobs = bool(body.get("logprobs"))
    else:  # completions: logprobs is an int (top-k); 0 still asks for the sampled token's
        wants_logprobs = body.get("logprobs") is not None
    return ClientAsks(logprobs=wants_logprobs, token_ids=bool(body.get("return_token_ids")))


def upstream_body(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The client's body plus what recording needs; every other field passes unchanged."""
    up = dict(body)
    up["return_token_ids"] = True
    if api == CHAT:
        up["logprobs"] = True
    elif up.get("logprobs") is None:
        up["logprobs"] = 0  # the sampled token's log-prob, no alternatives
    return up


def make_visible(api: str, payload: dict[str, Any], asks: ClientAsks, record_id: str) -> None:
    """Rewrite a backend reply (or stream chunk) in place into what the client asked for."""
    payload["id"] = record_id
    if not asks.token_ids:
        payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices") or ():
        if not asks.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not asks.logprobs and "logprobs" in choice:
            choice["logprobs"] = None


@dataclass
class Extracted:
    """The learning record's token view of one choice."""

    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


def _choice_logprobs(api: str, choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs") or {}
    if api == CHAT:
        return [entry["logprob"] for entry in lp.get("content") or ()]
    return [v for v in lp.get("token_logprobs") or ()]


def _prompt_ids(payload: dict[str, Any], choice: dict[str, Any]) -> list[int] | None:
    ids = payload.get("prompt_token_ids")
    if ids is None:
        ids = choice.get("prompt_token_ids")
    return list(ids) if ids is not None else None


def extract(api: str, payload: dict[str, Any]) -> Extracted:
    """Tokens of the (single) choice of a complete, non-streamed reply."""
    choice = (payload.get("choices") or [{}])[0]
    return Extracted(
        prompt_token_ids=_prompt_ids(payload, choice),
        output_token_ids=list(choice.get("token_ids") or ()),
        output_logprobs=_choice_logprobs(api, choice),
        finish_reason=choice.get("finish_reason"),
    )


@dataclass
class StreamAssembly:
    """Accumulates stream chunks into the token record and the response the client saw."""

    api: str
    tokens: Extracted = field(default_factory=Extracted)
    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    role: str = "assistant"
    usage: dict[str, Any] | None = None
    first: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if self.first is None:
            self.first = {k: chunk.get(k) for k in ("object", "created", "model")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if self.tokens.prompt_token_ids is None:
                self.tokens.prompt_token_ids = _prompt_ids(chunk, choice)
            self.tokens.output_token_ids.extend(choice.get("token_ids") or ())
            self.tokens.output_logprobs.extend(_choice_logprobs(self.api, choice))
            if choice.get("finish_reason"):
                self.tokens.finish_reason = choice["finish_reason"]
            if self.api == CHAT:
                self._add_delta(choice.get("delta") or {})
            elif choice.get("text"):
                self.text.append(choice["text"])
        if self.tokens.prompt_token_ids is None and chunk.get("prompt_token_ids") is not None:
            self.tokens.prompt_token_ids = list(chunk["prompt_token_ids"])

    def _add_delta(self, delta: dict[str, Any]) -> None:
        self.role = delta.get("role") or self.role
        if delta.get("content"):
            self.text.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            slot = self.tool_calls.setdefault(
                call.get("index", 0),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            slot["id"] = call.get("id") or slot["id"]
            fn = call.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

    def response(self, record_id: str) -> dict[str, Any]:
        """The reply as the client assembled it, in the non-streamed shape."""
        first = self.first or {}
        text = "".join(self.text)
        if self.api == CHAT:
            message: dict[str, Any] = {"role": self.role, "content": text}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice: dict[str, Any] = {"index": 0, "message": message}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            kind = "text_completion"
        choice["finish_reason"] = self.tokens.finish_reason
        out = {
            "id": record_id,
            "object": kind,
            "created": first.get("created"),
            "model": first.get("model"),
            "choices": [choice],
        }
        if self.usage:
            out["usage"] = self.usage
        return out
