"""Pure functions that shape bodies between client and backend, and read tokens out of replies.

The gateway always asks the backend for token ids and per-token log-probs (they are the learning
record) and hands them to the client only when the client asked for them.

A request with `n` > 1 gets one record per choice: choice `i` is recorded under
`sibling_id(base, i)` (the base id for choice 0, `<base>-<i>` for the others), and every choice the
client sees carries its record id as the extension field `completion_id`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT = "chat.completions"
COMPLETIONS = "completions"


def sibling_id(base: str, index: int) -> str:
    """The record id of choice `index` of a request whose reply id is `base`."""
    return base if index == 0 else f"{base}-{index}"


@dataclass(frozen=True)
class ClientAsks:
    """Which of the recorded extras the client itself requested."""

    logprobs: bool
    token_ids: bool


NOTHING_EXTRA = ClientAsks(logprobs=False, token_ids=False)


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


def make_visible(
    api: str,
    payload: dict[str, Any],
    asks: ClientAsks,
    record_id: str,
) -> None:
    """Rewrite a backend reply (or stream chunk) in place into what the client asked for: the
    reply id is the record id of choice 0, and each choice names its own record."""
    payload["id"] = record_id
    if not asks.token_ids:
        payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("index"), int):
            choice["completion_id"] = sibling_id(record_id, choice["index"])
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


def _extract_choice(api: str, payload: dict[str, Any], choice: dict[str, Any]) -> Extracted:
    return Extracted(
        prompt_token_ids=_prompt_ids(payload, choice),
        output_token_ids=list(choice.get("token_ids") or ()),
        output_logprobs=_choice_logprobs(api, choice),
        finish_reason=choice.get("finish_reason"),
    )


def choices_by_index(payload: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The choices of a reply by their `index` (position when a choice has none)."""
    out: dict[int, dict[str, Any]] = {}
    for position, choice in enumerate(payload.get("choices") or ()):
        if isinstance(choice, dict):
            index = choice.get("index")
            out[index if isinstance(index, int) else position] = choice
    return out


def extract_choices(api: str, payload: dict[str, Any]) -> dict[int, Extracted]:
    """Tokens of every choice of a complete, non-streamed reply, by choice index."""
    return {i: _extract_choice(api, payload, c) for i, c in choices_by_index(payload).items()}


def extract(api: str, payload: dict[str, Any]) -> Extracted:
    """Tokens of the first choice of a complete, non-streamed reply."""
    choice = (payload.get("choices") or [{}])[0]
    return _extract_choice(api, payload, choice)


def only_choice(payload: dict[str, Any], index: int) -> dict[str, Any]:
    """The reply as one sibling's record keeps it: the other choices left out."""
    return {
        **payload,
        "choices": [c for i, c in choices_by_index(payload).items() if i == index],
    }


@dataclass
class ChoiceAssembly:
    """One choice of a stream, accumulated."""

    index: int
    tokens: Extracted = field(default_factory=Extracted)
    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    role: str = "assistant"
    stop_reason: Any = None  # vLLM: the stop string or stop token that ended it

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.text)}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


@dataclass
class StreamAssembly:
    """Accumulates stream chunks into the token record and the response the client saw."""

    api: str
    choices: dict[int, ChoiceAssembly] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    usage: dict[str, Any] | None = None
    first: dict[str, Any] | None = None

    def choice(self, index: int) -> ChoiceAssembly:
        if index not in self.choices:
            self.choices[index] = ChoiceAssembly(index)
            self.choices[index].tokens.prompt_token_ids = self.prompt_token_ids
        return self.choices[index]

    def finished(self, n: int) -> bool:
        return all(self.choice(i).tokens.finish_reason for i in range(n))

    def add(self, chunk: dict[str, Any]) -> None:
        if self.first is None:
            self.first = {k: chunk.get(k) for k in ("object", "created", "model")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if self.prompt_token_ids is None and chunk.get("prompt_token_ids") is not None:
            self._set_prompt(list(chunk["prompt_token_ids"]))
        for position, choice in enumerate(chunk.get("choices") or ()):
            index = choice.get("index")
            slot = self.choice(index if isinstance(index, int) else position)
            if slot.tokens.prompt_token_ids is None:
                ids = _prompt_ids(chunk, choice)
                if ids is not None:
                    slot.tokens.prompt_token_ids = ids
                    if self.prompt_token_ids is None:
                        self._set_prompt(ids)
            slot.tokens.output_token_ids.extend(choice.get("token_ids") or ())
            slot.tokens.output_logprobs.extend(_choice_logprobs(self.api, choice))
            if choice.get("finish_reason"):
                slot.tokens.finish_reason = choice["finish_reason"]
                slot.stop_reason = choice.get("stop_reason")
            if self.api == CHAT:
                self._add_delta(slot, choice.get("delta") or {})
            elif choice.get("text"):
                slot.text.append(choice["text"])

    def _set_prompt(self, ids: list[int]) -> None:
        self.prompt_token_ids = ids
        for slot in self.choices.values():
            if slot.tokens.prompt_token_ids is None:
                slot.tokens.prompt_token_ids = ids

    @staticmethod
    def _add_delta(slot: ChoiceAssembly, delta: dict[str, Any]) -> None:
        slot.role = delta.get("role") or slot.role
        if delta.get("content"):
            slot.text.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            entry = slot.tool_calls.setdefault(
                call.get("index", 0),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            entry["id"] = call.get("id") or entry["id"]
            fn = call.get("function") or {}
            entry["function"]["name"] += fn.get("name") or ""
            entry["function"]["arguments"] += fn.get("arguments") or ""

    def choice_view(self, index: int) -> dict[str, Any]:
        """Choice `index` in the non-streamed shape."""
        slot = self.choice(index)
        if self.api == CHAT:
            choice: dict[str, Any] = {"index": index, "message": slot.message()}
        else:
            choice = {"index": index, "text": "".join(slot.text)}
        choice["finish_reason"] = slot.tokens.finish_reason
        return choice

    def response(self, record_id: str, only: int | None = None) -> dict[str, Any]:
        """The reply as the client assembled it, in the non-streamed shape (only choice `only`
        when given: a sibling's record)."""
        first = self.first or {}
        indexes = sorted(self.choices) if only is None else [only]
        choices = []
        for i in indexes:
            choice = self.choice_view(i)
            choice["completion_id"] = sibling_id(record_id, i)
            choices.append(choice)
        out = {
            "id": record_id,
            "object": "chat.completion" if self.api == CHAT else "text_completion",
            "created": first.get("created"),
            "model": first.get("model"),
            "choices": choices or [self.choice_view(0)],
        }
        if self.usage:
            out["usage"] = self.usage
        return out
