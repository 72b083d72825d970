"""The proxy records every completion token-exact: what vLLM produced is what Postgres holds."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from compat_helpers import only_sampling_reasons
from conftest import MODEL_NAME, fetch_record

MESSAGES = [{"role": "user", "content": "Say something about gateways."}]


@pytest.fixture(scope="module")
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused")


@pytest.fixture(scope="module")
def direct(vllm_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vllm_url}/v1", api_key="unused")


def direct_chat(direct: openai.OpenAI, **kwargs) -> dict:
    reply = direct.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        logprobs=True,
        extra_body={"return_token_ids": True},
        **kwargs,
    )
    return reply.model_dump()


def as_f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def test_chat_record_matches_what_vllm_returned(client, direct, admin_http, tokenizer):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=24, temperature=0
    )
    record = fetch_record(admin_http, reply.id)
    truth = direct_chat(direct, max_tokens=24, temperature=0)
    choice = truth["choices"][0]

    assert record["status"] == "complete" and only_sampling_reasons(record), record[
        "ineligible_reasons"
    ]
    assert record["prompt_token_ids"] == truth["prompt_token_ids"]
    assert record["output_token_ids"] == choice["token_ids"]
    np.testing.assert_array_equal(
        as_f32(record["output_logprobs"]),
        as_f32([t["logprob"] for t in choice["logprobs"]["content"]]),
    )
    assert record["policy_version"] == 0
    assert record["finish_reason"] == reply.choices[0].finish_reason
    assert tokenizer.decode(record["output_token_ids"], skip_special_tokens=True) == (
        reply.choices[0].message.content
    )


def test_prompt_ids_are_the_chat_template_rendering(client, admin_http, tokenizer):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
    record = fetch_record(admin_http, reply.id)
    expected = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert record["prompt_token_ids"] == list(expected)


def test_stream_and_non_stream_records_are_identical(client, admin_http, tokenizer):
    plain = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=32, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=32, temperature=0, stream=True
        )
    )
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert {c.id for c in chunks} == {chunks[0].id}

    a, b = fetch_record(admin_http, plain.id), fetch_record(admin_http, chunks[0].id)
    assert b["stream"] and not a["stream"]
    assert b["status"] == "complete" and only_sampling_reasons(b), b["ineligible_reasons"]
    assert a["prompt_token_ids"] == b["prompt_token_ids"]
    assert a["output_token_ids"] == b["output_token_ids"]
    np.testing.assert_array_equal(as_f32(a["output_logprobs"]), as_f32(b["output_logprobs"]))
    assert tokenizer.decode(b["output_token_ids"], skip_special_tokens=True) == streamed_text
    assert b["response"]["choices"][0]["message"]["content"] == streamed_text
    assert b["ttft_ms"] is not None and b["ttft_ms"] <= b["latency_ms"]


def test_stream_record_matches_what_vllm_streamed(client, direct, admin_http):
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0, stream=True
        )
    )
    record = fetch_record(admin_http, chunks[0].id)
    raw = [
        c.model_dump()
        for c in direct.chat.completions.create(
            model=MODEL_NAME,
            messages=MESSAGES,
            max_tokens=20,
            temperature=0,
            stream=True,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
    ]
    ids = [t for c in raw for ch in c["choices"] for t in (ch.get("token_ids") or [])]
    lps = [
        e["logprob"]
        for c in raw
        for ch in c["choices"]
        for e in ((ch.get("logprobs") or {}).get("content") or [])
    ]
    prompt = next(c["prompt_token_ids"] for c in raw if c.get("prompt_token_ids"))
    assert record["prompt_token_ids"] == prompt
    assert record["output_token_ids"] == ids
    np.testing.assert_array_equal(as_f32(record["output_logprobs"]), as_f32(lps))


def test_extras_are_hidden_unless_the_client_asks(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
    dumped = reply.model_dump()
    assert reply.choices[0].logprobs is None
    assert "prompt_token_ids" not in dumped or dumped["prompt_token_ids"] is None
    assert not dumped["choices"][0].get("token_ids")


def test_extras_the_client_asks_for_equal_the_record(client, admin_http):
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=8,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    record = fetch_record(admin_http, reply.id)
    dumped = reply.model_dump()
    assert dumped["prompt_token_ids"] == record["prompt_token_ids"]
    assert dumped["choices"][0]["token_ids"] == record["output_token_ids"]
    np.testing.assert_array_equal(
        as_f32([t.logprob for t in reply.choices[0].logprobs.content]),
        as_f32(record["output_logprobs"]),
    )


@pytest.mark.parametrize("stream", [False, True])
def test_completions_with_token_prompt_are_recorded(client, admin_http, tokenizer, stream):
    prompt = tokenizer.encode("Once upon a time")
    if stream:
        chunks = list(
            client.completions.create(
                model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True
            )
        )
        reply_id, text = chunks[0].id, "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        reply = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0
        )
        reply_id, text = reply.id, reply.choices[0].text
    record = fetch_record(admin_http, reply_id)
    assert record["api"] == "completions"
    assert record["status"] == "complete" and only_sampling_reasons(record), record[
        "ineligible_reasons"
    ]
    assert record["prompt_token_ids"] == prompt
    assert len(record["output_logprobs"]) == len(record["output_token_ids"]) > 0
    assert tokenizer.decode(record["output_token_ids"], skip_special_tokens=True) == text


async def test_async_client_stream_and_non_stream(gateway_url, admin_http):
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused")
    reply = await client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8)
    stream = await client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=8, stream=True
    )
    chunk_ids = {chunk.id async for chunk in stream}
    await client.close()
    assert fetch_record(admin_http, reply.id)["status"] == "complete"
    (stream_id,) = chunk_ids
    assert fetch_record(admin_http, stream_id)["status"] == "complete"


def test_models_lists_the_registered_model(client):
    assert MODEL_NAME in [m.id for m in client.models.list()]
