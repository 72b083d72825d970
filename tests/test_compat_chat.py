"""Chat completions through the gateway work exactly as directly against vLLM: tool calling, n > 1,
streaming details and sampling fields; every choice is recorded token-exact."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from compat_helpers import NO_WHITESPACE, only_sampling_reasons
from conftest import MODEL_NAME, fetch_record

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED_TOOL = {
    "tools": TOOLS,
    "tool_choice": "required",
    "max_tokens": 120,
    "temperature": 0,
    "logit_bias": NO_WHITESPACE,
}


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


def truth(direct: openai.OpenAI, **kwargs) -> dict:
    """vLLM's own reply, with token ids and log-probs."""
    extra = {"return_token_ids": True, **kwargs.pop("extra_body", {})}
    kwargs.setdefault("logprobs", True)
    return direct.chat.completions.create(model=MODEL_NAME, extra_body=extra, **kwargs).model_dump()


def assert_recorded(record: dict, prompt_ids: list[int], choice: dict) -> None:
    assert record["status"] == "complete" and only_sampling_reasons(record), record[
        "ineligible_reasons"
    ]
    assert record["policy_version"] == 0
    assert record["prompt_token_ids"] == prompt_ids
    assert record["output_token_ids"] == choice["token_ids"]
    np.testing.assert_array_equal(
        np.float32(record["output_logprobs"]),
        np.float32([t["logprob"] for t in choice["logprobs"]["content"]]),
    )


def calls_of(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def test_forced_tool_call_passes_through_and_is_recorded(gw, direct, admin_http):
    reply = gw.chat.completions.create(model=MODEL_NAME, messages=QUESTION, **FORCED_TOOL)
    expected = truth(direct, messages=QUESTION, **FORCED_TOOL)
    message = reply.choices[0].message
    assert calls_of(message) == [
        (c["function"]["name"], c["function"]["arguments"])
        for c in expected["choices"][0]["message"]["tool_calls"]
    ]
    assert calls_of(message)[0][0] == "get_weather"
    assert reply.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    record = fetch_record(admin_http, reply.id)
    assert_recorded(record, expected["prompt_token_ids"], expected["choices"][0])
    assert record["request"]["tools"] == TOOLS
    assert record["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == (
        "get_weather"
    )


def test_streamed_tool_call_is_recorded_like_the_whole_one(gw, admin_http):
    whole = gw.chat.completions.create(model=MODEL_NAME, messages=QUESTION, **FORCED_TOOL)
    chunks = list(
        gw.chat.completions.create(model=MODEL_NAME, messages=QUESTION, stream=True, **FORCED_TOOL)
    )
    names = [
        c.function.name
        for chunk in chunks
        for choice in chunk.choices
        for c in choice.delta.tool_calls or ()
        if c.function and c.function.name
    ]
    assert names == ["get_weather"]
    a, b = fetch_record(admin_http, whole.id), fetch_record(admin_http, chunks[0].id)
    assert b["status"] == "complete" and b["stream"]
    assert (a["prompt_token_ids"], a["output_token_ids"]) == (
        b["prompt_token_ids"],
        b["output_token_ids"],
    )
    assert b["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == (
        "get_weather"
    )


def test_tool_turns_link_parents_and_retries_keep_the_continued_one(http, direct):
    session = http.post("/v1/sessions", json={}).json()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    first = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, **FORCED_TOOL)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."},
    ]
    ask = {"tools": TOOLS, "max_tokens": 6, "temperature": 0}
    second = client.chat.completions.create(model=MODEL_NAME, messages=history, **ask)
    retry = client.chat.completions.create(model=MODEL_NAME, messages=history, **ask)
    third = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            *history,
            retry.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Thanks."},
        ],
        **ask,
    )
    detail = http.get(f"/v1/sessions/{session['id']}").json()["completions"]
    by_id = {c["id"]: c for c in detail}
    assert by_id[second.id]["parent_id"] == by_id[retry.id]["parent_id"] == first.id
    assert by_id[second.id]["retry_group"] == by_id[retry.id]["retry_group"]
    assert by_id[second.id]["is_orphan"] and not by_id[retry.id]["is_orphan"]
    assert by_id[third.id]["parent_id"] == retry.id and not by_id[first.id]["is_orphan"]
    # The tool turn renders as it does directly.
    expected = truth(direct, messages=history, **ask)
    assert second.choices[0].message.content == expected["choices"][0]["message"]["content"]


