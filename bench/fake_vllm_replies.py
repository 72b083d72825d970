"""Replies in vLLM 0.32's exact wire format (chat and text completions, whole and streamed),
rendered once per request shape so that the fake upstream spends no time building them.

Field sets and order follow vLLM's own serialization: a whole reply is `model_dump()` of its
response model (every field, nulls included, compact JSON as FastAPI's JSONResponse writes it); a
stream chunk is `model_dump_json(exclude_unset=True)` of the chunk vLLM builds at that point of
`chat_completion_stream_generator` / `completion_stream_generator`. Every answer is exactly
`max_tokens` tokens long and ends with finish_reason "length". Log-probs and token ids are sent only
when the request asks for them (`logprobs`, `return_token_ids`), as vLLM does; `top_logprobs`
alternatives are never generated (an empty list for chat; the sampled token only for text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CHAT = "chat"
TEXT = "text"
# (token id, token text): a few word pieces of about the length of real BPE tokens.
VOCAB = [
    (464, " the"),
    (3797, " cat"),
    (3332, " sat"),
    (319, " on"),
    (2603, " mat"),
    (11, ","),
    (290, " and"),
    (340, " it"),
    (4966, " looked"),
    (379, " at"),
    (1110, " us"),
    (13, "."),
]
PROMPT_TOKEN_BASE = 1000


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def token(i: int) -> tuple[int, str, float]:
    """Output token `i`: its id, its text and its (finite, negative) log-prob."""
    tid, text = VOCAB[i % len(VOCAB)]
    return tid, text, -round(0.05 + (i % 10) * 0.1, 2)


@dataclass(frozen=True)
class Ask:
    """The shape of one generation request: everything a reply depends on."""

    api: str  # CHAT or TEXT
    model: str
    max_tokens: int
    n: int = 1
    stream: bool = False
    logprobs: bool = False  # chat: logprobs=true; text: logprobs is not None
    token_ids: bool = False  # return_token_ids
    include_usage: bool = False  # stream_options.include_usage (streams only)
    prompt_tokens: int = 32
    created: int = 0
    rid: str = "fake"

    @property
    def prompt_ids(self) -> list[int]:
        return [PROMPT_TOKEN_BASE + i for i in range(self.prompt_tokens)]

    @property
    def reply_id(self) -> str:
        return ("chatcmpl-" if self.api == CHAT else "cmpl-") + self.rid

    def usage(self, full: bool) -> dict:
        done = self.max_tokens * self.n
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + done,
            "completion_tokens": done,
        }
        if full:  # a whole reply dumps every field; the stream's usage chunk drops the nulls
            usage |= {"prompt_tokens_details": None, "completion_tokens_details": None}
        return usage


def _chat_logprobs(start: int, stop: int) -> dict:
    content = []
    for i in range(start, stop):
        _, text, lp = token(i)
        entry = {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
        content.append(entry)
    return {"content": content}


def _text_logprobs(start: int, stop: int, offset: int) -> dict:
    offsets, lps, tokens, tops = [], [], [], []
    for i in range(start, stop):
        _, text, lp = token(i)
        offsets.append(offset)
        offset += len(text)
        lps.append(lp)
        tokens.append(text)
        tops.append({text: lp})
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def _text(start: int, stop: int) -> str:
    return "".join(token(i)[1] for i in range(start, stop))


def _ids(start: int, stop: int) -> list[int]:
    return [token(i)[0] for i in range(start, stop)]


def render_reply(ask: Ask) -> bytes:
    """The whole (non-streamed) reply body."""
    m = ask.max_tokens
    head = {"id": ask.reply_id, "object": "", "created": ask.created, "model": ask.model}
    choices = []
    for index in range(ask.n):
        if ask.api == CHAT:
            message = {
                "role": "assistant",
                "content": _text(0, m),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": _chat_logprobs(0, m) if ask.logprobs else None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": _ids(0, m) if ask.token_ids else None,
                    "routed_experts": None,
                }
            )
        else:
            choices.append(
                {
                    "index": index,
                    "text": _text(0, m),
                    "logprobs": _text_logprobs(0, m, 0) if ask.logprobs else None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": _ids(0, m) if ask.token_ids else None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": ask.prompt_ids if ask.token_ids else None,
                    "routed_experts": None,
                }
            )
    body = {**head, "choices": choices, "service_tier": None, "system_fingerprint": None}
    body["usage"] = ask.usage(full=True)
    if ask.api == CHAT:
        body["object"] = "chat.completion"
        body |= {
            "prompt_logprobs": None,
            "prompt_token_ids": ask.prompt_ids if ask.token_ids else None,
            "prompt_text": None,
        }
    else:
        body["object"] = "text_completion"
    body |= {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
    return _dumps(body)


def _event(chunk: dict) -> bytes:
    return b"data: " + _dumps(chunk) + b"\n\n"


def _chat_events(ask: Ask) -> list[bytes]:
    head = {
        "id": ask.reply_id,
        "object": "chat.completion.chunk",
        "created": ask.created,
        "model": ask.model,
    }
    events = []
    for index in range(ask.n):  # vLLM's first iteration: the role, once per choice
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        prompt = ask.prompt_ids if ask.token_ids else None
        events.append(
            _event({**head, "choices": [choice], "prompt_token_ids": prompt, "prompt_text": None})
        )
    for i in range(ask.max_tokens):
        last = i == ask.max_tokens - 1
        for index in range(ask.n):
            choice = {
                "index": index,
                "delta": {"content": token(i)[1]},
                "logprobs": _chat_logprobs(i, i + 1) if ask.logprobs else None,
                "finish_reason": "length" if last else None,
            }
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = _ids(i, i + 1) if ask.token_ids else None
            events.append(_event({**head, "choices": [choice]}))
    if ask.include_usage:
        events.append(_event({**head, "choices": [], "usage": ask.usage(full=False)}))
    return events


def _text_events(ask: Ask) -> list[bytes]:
    head = {"id": ask.reply_id, "object": "text_completion", "created": ask.created}
    head["model"] = ask.model
    events = []
    offset = 0
    for i in range(ask.max_tokens):
        last = i == ask.max_tokens - 1
        for index in range(ask.n):
            choice = {
                "index": index,
                "text": token(i)[1],
                "logprobs": _text_logprobs(i, i + 1, offset) if ask.logprobs else None,
                "finish_reason": "length" if last else None,
                "stop_reason": None,
                "prompt_token_ids": ask.prompt_ids if ask.token_ids and i == 0 else None,
                "token_ids": _ids(i, i + 1) if ask.token_ids else None,
            }
            events.append(_event({**head, "choices": [choice]}))
        offset += len(token(i)[1])
    if ask.include_usage:
        events.append(_event({**head, "choices": [], "usage": ask.usage(full=False)}))
    return events


def render_stream(ask: Ask) -> list[bytes]:
    """The SSE events of a streamed reply, one per chunk vLLM would send, then `[DONE]`."""
    events = _chat_events(ask) if ask.api == CHAT else _text_events(ask)
    return [*events, b"data: [DONE]\n\n"]


def models_body(model: str, created: int, max_model_len: int) -> bytes:
    """GET /v1/models as vLLM answers it."""
    permission = {
        "id": "modelperm-fake",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return _dumps({"object": "list", "data": [card]})


def error_body(status: int, message: str, kind: str = "BadRequestError") -> bytes:
    """vLLM's error envelope."""
    return _dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})
