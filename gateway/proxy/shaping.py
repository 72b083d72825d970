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


def shown_as(payload: dict[str, Any], model: str) -> None:
    """A backend reply (or stream chunk) names the model the client asked for, not the name the
    backend served it under (a LoRA adapter's `model@vN`)."""
    if "model" in payload:
        payload["model"] = model


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


def choice_logprobs(api: str, choice: dict[str, Any]) -> list[float]:
    """The sampled tokens' log-probs of one choice (or stream chunk of it)."""
    lp = choice.get("logprobs") or {}
    if api == CHAT:
        return [entry["logprob"] for entry in lp.get("content") or ()]
    return [v for v in lp.get("token_logprobs") or ()]


def prompt_ids(payload: dict[str, Any], choice: dict[str, Any]) -> list[int] | None:
    """The prompt's token ids, on the reply (chat) or on the choice (text completions)."""
    ids = payload.get("prompt_token_ids")
    if ids is None:
        ids = choice.get("prompt_token_ids")
    return list(ids) if ids is not None else None


def _extract_choice(api: str, payload: dict[str, Any], choice: dict[str, Any]) -> Extracted:
    return Extracted(
        prompt_token_ids=prompt_ids(payload, choice),
        output_token_ids=list(choice.get("token_ids") or ()),
        output_logprobs=choice_logprobs(api, choice),
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