def test_n_choices_are_recorded_as_siblings(gw, direct, admin_http):
    ask = {"messages": QUESTION, "n": 3, "max_tokens": 6, "temperature": 1.0, "seed": 7}
    raw = gw.chat.completions.with_raw_response.create(model=MODEL_NAME, **ask)
    reply = raw.parse()
    expected = truth(direct, **ask)
    ids = [reply.id, f"{reply.id}-1", f"{reply.id}-2"]
    assert [c.completion_id for c in reply.choices] == ids  # the per-choice extension field
    assert raw.headers["X-Completion-Ids"] == ",".join(ids)
    assert [c.message.content for c in reply.choices] == [
        c["message"]["content"] for c in expected["choices"]
    ]
    for index, record_id in enumerate(ids):
        record = fetch_record(admin_http, record_id)
        assert_recorded(record, expected["prompt_token_ids"], expected["choices"][index])
        assert record["sibling_group"] == reply.id
        assert [c["index"] for c in record["response"]["choices"]] == [index]
        assert record["session_id"] == f"auto-{reply.id}"


def test_streamed_n_choices_with_usage(gw, admin_http):
    ask = {"messages": QUESTION, "n": 2, "max_tokens": 5, "temperature": 1.0, "seed": 11}
    whole = gw.chat.completions.create(model=MODEL_NAME, **ask)
    chunks = list(
        gw.chat.completions.create(
            model=MODEL_NAME, stream=True, stream_options={"include_usage": True}, **ask
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    base = chunks[0].id
    seen = {c.index: c.completion_id for chunk in chunks for c in chunk.choices}
    assert seen == {0: base, 1: f"{base}-1"}
    for index in (0, 1):
        a = fetch_record(admin_http, whole.choices[index].completion_id)
        b = fetch_record(admin_http, seen[index])
        assert b["status"] == "complete" and b["eligible"] and b["sibling_group"] == base
        assert a["output_token_ids"] == b["output_token_ids"] and len(b["output_token_ids"]) == 5
        assert b["response"]["usage"]["completion_tokens"] == 10


def test_siblings_are_not_retries_and_rewards_name_any_sibling(http):
    session = http.post("/v1/sessions", json={"sibling_normalization": "mean"}).json()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    ask = {"messages": QUESTION, "n": 3, "max_tokens": 4, "temperature": 1.0}
    first = client.chat.completions.create(model=MODEL_NAME, **ask)
    again = client.chat.completions.create(model=MODEL_NAME, **ask)  # a retry of the request
    chosen = first.choices[2]
    follow = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[*QUESTION, chosen.message.model_dump(exclude_none=True)],
        max_tokens=4,
    )
    detail = {c["id"]: c for c in http.get(f"/v1/sessions/{session['id']}").json()["completions"]}
    kept = [c.completion_id for c in first.choices]
    superseded = [c.completion_id for c in again.choices]
    assert all(not detail[i]["is_orphan"] for i in kept)  # siblings do not supersede each other
    assert all(detail[i]["is_orphan"] for i in superseded)  # the retry, continued from none
    assert {detail[i]["retry_group"] for i in kept + superseded} == {detail[kept[0]]["retry_group"]}
    assert detail[follow.id]["parent_id"] == chosen.completion_id
    for value, completion_id in zip((1.0, 0.0, 2.0), kept, strict=True):
        reply = http.post(
            f"/v1/sessions/{session['id']}/rewards",
            json={"value": value, "completion_id": completion_id},
        )
        assert reply.status_code == 201, reply.text
    refused = http.post(
        f"/v1/sessions/{session['id']}/rewards",
        json={"value": 1.0, "completion_id": superseded[0]},
    )
    assert refused.status_code == 409
    trajectory = http.get(f"/v1/sessions/{session['id']}/trajectory").json()
    assert trajectory["sibling_normalization"] == "mean"
    (group,) = trajectory["sibling_groups"]
    assert group["id"] == first.id and group["completion_ids"] == kept
    assert group["status"] == "ready"
    assert group["normalized"] == pytest.approx(dict(zip(kept, (0.0, -1.0, 1.0), strict=True)))
    steps = {s["completion_id"]: s for s in trajectory["steps"]}
    assert steps[kept[1]]["sibling_group"] == first.id and steps[follow.id]["sibling_group"] is None
    # Each step carries what it is trained with: siblings their normalized reward, the others
    # the session's return (here the sum of the sibling rewards: no group).
    assert [steps[i]["reward_normalized"] for i in kept] == pytest.approx([0.0, -1.0, 1.0])
    assert steps[follow.id]["reward_raw"] is None
    assert steps[follow.id]["reward_normalized"] == trajectory["return_normalized"] == 3.0


def test_a_session_reward_after_several_choices_must_name_one(http):
    """A "final completion" is ambiguous when the last request asked for n > 1 and nothing went on
    from any choice: the reward is refused (409) rather than landing on an arbitrary sibling."""
    session = http.post("/v1/sessions", json={}).json()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, n=2, max_tokens=4, temperature=1.0
    )
    choices = [c.completion_id for c in reply.choices]
    rewards = f"/v1/sessions/{session['id']}/rewards"
    refused = http.post(rewards, json={"value": 1.0})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "ambiguous_final_completion" and error["param"] == "completion_id"
    assert all(c in error["message"] for c in choices)
    assert http.get(f"/v1/sessions/{session['id']}").json()["rewards"] == []
    named = http.post(rewards, json={"value": 1.0, "completion_id": choices[1]})
    assert named.status_code == 201 and named.json()["completion_id"] == choices[1]
    follow = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[*QUESTION, reply.choices[0].message.model_dump(exclude_none=True)],
        max_tokens=4,
    )
    final = http.post(rewards, json={"value": 0.5})  # the conversation went on: one final
    assert final.status_code == 201 and final.json()["completion_id"] == follow.id


