"""The Responses API through the gateway: served through the chat path with token ids, translated
back, and answering as vLLM's own Responses endpoint does; recorded token-exact."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from compat_helpers import NO_WHITESPACE, assert_token_exact, only_sampling_reasons
from conftest import MODEL_NAME, fetch_record

FUNCTION_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
FORCED = {
    "tools": FUNCTION_TOOLS,
    "tool_choice": "required",
    "max_output_tokens": 120,
    "temperature": 0,
    "extra_body": {"logit_bias": NO_WHITESPACE},
}
INSTRUCTIONS = "Answer in one word."


@pytest.fixture(scope="module")
def gw(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def direct(vllm_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vllm_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=120) as client:
        yield client


def create(client: openai.OpenAI, stream: bool, **kwargs):
    """A Response, streamed (the events too) or not."""
    if not stream:
        return client.responses.create(model=MODEL_NAME, **kwargs), []
    events = list(client.responses.create(model=MODEL_NAME, stream=True, **kwargs))
    assert events[-1].type == "response.completed"
    return events[-1].response, events


def assert_recorded(record: dict, response, tokenizer) -> None:
    assert record["api"] == "responses"
    assert record["status"] == "complete" and only_sampling_reasons(record), record[
        "ineligible_reasons"
    ]
    assert record["policy_version"] == 0
    assert len(record["prompt_token_ids"]) == response.usage.input_tokens
    assert len(record["output_token_ids"]) == response.usage.output_tokens
    assert len(record["output_logprobs"]) == len(record["output_token_ids"])
    assert np.isfinite(record["output_logprobs"]).all()
    assert record["response"]["id"] == response.id
    assert record["backend_request"]["messages"]  # the chat request served in its place


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_text_matches_vllm_direct_and_is_recorded(
    gw, direct, vllm_url, admin_http, tokenizer, stream
):
    ask = {"input": "Name a colour.", "instructions": INSTRUCTIONS, "max_output_tokens": 8}
    via, events = create(gw, stream, temperature=0, **ask)
    want, _ = create(direct, False, temperature=0, **ask)
    assert via.output_text == want.output_text
    assert (via.status, via.usage.input_tokens, via.usage.output_tokens) == (
        want.status,
        want.usage.input_tokens,
        want.usage.output_tokens,
    )
    record = fetch_record(admin_http, via.id)
    assert_recorded(record, via, tokenizer)
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "Name a colour."},
    ]
    assert record["prompt_token_ids"] == list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    assert tokenizer.decode(record["output_token_ids"], skip_special_tokens=True) == (
        via.output_text
    )
    assert {k: record["request"][k] for k in ask} == ask  # the client's own body
    # Token-exact: vLLM's chat API, given the stored translated request, greedy, produces exactly
    # the stored output token ids and log-probs (not only the same decoded text).
    assert record["backend_request"]["messages"] == messages
    assert record["backend_request"]["max_tokens"] == 8
    replayed = assert_token_exact(record, vllm_url)["choices"][0]
    assert record["finish_reason"] == replayed["finish_reason"]
    assert replayed["message"]["content"] == via.output_text
    if stream:
        kinds = [e.type for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == via.output_text
        assert [e.sequence_number for e in events] == list(range(len(events)))


def test_output_logprobs_when_asked_equal_the_record(gw, admin_http):
    reply = gw.responses.create(
        model=MODEL_NAME,
        input="Name a colour.",
        max_output_tokens=5,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    part = reply.output[0].content[0]
    record = fetch_record(admin_http, reply.id)
    assert [t.logprob for t in part.logprobs] == pytest.approx(record["output_logprobs"], abs=1e-6)
    assert all(len(t.top_logprobs) == 2 for t in part.logprobs)
    plain = gw.responses.create(model=MODEL_NAME, input="Name a colour.", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_function_call_is_translated_and_recorded(gw, vllm_url, admin_http, tokenizer, stream):
    via, events = create(gw, stream, input="What is the weather in Paris?", **FORCED)
    (call,) = via.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments.replace(" ", "") in ('{"city":"Paris"}', '{"city":"Oslo"}')
    assert via.status == "completed"
    record = fetch_record(admin_http, via.id)
    assert_recorded(record, via, tokenizer)
    assert record["finish_reason"] in ("tool_calls", "stop")
    # Exactly what vLLM's chat API produces for the translated request, token for token.
    assert_token_exact(record, vllm_url)
    if stream:
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert done.arguments == call.arguments


def test_tool_result_turn_in_a_session_links_its_parent(http, direct):
    session = http.post("/v1/sessions", json={}).json()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(model=MODEL_NAME, input=question, **FORCED)
    (call,) = first.output
    history = [
        *question,
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."},
    ]
    ask = {"tools": FUNCTION_TOOLS, "max_output_tokens": 6, "temperature": 0}
    second = client.responses.create(model=MODEL_NAME, input=history, **ask)
    want = direct.responses.create(model=MODEL_NAME, input=history, **ask)
    assert second.output_text == want.output_text
    assert second.usage.input_tokens == want.usage.input_tokens
    detail = {c["id"]: c for c in http.get(f"/v1/sessions/{session['id']}").json()["completions"]}
    assert detail[second.id]["parent_id"] == first.id
    assert not detail[first.id]["is_orphan"] and not detail[second.id]["is_orphan"]


BAD = {
    "no-input": {"model": MODEL_NAME},
    "input-not-list": {"model": MODEL_NAME, "input": 7},
    "unknown-item": {"model": MODEL_NAME, "input": [{"type": "item_reference", "id": "x"}]},
    "previous-response": {"model": MODEL_NAME, "input": "hi", "previous_response_id": "resp_1"},
    "hosted-tool": {"model": MODEL_NAME, "input": "hi", "tools": [{"type": "web_search"}]},
    "bad-tool-choice": {"model": MODEL_NAME, "input": "hi", "tool_choice": {"type": "mcp"}},
    "zero-tokens": {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 0},
    "bad-format": {"model": MODEL_NAME, "input": "hi", "text": {"format": {"type": "yaml"}}},
    "background": {"model": MODEL_NAME, "input": "hi", "background": True},
    "unknown-model": {"model": "no-such-model", "input": "hi"},
    "bad-role": {"model": MODEL_NAME, "input": [{"role": "wizard", "content": "hi"}]},
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_bad_input_gets_the_openai_envelope(http, body):
    for path in ("/v1/responses", "/sessions/responses-errors/v1/responses"):
        reply = http.post(path, json=body)
        assert 400 <= reply.status_code < 500, reply.text
        error = reply.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str) and "Traceback" not in reply.text


def test_invalid_json_gets_the_openai_envelope(http):
    reply = http.post(
        "/v1/responses", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
