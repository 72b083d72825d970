"""The Anthropic Messages API in chat completion terms, both ways, as pure functions.

A Messages request becomes the chat completion request vLLM's own Messages endpoint builds from
it (so the prompt renders to the same tokens): `system` as the first system message, text blocks
as text, `tool_use` blocks as assistant `tool_calls` (arguments `json.dumps(input)`),
`tool_result` blocks of a user turn as `tool` messages placed before that turn's remaining text,
tools as chat function tools, `tool_choice` any/tool as required/named. The chat reply (with token
ids and log-probs, which vLLM's Messages endpoint does not return) becomes the Message: a
`text` block, a `tool_use` block per tool call, and the stop reason.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..errors import APIError

BILLING_HEADER = "x-anthropic-billing-header"  # per-request text some clients put in `system`
# vLLM extensions accepted by its Messages endpoint, passed under the same name.
PASSED_FIELDS = (
    "top_k",
    "watermarking",
    "cache_salt",
    "kv_transfer_params",
    "vllm_xargs",
    "chat_template_kwargs",
)


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_request")


def _image_url(source: Any) -> str:
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "url":
        return str(source.get("url") or "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _system_text(content: Any) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = [
        block.get("text")
        for block in content or ()
        if isinstance(block, dict)
        and block.get("type") == "text"
        and block.get("text")
        and not block["text"].startswith(BILLING_HEADER)
    ]
    return "".join(parts) if parts else None


def _tool_result_messages(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A user turn's tool_result as chat messages: the tool message (text parts joined by new
    lines), then a user message with its images and a tool message with its tool references."""
    content = block.get("content")
    text, images, references = "", [], []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(str(item.get("text", "")))
            elif item.get("type") == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif item.get("type") == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": text}]
    if images:
        out.append(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": u}} for u in images],
            }
        )
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})
    return out


def _tool_arguments(value: Any) -> str:
    # As vLLM does (json.dumps with its default separators), so the prompt renders alike. vLLM
    # refuses an `input` that is not an object; a model can write one (the gateway returns what
    # it wrote), so it is rendered back as it was, not as {}.
    return json.dumps(value if value is not None else {})


def _message(message: dict[str, Any], out: list[dict[str, Any]]) -> None:
    role, content = message["role"], message["content"]
    if role == "system":
        text = _system_text(content)
        if text:
            out.append({"role": "system", "content": text})
        return
    chat: dict[str, Any] = {"role": role}
    if isinstance(content, str):
        chat["content"] = content
        out.append(chat)
        return
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id") or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {
                        "name": block.get("name") or "",
                        "arguments": _tool_arguments(block.get("input")),
                    },
                }
            )
        elif kind == "tool_result":
            if role == "user":
                out.extend(_tool_result_messages(block))
            else:
                result = block.get("content")
                parts.append({"type": "text", "text": f"Tool result: {result or ''}"})
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        chat["content"] = parts[0]["text"] if only_text else parts
    if not (role == "user" and "content" not in chat):
        out.append(chat)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Messages request (system prompt first)."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        # A string is taken whole; blocks lose the billing header block (it changes per request
        # and would defeat prefix caching).
        text = system if isinstance(system, str) else _system_text(system)
        if text:
            out.append({"role": "system", "content": text})
    for message in body["messages"]:
        _message(message, out)
    return out


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        schema = dict(tool["input_schema"])
        schema.setdefault("type", "object")
        function: dict[str, Any] = {"name": tool["name"], "parameters": schema}
        for key in ("description", "strict", "defer_loading"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        if not choice.get("name"):
            raise _bad("tool_choice.name is required when type is 'tool'", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def to_chat(body: dict[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    """The chat completion request that stands for a Messages request."""
    chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages(body)}
    if not count_only:
        chat["max_tokens"] = chat["max_completion_tokens"] = body["max_tokens"]
        if body.get("stop_sequences") is not None:
            chat["stop"] = body["stop_sequences"]
        for name in ("temperature", "top_p"):
            if body.get(name) is not None:
                chat[name] = body[name]
        for name in PASSED_FIELDS:
            if body.get(name) is not None:
                chat[name] = body[name]
        output_config = body.get("output_config")
        if isinstance(output_config, dict):
            fmt = output_config.get("format")
            if isinstance(fmt, dict) and fmt.get("schema"):
                chat["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "json_schema", "schema": fmt["schema"]},
                }
            if output_config.get("effort") is not None:
                chat["reasoning_effort"] = output_config["effort"]
        thinking = body.get("thinking")
        if isinstance(thinking, dict):
            if thinking.get("type") == "disabled":
                chat["reasoning_effort"] = "none"
            elif thinking.get("type") == "enabled" and thinking.get("budget_tokens"):
                chat["thinking_token_budget"] = thinking["budget_tokens"]
        if body.get("stream"):
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    elif body.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
        if not count_only:
            chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use")
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
        chat.setdefault("tool_choice", "auto")
    elif choice is not None and choice["type"] == "tool":
        raise _bad("tool_choice names a tool but no tools were given", "tool_choice")
    return chat


# ----------------------------------------------------------------------------- output


def stop_reason(
    finish_reason: str | None, matched: Any, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat finish reason. `matched` is vLLM's
    `stop_reason`: the stop string that ended the output (a str), else not a stop sequence."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def tool_input(arguments: str | None) -> Any:
    """A tool call's arguments as the `input` of a tool_use block: the JSON they hold (not
    always an object when a model writes them), or {} when they are not JSON."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {}


def usage(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    chat_usage = chat_usage or {}
    return {
        "input_tokens": chat_usage.get("prompt_tokens") or 0,
        "output_tokens": chat_usage.get("completion_tokens") or 0,
    }


def message_object(
    record_id: str,
    model: str | None,
    choice: dict[str, Any],
    chat_usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A whole chat choice as an Anthropic Message."""
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": fn.get("name"),
                "input": tool_input(fn.get("arguments")),
            }
        )
    if not content:
        content.append({"type": "text", "text": ""})
    reason, sequence = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), bool(calls), bool(calls)
    )
    return {
        "id": record_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(chat_usage),
    }