SAMPLING = {
    "stop": {"stop": ["a", "e"], "max_tokens": 24, "temperature": 0},
    "seed": {"seed": 1234, "temperature": 1.0, "max_tokens": 8},
    "logit_bias": {"logit_bias": {"10": -100, "9": 5}, "max_tokens": 6, "temperature": 0},
    "top_logprobs": {"top_logprobs": 3, "max_tokens": 4, "temperature": 0},
    "response_format": {"response_format": {"type": "json_object"}, "max_tokens": 12},
    "vllm_extensions": {"max_tokens": 6, "extra_body": {"top_k": 1, "min_tokens": 6}},
}


@pytest.mark.parametrize("fields", SAMPLING.values(), ids=SAMPLING.keys())
def test_sampling_fields_pass_through(gw, direct, admin_http, fields):
    fields = dict(fields)
    fields.setdefault("temperature", 0)
    reply = gw.chat.completions.create(model=MODEL_NAME, messages=QUESTION, logprobs=True, **fields)
    expected = truth(direct, messages=QUESTION, **fields)
    got, want = reply.choices[0], expected["choices"][0]
    assert got.message.content == want["message"]["content"]
    assert got.finish_reason == want["finish_reason"]
    assert reply.usage.completion_tokens == expected["usage"]["completion_tokens"]
    assert got.logprobs.model_dump()["content"] == want["logprobs"]["content"]
    assert_recorded(fetch_record(admin_http, reply.id), expected["prompt_token_ids"], want)


def test_stream_with_usage_and_top_logprobs_matches_direct(gw, direct):
    ask = {
        "messages": QUESTION,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def essence(chunks) -> tuple:
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        tops = [
            [t.model_dump() for t in entry.top_logprobs]
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for entry in c.choices[0].logprobs.content or ()
        ]
        return text, tops, chunks[-1].usage.model_dump()

    via = list(gw.chat.completions.create(model=MODEL_NAME, **ask))
    want = list(direct.chat.completions.create(model=MODEL_NAME, **ask))
    assert essence(via) == essence(want)
    assert len(essence(via)[1]) == 6 and all(len(t) == 2 for t in essence(via)[1])


@pytest.mark.parametrize(
    "extra",
    [
        {"frobnicate": 1},
        {"temperature": "hot"},
        {"tool_choice": "required"},
        {"n": 2, "best_of": 1},
    ],
    ids=["unknown-field", "bad-type", "tool-choice-without-tools", "best-of"],
)
def test_other_fields_are_treated_as_the_backend_treats_them(http, vllm_url, extra):
    body = {"model": MODEL_NAME, "messages": QUESTION, "max_tokens": 2, **extra}
    via = http.post("/v1/chat/completions", json=body)
    want = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=60)
    assert via.status_code == want.status_code, (via.text, want.text)
    if want.status_code != 200:
        assert via.json()["error"]["message"] == want.json()["error"]["message"]
