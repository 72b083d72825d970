"""What the backend is asked for, and what the client is shown."""

from gateway.proxy.assembly import StreamAssembly
from gateway.proxy.shaping import (
    CHAT,
    COMPLETIONS,
    client_asks,
    extract,
    make_visible,
    upstream_body,
)


def test_chat_upstream_always_asks_for_tokens_and_logprobs_keeping_client_fields():
    body = {"model": "m", "messages": [], "temperature": 0.3, "top_logprobs": 2}
    up = upstream_body(CHAT, body)
    assert up["logprobs"] is True and up["return_token_ids"] is True
    assert up["temperature"] == 0.3 and up["top_logprobs"] == 2
    assert "logprobs" not in body  # the client's body is not modified


def test_completions_upstream_keeps_the_clients_top_k():
    assert upstream_body(COMPLETIONS, {"prompt": "x"})["logprobs"] == 0
    assert upstream_body(COMPLETIONS, {"prompt": "x", "logprobs": 3})["logprobs"] == 3


def test_unrequested_extras_are_removed_from_the_reply():
    payload = {
        "id": "up-1",
        "prompt_token_ids": [1],
        "choices": [{"token_ids": [2], "logprobs": {"content": []}, "message": {}}],
    }
    make_visible(CHAT, payload, client_asks(CHAT, {}), "chatcmpl-rec")
    assert payload == {"id": "chatcmpl-rec", "choices": [{"logprobs": None, "message": {}}]}


def test_requested_extras_stay():
    payload = {"id": "x", "prompt_token_ids": [1], "choices": [{"token_ids": [2], "logprobs": {}}]}
    asks = client_asks(CHAT, {"logprobs": True, "return_token_ids": True})
    make_visible(CHAT, payload, asks, "r")
    assert payload["prompt_token_ids"] == [1] and payload["choices"][0]["token_ids"] == [2]
    assert payload["choices"][0]["logprobs"] == {}


def test_extract_reads_tokens_of_a_chat_reply():
    payload = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "token_ids": [7, 8],
                "finish_reason": "stop",
                "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.5}]},
            }
        ],
    }
    got = extract(CHAT, payload)
    assert (got.prompt_token_ids, got.output_token_ids) == ([1, 2], [7, 8])
    assert got.output_logprobs == [-0.5, -1.5] and got.finish_reason == "stop"


def test_stream_assembly_joins_chunks_and_tool_call_deltas():
    asm = StreamAssembly(CHAT)
    asm.add(
        {
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "prompt_token_ids": [1, 2],
            "choices": [{"delta": {"role": "assistant", "content": ""}, "token_ids": []}],
        }
    )
    asm.add(
        {
            "choices": [
                {
                    "delta": {
                        "content": "Hi",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "function": {"name": "get", "arguments": '{"a"'},
                            }
                        ],
                    },
                    "token_ids": [5],
                    "logprobs": {"content": [{"logprob": -0.1}]},
                }
            ]
        }
    )
    asm.add(
        {
            "choices": [
                {
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
                    "token_ids": [6],
                    "logprobs": {"content": [{"logprob": -0.2}]},
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    tokens = asm.choices[0].tokens
    assert tokens.prompt_token_ids == [1, 2]
    assert tokens.output_token_ids == [5, 6]
    assert tokens.output_logprobs == [-0.1, -0.2]
    message = asm.response("chatcmpl-r")["choices"][0]["message"]
    assert message["content"] == "Hi"
    assert message["tool_calls"][0]["function"] == {"name": "get", "arguments": '{"a":1}'}
