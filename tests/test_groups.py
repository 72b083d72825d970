"""Groups of sessions: normalized together once every member is finished and rewarded; held back
while one is missing; dropped whole after the deadline. A group of one keeps its raw reward."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from conftest import MODEL_NAME


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=60) as client:
        yield client


def run_group(http: httpx.Client, rewards: list[float | None], **group) -> tuple[str, list[str]]:
    """One session per reward (None: left unrewarded); each makes one completion and closes."""
    group_id = f"g-{uuid.uuid4().hex[:12]}"
    ids = []
    for value in rewards:
        session = http.post("/v1/sessions", json={"group_id": group_id, **group}).json()
        client = openai.OpenAI(base_url=session["base_url"], api_key="unused")
        client.chat.completions.create(
            model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "go"}]
        )
        if value is not None:
            http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": value})
        http.post(f"/v1/sessions/{session['id']}/close")
        ids.append(session["id"])
    return group_id, ids


def exports(http: httpx.Client, ids: list[str]) -> list[dict]:
    return [http.get(f"/v1/sessions/{sid}/trajectory").json() for sid in ids]


@pytest.mark.parametrize("how", ["none", "mean", "mean_std"])
def test_group_of_one_keeps_its_raw_reward(http, how):
    _, ids = run_group(http, [0.7], normalization=how)
    (t,) = exports(http, ids)
    assert t["group"]["status"] == "ready"
    assert t["return_raw"] == t["return_normalized"] == 0.7


def test_group_of_two_mean_normalized(http):
    _, ids = run_group(http, [1.0, 0.0], normalization="mean")
    assert [t["return_normalized"] for t in exports(http, ids)] == [0.5, -0.5]


def test_group_of_eight_mean_std_normalized(http):
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0]
    _, ids = run_group(http, rewards, normalization="mean_std", group_size=8)
    got = [t["return_normalized"] for t in exports(http, ids)]
    mean = sum(rewards) / 8
    std = (sum((r - mean) ** 2 for r in rewards) / 8) ** 0.5
    assert got == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards], abs=1e-9)
    assert [t["return_raw"] for t in exports(http, ids)] == rewards  # raw is never changed


@pytest.mark.parametrize("size", [2, 8])
def test_group_missing_a_reward_is_held_back_not_normalized_with_a_gap(http, size):
    _, ids = run_group(http, [1.0] * (size - 1) + [None], normalization="mean")
    for t in exports(http, ids):
        assert t["group"]["status"] == "pending"
        assert t["return_normalized"] is None
        assert f"1 of {size}" in t["group"]["reason"]


def test_group_missing_a_reward_after_the_deadline_is_dropped_with_a_reason(http, database_url):
    group_id, ids = run_group(http, [1.0, None], normalization="mean")
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE groups SET deadline_at = now() - interval '1 second' WHERE id = :id"),
            {"id": group_id},
        )
    engine.dispose()
    for t in exports(http, ids):
        assert t["group"]["status"] == "dropped" and "deadline passed" in t["group"]["reason"]
        assert t["return_normalized"] is None


def test_group_waits_for_its_declared_size(http):
    _, ids = run_group(http, [1.0, 0.0], normalization="mean", group_size=3)
    assert {t["group"]["status"] for t in exports(http, ids)} == {"pending"}


def test_conflicting_group_settings_are_409(http):
    group_id = f"g-{uuid.uuid4().hex[:12]}"
    assert (
        http.post("/v1/sessions", json={"group_id": group_id, "normalization": "mean"}).status_code
        == 201
    )
    reply = http.post("/v1/sessions", json={"group_id": group_id, "normalization": "none"})
    assert reply.status_code == 409 and reply.json()["error"]["param"] == "normalization"
