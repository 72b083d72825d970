"""Retries form one group; the attempt the conversation continued from is kept, the rest are
orphans, absent from the export; the export equals the client's transcript token for token."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from conftest import MODEL_NAME

QUESTION = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=120) as client:
        yield client


def new_session(http: httpx.Client) -> dict:
    return http.post("/v1/sessions", json={}).json()


def wait_for_completions(http: httpx.Client, session_id: str, count: int) -> dict[str, dict]:
    """The session's completions by id, once `count` are recorded (a hang-up is recorded async:
    when the gateway notices it and the backend's generation stops, seconds on a loaded machine;
    the wait ends as soon as they are all there)."""
    deadline = time.monotonic() + 120
    while True:
        completions = http.get(f"/v1/sessions/{session_id}").json()["completions"]
        if len(completions) >= count or time.monotonic() > deadline:
            return {c["id"]: c for c in completions}
        time.sleep(0.1)


def ask(base_url: str, messages: list[dict], timeout: float = 120, **kwargs):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout)
    kwargs.setdefault("max_tokens", 12)
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        logprobs=True,
        extra_body={"return_token_ids": True, **kwargs.pop("extra_body", {})},
        **kwargs,
    )


def as_message(reply) -> dict:
    return reply.choices[0].message.model_dump(exclude_none=True)  # what agents send back


def transcript_step(reply) -> dict:
    """What the client received, in the export's terms."""
    dumped = reply.model_dump()
    return {
        "completion_id": reply.id,
        "prompt_token_ids": dumped["prompt_token_ids"],
        "output_token_ids": dumped["choices"][0]["token_ids"],
        "output_logprobs": [t.logprob for t in reply.choices[0].logprobs.content],
    }


def export(http: httpx.Client, session_id: str) -> dict:
    reply = http.get(f"/v1/sessions/{session_id}/trajectory")
    assert reply.status_code == 200, reply.text
    return reply.json()


def exported_steps(trajectory: dict) -> list[dict]:
    keys = ("completion_id", "prompt_token_ids", "output_token_ids", "output_logprobs")
    return [{k: step[k] for k in keys} for step in trajectory["steps"]]


def assert_same_transcript(trajectory: dict, replies: list) -> None:
    got, want = exported_steps(trajectory), [transcript_step(r) for r in replies]
    assert [s["completion_id"] for s in got] == [s["completion_id"] for s in want]
    for g, w in zip(got, want, strict=True):
        assert g["prompt_token_ids"] == w["prompt_token_ids"]
        assert g["output_token_ids"] == w["output_token_ids"]
        # float32 storage: the log-prob vLLM computed in float32, exactly
        assert g["output_logprobs"] == pytest.approx(w["output_logprobs"], rel=0, abs=1e-6)


def test_timed_out_attempt_is_orphaned_when_the_retry_is_continued(http, gateway_url):
    session = new_session(http)
    base = session["base_url"]
    long_question = [{"role": "user", "content": "Tell me everything."}]
    long_answer = {"max_tokens": 800, "extra_body": {"ignore_eos": True}}  # well over 0.2 s
    # Attempt 1: the agent gives up waiting (a client-side timeout), then sends the same again.
    with pytest.raises(openai.APITimeoutError):
        ask(base, long_question, timeout=0.2, **long_answer)
    second = ask(base, long_question, **long_answer)
    third = ask(base, [*long_question, as_message(second), {"role": "user", "content": "More."}])

    by_id = wait_for_completions(http, session["id"], 3)
    (first_id,) = set(by_id) - {second.id, third.id}
    assert by_id[first_id]["status"] == "incomplete"
    assert by_id[first_id]["is_orphan"] and "superseded" in by_id[first_id]["orphan_reason"]
    assert by_id[first_id]["retry_group"] == by_id[second.id]["retry_group"]
    assert not by_id[second.id]["is_orphan"] and not by_id[third.id]["is_orphan"]
    assert by_id[third.id]["parent_id"] == second.id

    trajectory = export(http, session["id"])
    assert first_id not in {s["completion_id"] for s in trajectory["steps"]}
    assert [e["completion_id"] for e in trajectory["excluded"]] == [first_id]
    assert_same_transcript(trajectory, [second, third])


def test_two_retries_neither_continued_keeps_only_the_last(http):
    session = new_session(http)
    first = ask(session["base_url"], QUESTION, temperature=1.0)
    second = ask(session["base_url"], QUESTION, temperature=1.0)
    trajectory = export(http, session["id"])
    assert [s["completion_id"] for s in trajectory["steps"]] == [second.id]
    assert [e["completion_id"] for e in trajectory["excluded"]] == [first.id]


