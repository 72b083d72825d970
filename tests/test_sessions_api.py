"""The session and reward REST API: create, read, close, reward idempotently, refuse bad rewards."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from conftest import MODEL_NAME

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=60) as client:
        yield client


def new_session(http: httpx.Client, **fields) -> dict:
    reply = http.post("/v1/sessions", json=fields)
    assert reply.status_code == 201, reply.text
    return reply.json()


def complete(base_url: str, **kwargs) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, **kwargs
    )


def test_created_session_hands_out_a_working_base_url(http):
    session = new_session(http, task_id="t1", metadata={"k": 1})
    assert session["status"] == "open" and session["task_id"] == "t1"
    reply = complete(session["base_url"])
    detail = http.get(f"/v1/sessions/{session['id']}").json()
    assert [c["id"] for c in detail["completions"]] == [reply.id]
    assert detail["metadata"] == {"k": 1}


def test_a_chosen_id_is_kept_and_cannot_be_taken_twice(http):
    sid = f"mine-{uuid.uuid4().hex}"
    assert new_session(http, id=sid)["id"] == sid
    reply = http.post("/v1/sessions", json={"id": sid})
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "session_exists"


def test_closed_session_refuses_completions_but_accepts_rewards(http):
    session = new_session(http)
    complete(session["base_url"])
    closed = http.post(f"/v1/sessions/{session['id']}/close").json()
    assert closed["status"] == "closed" and closed["closed_at"]
    with pytest.raises(openai.ConflictError):
        complete(session["base_url"])
    assert (
        http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 1.0}).status_code == 201
    )


def test_reward_without_completion_goes_to_the_final_completion(http):
    session = new_session(http)
    complete(session["base_url"])
    last = complete(session["base_url"], temperature=0.5)
    reward = http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 0.5}).json()
    assert reward["completion_id"] == last.id and reward["scope"] == "session"


def test_same_idempotency_key_stores_one_reward(http):
    session = new_session(http)
    complete(session["base_url"])
    url = f"/v1/sessions/{session['id']}/rewards"
    statuses = [
        http.post(url, json={"value": 1.0}, headers={"Idempotency-Key": "k1"}).status_code
        for _ in range(3)
    ]
    assert statuses == [201, 200, 200]
    assert len(http.get(f"/v1/sessions/{session['id']}").json()["rewards"]) == 1


def test_reused_key_with_another_value_is_refused(http):
    session = new_session(http)
    complete(session["base_url"])
    url = f"/v1/sessions/{session['id']}/rewards"
    http.post(url, json={"value": 1.0}, headers={"Idempotency-Key": "k"})
    reply = http.post(url, json={"value": 2.0}, headers={"Idempotency-Key": "k"})
    assert reply.status_code == 409
    rewards = http.get(f"/v1/sessions/{session['id']}").json()["rewards"]
    assert [r["value"] for r in rewards] == [1.0]


def test_without_a_key_two_posts_are_two_rewards(http):
    session = new_session(http)
    complete(session["base_url"])
    for _ in range(2):
        assert (
            http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 1}).status_code == 201
        )
    assert len(http.get(f"/v1/sessions/{session['id']}").json()["rewards"]) == 2


def table_counts(database_url: str, session_id: str) -> dict[str, int]:
    """Rows stored for one session id, and the size of the rewards table."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            one = {"id": session_id}
            return {
                "sessions": conn.execute(
                    text("SELECT count(*) FROM sessions WHERE id = :id"), one
                ).scalar_one(),
                "rewards_of_session": conn.execute(
                    text("SELECT count(*) FROM rewards WHERE session_id = :id"), one
                ).scalar_one(),
                "rewards": conn.execute(text("SELECT count(*) FROM rewards")).scalar_one(),
            }
    finally:
        engine.dispose()


def test_reward_to_unknown_session_is_404_and_creates_nothing(http, database_url):
    sid = f"never-made-{uuid.uuid4().hex}"
    before = table_counts(database_url, sid)
    assert before["sessions"] == 0 and before["rewards_of_session"] == 0
    for body, headers in [
        ({"value": 1.0}, {}),
        ({"value": 1.0}, {"Idempotency-Key": f"{sid}:final"}),
        ({"value": 1.0, "completion_id": "chatcmpl-nothing"}, {}),
    ]:
        reply = http.post(f"/v1/sessions/{sid}/rewards", json=body, headers=headers)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "session_not_found"
    # The session still does not exist (no reward post creates it), and no reward row was written.
    assert http.get(f"/v1/sessions/{sid}").status_code == 404
    assert http.get(f"/v1/sessions/{sid}/trajectory").status_code == 404
    assert table_counts(database_url, sid) == before


