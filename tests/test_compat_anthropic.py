"""The Anthropic Messages API through the gateway: served through the chat path with token ids,
translated back, answering as vLLM's own Messages endpoint does, recorded token-exact; errors in
Anthropic's envelope; the key accepted as `x-api-key`."""

from __future__ import annotations

import json
from collections.abc import Callable

import anthropic
import httpx
import pytest

from auth_helpers import as_key, auth_gateway, mint_key
from compat_helpers import assert_token_exact, only_sampling_reasons
from conftest import ADMIN_KEY, MODEL_NAME, fetch_record
from fakes import FAKE_MODEL, fake_backend_database

T0 = {"temperature": 0}
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {"name": "no_schema_type", "input_schema": {"properties": {}}},
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# A conversation with every block the translation handles.
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two calls.", "signature": "s"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny."},
            {
                "type": "tool_result",
                "tool_use_id": "t2",
                "content": [{"type": "text", "text": "Rain."}, {"type": "text", "text": "5 C."}],
                "is_error": False,
            },
            {"type": "text", "text": "Which is warmer?"},
        ],
    },
]


@pytest.fixture(scope="module")
def gw(gateway_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def direct(vllm_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=vllm_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=120) as client:
        yield client


def create(client: anthropic.Anthropic, stream: bool, **kwargs):
    kwargs.setdefault("extra_body", T0)
    if not stream:
        return client.messages.create(model=MODEL_NAME, **kwargs)
    with client.messages.stream(model=MODEL_NAME, **kwargs) as events:
        return events.get_final_message()


def assert_recorded(record: dict, message) -> None:
    assert record["api"] == "messages"
    assert record["status"] == "complete" and only_sampling_reasons(record), record[
        "ineligible_reasons"
    ]
    assert record["policy_version"] == 0
    assert len(record["prompt_token_ids"]) == message.usage.input_tokens
    assert len(record["output_token_ids"]) == message.usage.output_tokens
    assert len(record["output_logprobs"]) == len(record["output_token_ids"])
    assert record["response"]["id"] == message.id


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_text_matches_vllm_direct_and_is_recorded(
    gw, direct, vllm_url, admin_http, tokenizer, stream
):
    ask = {"max_tokens": 8, "system": "Answer in one word.", "messages": QUESTION}
    via, want = create(gw, stream, **ask), create(direct, False, **ask)
    assert [b.model_dump() for b in via.content] == [b.model_dump() for b in want.content]
    assert (via.stop_reason, via.usage.input_tokens, via.usage.output_tokens) == (
        want.stop_reason,
        want.usage.input_tokens,
        want.usage.output_tokens,
    )
    assert via.id.startswith("msg_")
    record = fetch_record(admin_http, via.id)
    assert_recorded(record, via)
    messages = [{"role": "system", "content": "Answer in one word."}, *QUESTION]
    assert record["prompt_token_ids"] == list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    assert tokenizer.decode(record["output_token_ids"], skip_special_tokens=True) == (
        via.content[0].text
    )
    assert record["request"]["messages"] == QUESTION and record["stream"] is stream
    # Token-exact: vLLM's chat API, given the stored translated request, greedy, produces exactly
    # the stored output token ids and log-probs (not only the same decoded text).
    assert record["backend_request"]["messages"] == messages
    assert record["backend_request"]["max_tokens"] == 8
    replayed = assert_token_exact(record, vllm_url)["choices"][0]
    assert record["finish_reason"] == replayed["finish_reason"]
    assert replayed["message"]["content"] == via.content[0].text


CONVERSATIONS = {
    "tool-history": {"messages": HISTORY, "tools": TOOLS[:1]},
    "system-blocks": {
        "system": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Be kind."}],
        "messages": QUESTION,
    },
    "tool-choice-any": {"messages": QUESTION, "tools": TOOLS, "tool_choice": {"type": "any"}},
    "tool-choice-none": {"messages": QUESTION, "tools": TOOLS, "tool_choice": {"type": "none"}},
    "strict-tool": {"messages": QUESTION, "tools": [{**TOOLS[0], "strict": True}]},
    "assistant-prefill": {
        "messages": [*QUESTION, {"role": "assistant", "content": "It is"}],
    },
}


@pytest.mark.parametrize("body", CONVERSATIONS.values(), ids=CONVERSATIONS.keys())
def test_prompts_render_as_vllm_renders_them(http, vllm_url, body):
    """vLLM's count_tokens renders a Messages request with vLLM's own translation; the gateway's
    renders with its own: the counts agree, and so do greedy answers."""
    body = {"model": MODEL_NAME, **body}
    via = http.post("/v1/messages/count_tokens", json=body)
    want = httpx.post(f"{vllm_url}/v1/messages/count_tokens", json=body, timeout=60)
    assert via.status_code == want.status_code == 200, via.text
    assert via.json()["input_tokens"] == want.json()["input_tokens"]
    if "tool_choice" not in body:
        ask = {**body, "max_tokens": 4, "temperature": 0}
        got = http.post("/v1/messages", json=ask).json()
        expected = httpx.post(f"{vllm_url}/v1/messages", json=ask, timeout=60).json()
        assert got["content"] == expected["content"]
        assert got["usage"]["input_tokens"] == want.json()["input_tokens"]


def test_forced_tool_use_is_translated_and_recorded(gw, vllm_url, admin_http):
    message = create(
        gw,
        False,
        max_tokens=120,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert message.stop_reason == "tool_use"
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.id
    record = fetch_record(admin_http, message.id)
    assert_recorded(record, message)
    # Exactly what vLLM's chat API produces for the translated request, token for token.
    want = assert_token_exact(record, vllm_url)
    (call,) = want["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == block.name
    assert json.loads(call["function"]["arguments"]) == block.input


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    out, kind = [], None
    for line in response.iter_lines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            out.append((kind, json.loads(line[5:])))
    return out


def comparable(events: list[tuple[str, dict]]) -> list:
    """Stream events without ids and usage (message_start carries the id)."""
    out = []
    for kind, data in events:
        data = {k: v for k, v in data.items() if k not in ("message", "usage")}
        block = data.get("content_block")
        if block and block.get("type") == "tool_use":
            data["content_block"] = {**block, "id": "-"}
        out.append((kind, data))
    return out


def test_streamed_tool_use_events_equal_vllm_direct(http, vllm_url, admin_http):
    body = {
        "model": MODEL_NAME,
        "max_tokens": 120,
        "messages": QUESTION,
        "tools": TOOLS[:1],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "temperature": 0,
        "stream": True,
    }
    with http.stream("POST", "/v1/messages", json=body) as reply:
        via = sse_events(reply)
    with httpx.stream("POST", f"{vllm_url}/v1/messages", json=body, timeout=120) as reply:
        want = sse_events(reply)
    assert comparable(via) == comparable(want)
    kinds = [k for k, _ in via]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert any(d.get("delta", {}).get("type") == "input_json_delta" for _, d in via)
    record = fetch_record(admin_http, via[0][1]["message"]["id"])
    assert record["status"] == "complete" and record["stream"]
    assert record["response"]["stop_reason"] == "tool_use"


def test_tool_turns_in_a_session_link_parents(http):
    session = http.post("/v1/sessions", json={}).json()
    client = anthropic.Anthropic(
        base_url=session["base_url"].removesuffix("/v1"), api_key="unused", max_retries=0
    )
    first = create(
        client,
        False,
        max_tokens=120,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    (use,) = [b for b in first.content if b.type == "tool_use"]
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": [b.model_dump(exclude_none=True, warnings=False) for b in first.content],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny."}],
        },
    ]
    second = create(client, True, max_tokens=6, messages=history, tools=TOOLS)
    detail = {c["id"]: c for c in http.get(f"/v1/sessions/{session['id']}").json()["completions"]}
    assert detail[second.id]["parent_id"] == first.id
    assert not detail[first.id]["is_orphan"] and not detail[second.id]["is_orphan"]