def test_a_reward_whose_completion_became_an_orphan_stops_counting(http):
    """Rewarded while it was the kept attempt, then superseded by a retry: the reward is kept
    (nothing is deleted) but no longer counts, and a replay of its key says so."""
    session = new_session(http)
    first = ask(session["base_url"], QUESTION, temperature=1.0)
    rewards = f"/v1/sessions/{session['id']}/rewards"
    key = {"Idempotency-Key": "episode-end"}
    stored = http.post(rewards, json={"value": 1.0, "completion_id": first.id}, headers=key)
    assert stored.status_code == 201 and stored.json()["counts"] is True
    second = ask(session["base_url"], QUESTION, temperature=1.0)  # the retry supersedes it
    replay = http.post(rewards, json={"value": 1.0, "completion_id": first.id}, headers=key)
    assert replay.status_code == 200 and replay.json()["id"] == stored.json()["id"]
    assert replay.json()["counts"] is False
    trajectory = export(http, session["id"])
    assert [s["completion_id"] for s in trajectory["steps"]] == [second.id]
    assert trajectory["return_raw"] is None  # the only reward is on an orphan


def test_continuing_an_earlier_attempt_keeps_it_over_a_later_one(http):
    session = new_session(http)
    base = session["base_url"]
    early = ask(base, QUESTION, temperature=1.0)
    late = ask(base, QUESTION, temperature=1.0)
    follow = ask(base, [*QUESTION, as_message(early), {"role": "user", "content": "Why?"}])
    trajectory = export(http, session["id"])
    assert_same_transcript(trajectory, [early, follow])
    assert [e["completion_id"] for e in trajectory["excluded"]] == [late.id]


def test_same_idempotency_key_groups_requests_with_different_bodies(http):
    session = new_session(http)
    client = openai.OpenAI(
        base_url=session["base_url"],
        api_key="unused",
        default_headers={"Idempotency-Key": "turn-1"},
    )
    a = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=4)
    b = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=6)
    detail = {c["id"]: c for c in http.get(f"/v1/sessions/{session['id']}").json()["completions"]}
    assert detail[a.id]["retry_group"] == detail[b.id]["retry_group"]
    assert detail[a.id]["is_orphan"] and not detail[b.id]["is_orphan"]


def test_reward_naming_an_orphan_is_409_with_an_explanation_and_changes_nothing(http):
    session = new_session(http)
    orphan = ask(session["base_url"], QUESTION)
    kept = ask(session["base_url"], QUESTION)
    url = f"/v1/sessions/{session['id']}/rewards"
    stored = http.post(url, json={"value": 0.5, "completion_id": kept.id})
    assert stored.status_code == 201, stored.text
    before = http.get(f"/v1/sessions/{session['id']}").json()
    flags = {c["id"]: c["is_orphan"] for c in before["completions"]}
    assert flags == {orphan.id: True, kept.id: False}
    trajectory_before = export(http, session["id"])

    for headers in ({}, {"Idempotency-Key": "orphan-reward"}):
        reply = http.post(url, json={"value": 1.0, "completion_id": orphan.id}, headers=headers)
        assert reply.status_code == 409
        error = reply.json()["error"]
        assert error["code"] == "completion_is_orphan" and "retry" in error["message"]

    after = http.get(f"/v1/sessions/{session['id']}").json()
    assert after["rewards"] == before["rewards"] == [stored.json()]  # the kept one's, untouched
    assert {c["id"]: c["is_orphan"] for c in after["completions"]} == flags
    assert after["completions"] == before["completions"]  # lineage, orphan reasons, eligibility
    trajectory_after = export(http, session["id"])
    assert trajectory_after == trajectory_before
    assert trajectory_after["return_raw"] == 0.5
    assert [s["completion_id"] for s in trajectory_after["steps"]] == [kept.id]


def test_stream_turns_link_like_plain_ones(http):
    session = new_session(http)
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused")
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=QUESTION, max_tokens=8, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    follow = ask(
        session["base_url"],
        [*QUESTION, {"role": "assistant", "content": text}, {"role": "user", "content": "And?"}],
    )
    detail = {c["id"]: c for c in http.get(f"/v1/sessions/{session['id']}").json()["completions"]}
    assert detail[follow.id]["parent_id"] == chunks[0].id
