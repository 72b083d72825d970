"""The Responses API in chat completion terms, both ways, as pure functions.

A Responses request becomes the chat completion request that vLLM's own Responses endpoint renders
for a non-Harmony model: `instructions` as the first system message, the input items as chat
messages (consecutive assistant text, reasoning and function calls merged into one assistant
message; `function_call_output` as a `tool` message), function tools as chat tools. The chat reply
(with token ids and log-probs, which vLLM's Responses endpoint does not return) then becomes the
Response: a `message` item for the text, a `function_call` item per tool call.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..errors import APIError

# Fields that mean the same in vLLM's Responses and chat completion requests: passed as they are.
PASSED_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "structured_outputs",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "vllm_xargs",
    "cache_salt",
    "priority",
    "parallel_tool_calls",
    "user",
    "watermarking",
)
INPUT_ROLES = ("user", "assistant", "system", "developer")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_UNSUPPORTED = {
    "previous_response_id": "previous_response_id is not supported: the gateway keeps no "
    "conversation state between calls; send the whole conversation as `input`",
    "conversation": "conversation is not supported: send the whole conversation as `input`",
    "prompt": "prompt templates are not supported: send `instructions` and `input`",
}


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_request")


def wants_logprobs(body: dict[str, Any]) -> bool:
    include = body.get("include") or ()
    return LOGPROBS_INCLUDE in include or bool(body.get("top_logprobs"))


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise _bad(
            f"tools[{i}]: only function tools are supported (not {kind!r}): the backend has no "
            "hosted tools",
            f"tools.{i}",
        )
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise _bad(f"tools[{i}].name must be a non-empty string", f"tools.{i}.name")
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise _bad("tool_choice.name must be a string", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice must be auto, none, required or {type: function, name}", "tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise _bad("text.format.type must be text, json_object or json_schema", "text.format")


def _first_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def input_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """Chat messages for the input items (without the instructions)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _bad(f"input[{i}] must be an object", f"input.{i}")
        last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        kind = item.get("type", "message" if "role" in item else None)
        if kind in ("function_call", "custom_tool_call"):
            if kind == "custom_tool_call":
                raise _bad("custom tools are not supported", f"input.{i}")
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _bad(f"input[{i}].{key} must be a string", f"input.{i}.{key}")
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if last is not None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
            )
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = _first_text(parts) or ""
            if last is not None and last.get("reasoning") is None:
                last["reasoning"] = reasoning
            else:
                messages.append({"role": "assistant", "reasoning": reasoning})
        elif kind == "message" and item.get("role") == "assistant":
            text = _first_text(item.get("content"))
            if text is None:  # no text to take: the message as it is
                messages.append(
                    {k: v for k, v in item.items() if k not in ("type", "id", "status")}
                )
            elif last is not None and last.get("content") is None:
                last["content"] = text
            else:
                messages.append({"role": "assistant", "content": text})
        elif kind == "message" and item.get("role") in INPUT_ROLES:
            message = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
            messages.append(message)
        elif kind == "message":
            raise _bad(
                f"input[{i}].role must be one of {', '.join(INPUT_ROLES)}", f"input.{i}.role"
            )
        else:
            raise _bad(f"Unsupported input item type: {kind}", f"input.{i}")
    return messages


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request that stands for a Responses request."""
    for name, message in _UNSUPPORTED.items():
        if body.get(name) is not None:
            raise _bad(message, name)
    if body.get("background"):
        raise _bad("background responses are not supported", "background")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(input_messages(body["input"]))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    tools = body.get("tools")
    choice = _tool_choice(body.get("tool_choice"))
    if tools:
        chat["tools"] = [_tool(tool, i) for i, tool in enumerate(tools)]
        if choice is not None:
            chat["tool_choice"] = choice
    elif choice not in (None, "auto", "none"):
        raise _bad("tool_choice names a tool but no tools were given", "tool_choice")
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    if body.get("top_logprobs"):
        chat["top_logprobs"] = body["top_logprobs"]
    for name in PASSED_FIELDS:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# ----------------------------------------------------------------------------- output


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    prompt = chat_usage.get("prompt_tokens") or 0
    output = chat_usage.get("completion_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage.get("total_tokens") or prompt + output,
    }


def token_logprobs(chat_logprobs: Any) -> list[dict[str, Any]]:
    """Chat log-probs (`logprobs.content`) in the Responses shape."""
    out = []
    for entry in (chat_logprobs or {}).get("content") or ():
        out.append(
            {
                "token": entry.get("token"),
                "logprob": entry.get("logprob"),
                "bytes": entry.get("bytes"),
                "top_logprobs": [
                    {"token": t.get("token"), "logprob": t.get("logprob"), "bytes": t.get("bytes")}
                    for t in entry.get("top_logprobs") or ()
                ],
            }
        )
    return out


def message_item(item_id: str, text: str, logprobs: list | None, done: bool) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed" if done else "in_progress",
        "content": [part] if done or text else [],
    }


def function_call_item(item_id: str, call: dict[str, Any], done: bool) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.get("id") or new_item_id("call"),
        "name": fn.get("name") or "",
        "arguments": fn.get("arguments") or "",
        "status": "completed" if done else "in_progress",
    }


def output_items(choice: dict[str, Any], with_logprobs: bool) -> list[dict[str, Any]]:
    """The output items of a chat choice (non-streamed)."""
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    items = []
    if text or not calls:
        lps = token_logprobs(choice.get("logprobs")) if with_logprobs else None
        items.append(message_item(new_item_id("msg"), text, lps, done=True))
    items.extend(function_call_item(new_item_id("fc"), call, done=True) for call in calls)
    return items


def response_object(
    body: dict[str, Any],
    record_id: str,
    *,
    model: str | None,
    created: int | None,
    output: list[dict[str, Any]],
    finish_reason: str | None,
    chat_usage: dict[str, Any] | None,
    in_progress: bool = False,
) -> dict[str, Any]:
    """A Response object, echoing the request's settings as OpenAI's does."""
    if in_progress:
        status, incomplete = "in_progress", None
    elif finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    elif finish_reason in ("stop", "tool_calls"):
        status, incomplete = "completed", None
    else:
        status, incomplete = "incomplete", {"reason": "interrupted"}
    return {
        "id": record_id,
        "object": "response",
        "created_at": created or int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": model or body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "previous_response_id": None,
        "reasoning": body.get("reasoning"),
        "store": False,
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs"),
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "usage": None if in_progress else usage(chat_usage),
        "user": body.get("user"),
    }
