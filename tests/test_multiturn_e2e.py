"""Multi-turn sessions through the gateway (the OpenAI client, a real vLLM CPU server of the
byte-level ChatML model, real Postgres): the training view joins the turns whose recorded prompts
extend the last turn's prompt and output into one sequence, with a tool result and a user turn as
context between them, and cuts where the record shows otherwise: a branch of a request with n = 2,
an edited history. A retry's superseded attempt is in no sequence; the kept one takes its place.

The answers that later turns resend are drawn from lowercase letters (`allowed_token_ids`): a
byte-level token is one byte, so such an answer re-renders to the very ids it was generated as
(with other bytes a multi-byte character can render otherwise: that is a cut, tested in
tests/unit/test_sequences.py). Those turns are ineligible (allowed_token_ids), so they are context;
the free last turn carries the loss."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from conftest import MODEL_NAME, fetch_record

LETTERS = list(range(ord("a"), ord("z") + 1))  # the byte model's ids are the UTF-8 bytes
SYSTEM = {"role": "system", "content": "Answer in one word."}


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def gw(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)


def new_session(http: httpx.Client) -> str:
    sid = f"multiturn-{uuid.uuid4().hex[:12]}"
    assert http.post("/v1/sessions", json={"id": sid}).status_code == 201
    return sid


def chat(gw: openai.OpenAI, sid: str, messages: list, *, letters: bool = True, **kw):
    extra = {"allowed_token_ids": LETTERS} if letters else {}
    return gw.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        max_tokens=kw.pop("max_tokens", 4),
        seed=kw.pop("seed", 3),
        extra_body=extra,
        extra_headers={"X-Session-Id": sid},
        **kw,
    )


def training_view(http: httpx.Client, sid: str) -> dict:
    assert http.post(f"/v1/sessions/{sid}/rewards", json={"value": 1.0}).status_code == 201
    reply = http.get(f"/v1/sessions/{sid}/trajectory", params={"view": "training"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def turn_ids(view: dict) -> list[list[str]]:
    return [[t["completion_id"] for t in s["turns"]] for s in view["sequences"]]


def test_turns_that_extend_each_other_are_one_sequence_with_loss_on_the_free_turn(
    gw, http, admin_http
):
    sid = new_session(http)
    messages = [SYSTEM, {"role": "user", "content": "Pick a fruit."}]
    a = chat(gw, sid, messages)
    messages += [
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "tool", "tool_call_id": "call_0", "content": "stock: 42"},
    ]
    b = chat(gw, sid, messages)
    messages += [
        {"role": "assistant", "content": b.choices[0].message.content},
        {"role": "user", "content": "And a colour?"},
    ]
    c = chat(gw, sid, messages, letters=False, max_tokens=6, temperature=1.0)
    view = training_view(http, sid)

    (sequence,) = view["sequences"]
    assert turn_ids(view) == [[a.id, b.id, c.id]] and sequence["cuts"] == []
    last = fetch_record(admin_http, c.id)
    assert sequence["token_ids"] == last["prompt_token_ids"] + last["output_token_ids"]
    trained = [t for t, m in zip(sequence["token_ids"], sequence["loss_mask"], strict=True) if m]
    assert trained == last["output_token_ids"]
    a_turn, b_turn, c_turn = sequence["turns"]
    assert not a_turn["trained"] and "allowed_token_ids" in a_turn["reason"]
    assert c_turn["trained"] and sequence["trains"]
    # the tool result sits between a's output and b's output, as context
    tool_bytes = list(b"stock: 42")
    between = sequence["token_ids"][a_turn["end"] : b_turn["start"]]
    assert any(between[i : i + len(tool_bytes)] == tool_bytes for i in range(len(between)))
    assert all(m == 0 for m in sequence["loss_mask"][a_turn["end"] : b_turn["start"]])


def test_a_branch_an_edited_history_and_a_retry(gw, http):
    sid = new_session(http)
    question = {"role": "user", "content": "Pick a fruit."}
    pair = chat(gw, sid, [SYSTEM, question], n=2, seed=None)
    chosen = pair.choices[1].message.content
    follow_up = [
        SYSTEM,
        question,
        {"role": "assistant", "content": chosen},
        {"role": "user", "content": "Why?"},
    ]
    superseded = chat(gw, sid, follow_up, letters=False)
    kept = chat(gw, sid, follow_up, letters=False)  # the same request again: a retry
    edited = [SYSTEM, {"role": "user", "content": "Pick a vegetable."}, *follow_up[2:]]
    redo = chat(gw, sid, edited, letters=False)
    view = training_view(http, sid)

    ids = turn_ids(view)
    every = [c for s in ids for c in s]
    assert superseded.id not in every and kept.id in every  # the orphan is in no sequence
    chosen_id, other_id = f"{pair.id}-1", pair.id  # choice 1's record id, choice 0's
    host = next(s for s in ids if kept.id in s)
    assert len(host) == 2 and host[1] == kept.id
    if pair.choices[0].message.content != chosen:  # equal answers: either extends as well
        assert host[0] == chosen_id  # the choice the conversation went on with
    starts = {s["turns"][0]["completion_id"]: s["cuts"] for s in view["sequences"]}
    # the siblings share a prompt: whichever the record lists second branches from the first
    reasons = [c["reason"] for c in starts[chosen_id] + starts[other_id]]
    assert reasons == ["branch"]
    assert [redo.id] in ids and [c["reason"] for c in starts[redo.id]] == ["history_edited"]
