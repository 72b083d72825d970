"""The Anthropic SDK through the gateway's Messages API: a tool-use turn, its tool result, and a
streamed answer. The SDK sends its key as `x-api-key`, which the gateway accepts.

    RLGW_BASE_URL=http://127.0.0.1:8000/sessions/my-episode RLGW_MODEL=tiny-seed0 \
        python examples/anthropic_sdk.py
"""

from __future__ import annotations

import anthropic
from _env import API_KEY, BASE_URL, EXTRA_BODY, MODEL

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def main() -> None:
    # The only change: base_url (the SDK adds /v1/messages itself).
    client = anthropic.Anthropic(base_url=BASE_URL, api_key=API_KEY)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=MODEL,
        max_tokens=128,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},  # a real model picks it itself
        extra_body=EXTRA_BODY or None,
    )
    print("stop_reason:", first.stop_reason, "content:", first.content)
    results = [
        {"type": "tool_result", "tool_use_id": block.id, "content": "It is sunny."}
        for block in first.content
        if block.type == "tool_use"
    ]
    messages += [
        {
            "role": "assistant",
            "content": [b.model_dump(exclude_none=True, warnings=False) for b in first.content],
        },
        {"role": "user", "content": results or "Go on."},
    ]
    with client.messages.stream(
        model=MODEL, max_tokens=32, messages=messages, tools=TOOLS, extra_body=EXTRA_BODY or None
    ) as stream:
        final = stream.get_final_message()
    print("answer:", final.content, "usage:", final.usage)
    # Message ids are the gateway's record ids (GET /admin/completions/{id}).
    print("recorded:", [first.id, final.id])


if __name__ == "__main__":
    main()