def test_reward_naming_a_completion_of_another_session_is_404(http):
    a, b = new_session(http), new_session(http)
    complete(a["base_url"])
    other = complete(b["base_url"])
    reply = http.post(
        f"/v1/sessions/{a['id']}/rewards", json={"value": 1.0, "completion_id": other.id}
    )
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "completion_not_found"
    for session in (a, b):  # neither session got a reward
        assert http.get(f"/v1/sessions/{session['id']}").json()["rewards"] == []


@pytest.mark.parametrize(
    "raw",
    [
        b'{"value": NaN}',
        b'{"value": Infinity}',
        b'{"value": -Infinity}',
        b'{"value": 1e999}',
        b'{"value": "x"}',
    ],
)
def test_non_finite_reward_is_422_and_stores_nothing(http, raw):
    session = new_session(http)
    complete(session["base_url"])
    http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 0.25})
    before = http.get(f"/v1/sessions/{session['id']}").json()
    reply = http.post(
        f"/v1/sessions/{session['id']}/rewards",
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 422, reply.text
    after = http.get(f"/v1/sessions/{session['id']}").json()
    assert [r["value"] for r in after["rewards"]] == [0.25]
    assert after["rewards"] == before["rewards"] and after["status"] == before["status"] == "open"


@pytest.mark.parametrize("value", [1e308, -1e308, 1e6 + 1, -1e6 - 1])
def test_reward_outside_the_range_is_422_and_stores_nothing(http, value):
    """The default range is [-1e6, 1e6] (RLGW_REWARD_MIN/MAX): a reward beyond it, which could
    overflow a group's normalization, is refused in the error envelope; nothing is stored."""
    session = new_session(http)
    complete(session["base_url"])
    url = f"/v1/sessions/{session['id']}/rewards"
    assert http.post(url, json={"value": 1e6}).status_code == 201  # the bounds are inclusive
    reply = http.post(url, json={"value": value}, headers={"Idempotency-Key": "out-of-range"})
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "reward_out_of_range" and error["param"] == "value"
    assert "RLGW_REWARD_MAX" in error["message"]
    after = http.get(f"/v1/sessions/{session['id']}").json()
    assert [r["value"] for r in after["rewards"]] == [1e6] and after["status"] == "open"
    # The refused key was not spent: the same key with an in-range value stores it.
    retry = http.post(url, json={"value": 0.5}, headers={"Idempotency-Key": "out-of-range"})
    assert retry.status_code == 201, retry.text


def test_reward_to_a_consumed_session_is_409_and_changes_nothing(http, database_url):
    session = new_session(http)
    reply = complete(session["base_url"])
    http.post(
        f"/v1/sessions/{session['id']}/rewards",
        json={"value": 1.0},
        headers={"Idempotency-Key": "before-consumption"},
    )
    engine = create_engine(database_url)
    with engine.begin() as conn:  # what the trainer does when it consumes a session
        conn.execute(
            text("UPDATE sessions SET status = 'consumed' WHERE id = :id"), {"id": session["id"]}
        )
    engine.dispose()
    before = http.get(f"/v1/sessions/{session['id']}").json()
    assert before["status"] == "consumed" and [r["value"] for r in before["rewards"]] == [1.0]
    url = f"/v1/sessions/{session['id']}/rewards"
    for body, headers in [
        ({"value": 5.0}, {}),
        ({"value": 5.0, "completion_id": reply.id}, {}),
        ({"value": 5.0}, {"Idempotency-Key": "after-consumption"}),
    ]:
        refused = http.post(url, json=body, headers=headers)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_consumed"
    after = http.get(f"/v1/sessions/{session['id']}").json()
    assert after["status"] == "consumed"  # the refusal did not reopen or close the session
    assert after["rewards"] == before["rewards"]  # same ids, values, keys, timestamps
    assert after["completions"] == before["completions"]


def test_reward_on_a_session_without_completions_is_409(http):
    session = new_session(http)
    reply = http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 1.0})
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "nothing_to_reward"


def test_bad_session_bodies_are_422(http):
    assert http.post("/v1/sessions", json={"id": "has space"}).status_code == 422
    assert http.post("/v1/sessions", json={"group_size": 0}).status_code == 422
    assert http.post("/v1/sessions", json={"normalization": "zscore"}).status_code == 422