def assert_anthropic_envelope(reply: httpx.Response, status: int, kind: str) -> None:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in reply.text


BAD = {
    "empty": {},
    "no-max-tokens": {"model": MODEL_NAME, "messages": QUESTION},
    "no-messages": {"model": MODEL_NAME, "max_tokens": 4, "messages": []},
    "bad-role": {"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "x", "content": "h"}]},
    "bad-block": {
        "model": MODEL_NAME,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "video"}]}],
    },
    "tool-without-name": {
        "model": MODEL_NAME,
        "max_tokens": 4,
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": {"type": "tool"},
    },
    "tool-without-schema": {
        "model": MODEL_NAME,
        "max_tokens": 4,
        "messages": QUESTION,
        "tools": [{"name": "web_search", "type": "web_search_20250305"}],
    },
    "zero-tokens": {"model": MODEL_NAME, "max_tokens": 0, "messages": QUESTION},
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_bad_input_gets_the_anthropic_envelope(http, body):
    for path in ("/v1/messages", "/sessions/anthropic-errors/v1/messages"):
        assert_anthropic_envelope(http.post(path, json=body), 400, "invalid_request_error")


def test_backend_and_session_errors_get_the_anthropic_envelope(http):
    body = {"model": "no-such-model", "max_tokens": 4, "messages": QUESTION}
    assert_anthropic_envelope(http.post("/v1/messages", json=body), 404, "not_found_error")
    reply = http.post(
        "/v1/messages", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert_anthropic_envelope(reply, 400, "invalid_request_error")
    session = http.post("/v1/sessions", json={}).json()
    http.post(f"/v1/sessions/{session['id']}/close")
    body["model"] = MODEL_NAME
    reply = http.post(f"/sessions/{session['id']}/v1/messages", json=body)
    assert_anthropic_envelope(reply, 409, "invalid_request_error")
    too_long = {**body, "messages": [{"role": "user", "content": "x" * 5000}]}
    reply = http.post("/v1/messages", json=too_long)  # the backend's 400, relayed
    assert_anthropic_envelope(reply, 400, "invalid_request_error")


@pytest.fixture(scope="module")
def fake_db(make_database: Callable[[], str]) -> str:
    return fake_backend_database(make_database)


def test_x_api_key_is_the_agent_key_with_auth_on(fake_db):
    with auth_gateway(fake_db, max_body_bytes=4096) as gw:
        with httpx.Client(base_url=gw, timeout=30, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
            key = mint_key(admin, "anthropic-tenant")["key"]
        client = anthropic.Anthropic(base_url=gw, api_key=key, max_retries=0)
        message = client.messages.create(model=FAKE_MODEL, max_tokens=4, messages=QUESTION)
        assert message.content[0].text == "ok" and message.usage.input_tokens == 3
        with client.messages.stream(model=FAKE_MODEL, max_tokens=4, messages=QUESTION) as s:
            assert s.get_final_message().content[0].text == "ok"
        with as_key(gw, key) as bearer:  # Authorization: Bearer works there too
            reply = bearer.post(
                "/v1/messages", json={"model": FAKE_MODEL, "max_tokens": 4, "messages": QUESTION}
            )
            assert reply.status_code == 200
        wrong = anthropic.Anthropic(base_url=gw, api_key="rlgw_ak_wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(model=FAKE_MODEL, max_tokens=4, messages=QUESTION)
        anonymous = httpx.post(
            f"{gw}/v1/messages", json={"model": FAKE_MODEL, "max_tokens": 4, "messages": QUESTION}
        )
        assert_anthropic_envelope(anonymous, 401, "authentication_error")
        # x-api-key is the Messages API's header only: the OpenAI routes want a bearer token.
        other = httpx.post(
            f"{gw}/v1/chat/completions",
            json={"model": FAKE_MODEL, "messages": QUESTION},
            headers={"x-api-key": key},
        )
        assert other.status_code == 401 and "error" in other.json()
        big = {
            "model": FAKE_MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x" * 5000}],
        }
        reply = httpx.post(f"{gw}/v1/messages", json=big, headers={"x-api-key": key})
        assert_anthropic_envelope(reply, 413, "request_too_large")
