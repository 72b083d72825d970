"""Bad input gets a 4xx in the OpenAI error envelope, never a 500, and records nothing complete."""

from __future__ import annotations

import httpx
import openai
import pytest

from conftest import MODEL_NAME


def assert_envelope(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert "Traceback" not in reply.text
    return error


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"model": MODEL_NAME},
        {"model": MODEL_NAME, "messages": []},
        {"model": MODEL_NAME, "messages": "hello"},
        {"model": MODEL_NAME, "messages": [{"content": "no role"}]},
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "n": 0},
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "top_logprobs": -1},
        {"model": 7, "messages": [{"role": "user", "content": "x"}]},
    ],
    ids=[
        "empty",
        "no-messages",
        "empty-messages",
        "messages-not-list",
        "no-role",
        "n=0",
        "negative-top-logprobs",
        "model-not-string",
    ],
)
def test_malformed_chat_bodies_get_400(http, body):
    assert_envelope(http.post("/v1/chat/completions", json=body), 400)


def test_invalid_json_gets_400(http):
    reply = http.post(
        "/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert_envelope(reply, 400)


def test_json_that_is_not_an_object_gets_400(http):
    assert_envelope(http.post("/v1/chat/completions", json=[1, 2, 3]), 400)


def test_unknown_model_gets_404_model_not_found(http):
    reply = http.post(
        "/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert assert_envelope(reply, 404)["code"] == "model_not_found"


def test_backend_refusal_is_relayed_as_4xx(http):
    # vLLM refuses a token id outside the vocabulary; the client must see that 4xx, not a 500.
    reply = http.post(
        "/v1/completions", json={"model": MODEL_NAME, "prompt": [10**7], "max_tokens": 4}
    )
    assert 400 <= reply.status_code < 500, reply.text
    assert "error" in reply.json()


def test_oversized_body_gets_413(http):
    huge = "x" * (5 * 1024 * 1024)
    reply = http.post(
        "/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": huge}]},
    )
    assert_envelope(reply, 413)


@pytest.mark.parametrize("prompt", [[58118975328190], [-1], [[2**31]]], ids=str)
def test_token_ids_outside_int32_are_refused_before_the_backend(http, prompt):
    """Ids no vocabulary has and no record can hold: a 400, never a 500 while recording."""
    reply = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt})
    assert_envelope(reply, 400)
    assert "prompt" in reply.json()["error"]["message"] + str(reply.json()["error"]["param"])


def test_the_official_client_raises_bad_request(gateway_url):
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[])
