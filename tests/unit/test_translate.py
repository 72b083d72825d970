"""The Responses and Messages APIs in chat terms, both ways, without a backend."""

from __future__ import annotations

import json

import pytest

from gateway.anthropic import translate as msg
from gateway.anthropic.surface import MessagesSurface
from gateway.errors import APIError
from gateway.proxy.assembly import StreamAssembly
from gateway.responses import translate as resp
from gateway.responses.surface import ResponsesSurface


def events(raw: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for event in raw:
        head, data = event.decode().strip().split("\n")
        out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def chunk(delta: dict, finish: str | None = None, **extra) -> dict:
    return {
        "id": "up",
        "model": "m",
        "created": 1,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}],
    }


TOOL_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hi"}),
    chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}),
    chunk({"content": " there"}),  # text while a call is open
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}),
    chunk({}, "tool_calls"),
    {"id": "up", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
]


# ----------------------------------------------------------------------------- Responses


def test_responses_input_items_become_chat_messages():
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "t"}]},
            {
                "type": "message",
                "role": "assistant",
                "id": "m1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me see."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "max_output_tokens": 9,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": True}},
        "seed": 3,
        "logit_bias": {"1": -1},
        "store": True,
        "metadata": {"k": "v"},
    }
    chat = resp.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {
            "role": "assistant",
            "reasoning": "t",
            "content": "Let me see.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "tool", "content": "two", "tool_call_id": "c2"},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["max_tokens"] == 9 and chat["seed"] == 3 and chat["logit_bias"] == {"1": -1}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {}, "strict": True},
    }
    assert "store" not in chat and "metadata" not in chat and "stream" not in chat


@pytest.mark.parametrize(
    "body",
    [
        {"input": [{"type": "item_reference", "id": "x"}]},
        {"input": [{"role": "wizard", "content": "x"}]},
        {"input": "x", "previous_response_id": "resp_1"},
        {"input": "x", "tools": [{"type": "web_search"}]},
        {"input": "x", "tools": [{"type": "function"}]},
        {"input": "x", "tool_choice": {"type": "mcp"}},
        {"input": "x", "tool_choice": {"type": "function", "name": "f"}},
        {"input": "x", "text": {"format": {"type": "yaml"}}},
        {"input": "x", "background": True},
        {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
    ],
)
def test_responses_refuses_what_it_cannot_serve_with_400(body):
    with pytest.raises(APIError) as caught:
        resp.to_chat({"model": "m", **body})
    assert caught.value.status == 400


def test_responses_whole_reply_has_a_message_and_function_calls():
    surface = ResponsesSurface({"model": "m", "input": "q", "max_output_tokens": 5})
    payload = {
        "model": "m",
        "created": 5,
        "choices": [
            {
                "message": {
                    "content": "ok",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    response, stored = surface.reply(payload, "resp_1")
    assert stored == [response] and response["id"] == "resp_1"
    assert response["status"] == "completed" and response["usage"]["input_tokens"] == 3
    kinds = [(i["type"], i.get("name")) for i in response["output"]]
    assert kinds == [("message", None), ("function_call", "f")]
    assert response["output"][1]["call_id"] == "c1"
    payload["choices"][0]["finish_reason"] = "length"
    assert surface.reply(payload, "r")[0]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_stream_events():
    surface = ResponsesSurface({"model": "m", "input": "q", "stream": True})
    assembly = StreamAssembly("chat.completions")
    shaper = surface.shaper(assembly, "resp_1")
    out = shaper.start()
    for c in TOOL_CHUNKS:
        assembly.add(c)
        out += shaper.chunk(c)
    final = shaper.record_response(0)
    out += shaper.finish()
    got = events(out)
    assert [kind.removeprefix("response.") for kind, _ in got] == [
        "created",
        "in_progress",
        "output_item.added",  # the message "Hi"
        "content_part.added",
        "output_text.delta",
        "output_text.done",  # closed when the call starts
        "content_part.done",
        "output_item.done",
        "output_item.added",  # the function call
        "output_item.added",  # the text written while the call was open: a message of its own
        "content_part.added",
        "output_text.delta",
        "function_call_arguments.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "function_call_arguments.done",
        "output_item.done",
        "completed",
    ]
    assert [d["sequence_number"] for _, d in got] == list(range(len(got)))
    completed = got[-1][1]["response"]
    assert completed["output"] == final["output"] and completed["status"] == "completed"
    assert [i["type"] for i in completed["output"]] == ["message", "function_call", "message"]
    assert completed["output"][1]["arguments"] == '{"a": 1}'
    assert completed["usage"]["output_tokens"] == 4
    error = events([shaper.error(APIError(503, "down", code="x"))])[0]
    assert error[0] == "error" and error[1]["message"] == "down"


# ----------------------------------------------------------------------------- Messages


def test_messages_become_the_chat_request_vllm_builds():
    body = {
        "model": "m",
        "max_tokens": 7,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: abc"},
            {"type": "text", "text": "Be "},
            {"type": "text", "text": "brief."},
        ],
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1, "b": "é"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}],
                    },
                    {"type": "text", "text": "and?"},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]},
        ],
        "tools": [{"name": "f", "input_schema": {"properties": {}}, "cache_control": {}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "top_k": 3,
        "stream": True,
    }
    chat = msg.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1, "b": "\\u00e9"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "r1\nr2"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"properties": {}, "type": "object"}},
        }
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["max_tokens"] == chat["max_completion_tokens"] == 7
    assert chat["stop"] == ["END"] and chat["top_k"] == 3
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert msg.to_chat({**body, "tool_choice": None, "stream": False})["tool_choice"] == "auto"


def test_stop_reasons():
    assert msg.stop_reason("length", None, True, True) == ("max_tokens", None)
    assert msg.stop_reason("stop", "END", False, False) == ("stop_sequence", "END")
    assert msg.stop_reason("stop", None, True, True) == ("tool_use", None)
    assert msg.stop_reason("stop", 258, False, False) == ("end_turn", None)
    assert msg.stop_reason("abort", None, False, False) == (None, None)


def test_messages_whole_reply():
    surface = MessagesSurface(
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "q"}]}
    )
    payload = {
        "model": "m",
        "choices": [
            {
                "message": {
                    "content": "",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "false"}}],
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    message, _ = surface.reply(payload, "msg_1")
    assert message["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": False}]
    assert message["stop_reason"] == "tool_use" and message["usage"] == {
        "input_tokens": 3,
        "output_tokens": 2,
    }
    payload["choices"][0]["message"] = {"content": None}
    assert surface.reply(payload, "m")[0]["content"] == [{"type": "text", "text": ""}]


def test_messages_stream_events_hold_text_written_during_a_tool_call():
    surface = MessagesSurface(
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "q"}]}
    )
    assembly = StreamAssembly("chat.completions")
    shaper = surface.shaper(assembly, "msg_1")
    out = shaper.start()
    for c in TOOL_CHUNKS:
        assembly.add(c)
        out += shaper.chunk(c)
    stored = shaper.record_response(0)
    out += shaper.finish()
    got = events(out)
    kinds = [(k, (d.get("content_block") or d.get("delta") or {}).get("type")) for k, d in got]
    assert kinds == [
        ("message_start", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert [d.get("index") for _, d in got[1:10]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert got[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert got[-2][1]["usage"]["output_tokens"] == 4
    assert stored["content"] == [
        {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
        {"type": "text", "text": " there"},
    ]
    error = events([shaper.error(APIError(503, "down"))])[0]
    assert error == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "down"}},
    )
