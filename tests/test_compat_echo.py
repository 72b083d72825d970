"""`echo` on /v1/completions is served as vLLM serves it (the prompt's text and log-probs first,
then the completion), in the request shape lm-evaluation-harness's `local-completions` sends;
the record keeps the prompt's tokens and the output's apart."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest

from rlgw.eligibility import ECHO_ONLY
from rlgw.sampling import sampling_problems

from compat_helpers import only_sampling_reasons
from conftest import MODEL_NAME, fetch_record

PROMPT = "The capital of France is"
# What lm-evaluation-harness's `local-completions` sends to score a continuation (loglikelihood).
LM_EVAL = {"echo": True, "max_tokens": 1, "logprobs": 1, "temperature": 0, "seed": 1234}


@pytest.fixture(scope="module")
def gw(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def vllm(vllm_url: str):
    with httpx.Client(base_url=vllm_url, timeout=120) as client:
        yield client


def post(client: httpx.Client, body: dict) -> dict:
    reply = client.post("/v1/completions", json={"model": MODEL_NAME, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def seen(reply: dict) -> list[dict]:
    """What a client reads of each choice (ids and timestamps differ between servers)."""
    keys = ("index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs")
    return [{k: c.get(k) for k in keys} for c in reply["choices"]]


def assert_served_as_vllm(ours: dict, theirs: dict) -> None:
    assert seen(ours) == seen(theirs)
    assert ours["usage"] == theirs["usage"]


def token_truth(vllm: httpx.Client, body: dict) -> dict:
    """vLLM's own reply with the token ids (the record's ground truth)."""
    return post(vllm, {**body, "return_token_ids": True})


def assert_recorded_apart(record: dict, truth_choice: dict) -> None:
    """Prompt ids are the prompt's, output ids the output's, one log-prob per output token: the
    echoed entries (one per prompt token) left out."""
    prompt_ids, output_ids = truth_choice["prompt_token_ids"], truth_choice["token_ids"]
    token_logprobs = truth_choice["logprobs"]["token_logprobs"]
    assert len(token_logprobs) == len(prompt_ids) + len(output_ids)
    assert record["prompt_token_ids"] == prompt_ids
    assert record["output_token_ids"] == output_ids
    np.testing.assert_array_equal(
        np.float32(record["output_logprobs"]), np.float32(token_logprobs[len(prompt_ids) :])
    )
    assert record["status"] == "complete"
    assert only_sampling_reasons(record), record["ineligible_reasons"]


def test_the_official_client_gets_the_echoed_prompt_and_its_log_probs(gw, vllm, admin_http):
    reply = gw.completions.create(model=MODEL_NAME, prompt=PROMPT, **LM_EVAL)
    direct = post(vllm, {"prompt": PROMPT, **LM_EVAL})

    assert_served_as_vllm(reply.model_dump(), direct)
    choice = reply.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert choice.logprobs.token_logprobs[0] is None  # the first prompt token has none
    assert choice.logprobs.token_logprobs == direct["choices"][0]["logprobs"]["token_logprobs"]
    truth = token_truth(vllm, {"prompt": PROMPT, **LM_EVAL})["choices"][0]
    assert_recorded_apart(fetch_record(admin_http, reply.id), truth)


@pytest.mark.parametrize("batch_of_one", [False, True], ids=["ids", "batch-of-one-ids"])
def test_lm_eval_harness_request_with_token_ids_is_served_as_vllm(
    http, vllm, admin_http, tokenizer, batch_of_one
):
    ids = tokenizer(PROMPT + " Paris")["input_ids"]
    body = {"prompt": [ids] if batch_of_one else ids, **LM_EVAL}
    ours = post(http, body)
    theirs = post(vllm, body)

    assert_served_as_vllm(ours, theirs)
    # How lm-eval reads it: the continuation's log-probs after the context, the last one dropped.
    token_logprobs = ours["choices"][0]["logprobs"]["token_logprobs"]
    assert len(token_logprobs) == len(ids) + 1
    assert ours["choices"][0]["text"].startswith(tokenizer.decode(ids))
    truth = token_truth(vllm, body)["choices"][0]
    assert truth["prompt_token_ids"] == ids
    assert_recorded_apart(fetch_record(admin_http, ours["id"]), truth)


def test_max_tokens_zero_scores_the_prompt_and_is_never_trained_on(http, vllm, admin_http):
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1, "temperature": 0}
    ours = post(http, body)
    assert_served_as_vllm(ours, post(vllm, body))
    assert ours["choices"][0]["text"] == PROMPT

    record = fetch_record(admin_http, ours["id"])
    truth = token_truth(vllm, body)["choices"][0]
    assert record["prompt_token_ids"] == truth["prompt_token_ids"]
    assert record["output_token_ids"] == [] and record["output_logprobs"] == []
    # and greedy: the sampling reason its settings give (rlgw/sampling.py)
    assert record["ineligible_reasons"] == [ECHO_ONLY, *sampling_problems(record["sampling"])]
    assert record["sampling"]["temperature"] == 0.0


def test_echo_without_logprobs_shows_none(http, vllm, admin_http):
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 3, "temperature": 0}
    ours = post(http, body)
    assert_served_as_vllm(ours, post(vllm, body))
    assert ours["choices"][0]["logprobs"] is None
    truth = token_truth(vllm, {**body, "logprobs": 0})["choices"][0]
    assert_recorded_apart(fetch_record(admin_http, ours["id"]), truth)


def test_each_of_n_echoed_choices_is_recorded_apart(http, vllm, admin_http):
    body = {"prompt": PROMPT, "echo": True, "n": 2, "max_tokens": 4, "logprobs": 1, "seed": 7}
    ours = post(http, {**body, "return_token_ids": True})
    assert len(ours["choices"]) == 2
    for choice in ours["choices"]:
        assert choice["text"].startswith(PROMPT)
        assert_recorded_apart(fetch_record(admin_http, choice["completion_id"]), choice)


def test_a_streamed_echo_is_what_vllm_streams_and_is_recorded_apart(http, vllm, admin_http):
    body = {"prompt": PROMPT, "stream": True, **LM_EVAL, "max_tokens": 4}

    def stream(client: httpx.Client) -> list[dict]:
        with client.stream("POST", "/v1/completions", json={"model": MODEL_NAME, **body}) as r:
            assert r.status_code == 200, r.read()
            lines = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "[DONE]"
        return [json.loads(line) for line in lines[:-1]]

    def whole(chunks: list[dict]) -> dict:
        """The stream joined (how many tokens one chunk carries depends on timing)."""
        choices = [c["choices"][0] for c in chunks if c.get("choices")]
        joined: dict = {"text": "".join(c["text"] for c in choices)}
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            joined[key] = [v for c in choices for v in c["logprobs"][key]]
        joined["finish_reason"] = choices[-1]["finish_reason"]
        return joined

    ours, theirs = stream(http), stream(vllm)
    assert whole(ours) == whole(theirs)
    assert ours[0]["choices"][0]["text"].startswith(PROMPT)

    truth = token_truth(vllm, {**body, "stream": False})["choices"][0]
    assert_recorded_apart(fetch_record(admin_http, ours[0]["id"]), truth)


def test_a_batch_of_prompts_is_refused_with_the_reason(http):
    reply = http.post(
        "/v1/completions",
        json={"model": MODEL_NAME, "prompt": [PROMPT, "Another"], **LM_EVAL},
    )
    assert reply.status_code == 400, reply.text
    assert "one prompt per request" in reply.json()["error"]["message"]


def test_echo_with_truncation_is_refused_with_the_reason(http):
    reply = http.post(
        "/v1/completions",
        json={"model": MODEL_NAME, "prompt": PROMPT, "truncate_prompt_tokens": 2, **LM_EVAL},
    )
    assert reply.status_code == 400, reply.text
    assert "truncate_prompt_tokens" in reply.json()["error"]["message"]


def test_echo_on_chat_completions_is_refused_with_the_reason(http):
    reply = http.post(
        "/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}], "echo": True},
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "echo is not supported on chat completions" in error["message"]
    assert error["type"] == "invalid_request_error"


def test_max_tokens_zero_without_echo_is_refused_as_vllm_refuses_it(http, vllm):
    """Refused by the gateway itself (before anything is recorded), with vLLM's status."""
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 0}
    ours = http.post("/v1/completions", json=body)
    theirs = vllm.post("/v1/completions", json=body)
    assert 400 <= ours.status_code < 500 and ours.status_code == theirs.status_code, ours.text
    error = ours.json()["error"]
    assert "max_tokens 0 is allowed only with echo" in error["message"]
    assert error["type"] == "invalid_request_error"


def test_an_out_of_vocabulary_token_id_is_refused_as_vllm_refuses_it_and_recorded(
    http, vllm, admin_http
):
    body = {"model": MODEL_NAME, "prompt": [10**7], **LM_EVAL}
    ours, theirs = http.post("/v1/completions", json=body), vllm.post("/v1/completions", json=body)
    assert 400 <= ours.status_code < 500 and ours.status_code == theirs.status_code, ours.text
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
    record = fetch_record(admin_http, ours.headers["X-Completion-Id"])
    assert record["status"] == "error" and "out of vocabulary" in record["status_reason"]
