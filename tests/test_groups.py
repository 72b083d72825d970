"""Groups of sessions: normalized together once every member is finished and rewarded; held back
while one is missing; dropped whole after the deadline. A group of one keeps its raw reward."""

from __future__ import annotations

import uuid

import httpx
import numpy as np
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
        created = http.post("/v1/sessions", json={"group_id": group_id, **group})
        assert created.status_code == 201, created.text
        session = created.json()
        client = openai.OpenAI(base_url=session["base_url"], api_key="unused")
        client.chat.completions.create(
            model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "go"}]
        )
        if value is not None:
            rewarded = http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": value})
            assert rewarded.status_code == 201, rewarded.text
        assert http.post(f"/v1/sessions/{session['id']}/close").status_code == 200
        ids.append(session["id"])
    return group_id, ids


def exports(http: httpx.Client, ids: list[str]) -> list[dict]:
    return [http.get(f"/v1/sessions/{sid}/trajectory").json() for sid in ids]


HOWS = ["none", "mean", "mean_std"]
# Rewards exactly representable in float32 and float64, so storage cannot blur the expectation.
REWARDS = {
    1: [0.75],
    2: [1.0, 0.25],
    8: [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.25],
}


def expected_normalized(rewards: list[float], how: str) -> list[float]:
    """The documented normalizations (rlgw/rewards.py; docs/architecture.md, "Groups"),
    computed here with numpy rather than by the code under test: none keeps raw rewards; mean
    subtracts the group mean; mean_std divides that by the population std plus 1e-6; a group of
    one keeps its raw reward whatever the setting."""
    r = np.asarray(rewards, dtype=np.float64)
    if how == "none" or len(r) == 1:
        return r.tolist()
    if how == "mean":
        return (r - r.mean()).tolist()
    return ((r - r.mean()) / (r.std(ddof=0) + 1e-6)).tolist()


def expire_deadline(database_url: str, group_id: str) -> None:
    """Move the group's deadline into the past (instead of waiting RLGW_GROUP_DEADLINE_S)."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE groups SET deadline_at = now() - interval '1 second' WHERE id = :id"),
            {"id": group_id},
        )
    engine.dispose()


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("size", [1, 2, 8])
def test_complete_group_is_normalized(http, size, how):
    rewards = REWARDS[size]
    group_id, ids = run_group(http, rewards, normalization=how)
    trajectories = exports(http, ids)
    for t in trajectories:
        assert t["group"] == {
            "id": group_id,
            "normalization": how,
            "status": "ready",
            "reason": None,
            "size": size,
        }
    assert [t["return_raw"] for t in trajectories] == rewards  # raw is never changed
    got = [t["return_normalized"] for t in trajectories]
    assert got == pytest.approx(expected_normalized(rewards, how), rel=0, abs=1e-9)
    if size == 1:  # a group of one keeps its raw reward, exactly
        assert got == rewards
    if size > 1 and how != "none":
        assert sum(got) == pytest.approx(0.0, abs=1e-9)  # centred on the group mean


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("size", [1, 2, 8])
def test_group_missing_a_reward_is_held_back_then_dropped_after_the_deadline(
    http, database_url, size, how
):
    rewards: list[float | None] = list(REWARDS[size])
    missing = size // 2  # the unrewarded member: the only one of 1, the last of 2, the 5th of 8
    rewards[missing] = None
    group_id, ids = run_group(http, rewards, normalization=how)

    # Held back, not normalized with a gap: no member has a normalized return yet.
    pending = exports(http, ids)
    for t in pending:
        assert t["group"]["status"] == "pending"
        assert f"waiting for 1 of {size}" in t["group"]["reason"]
        assert t["return_normalized"] is None
    assert [t["return_raw"] for t in pending] == rewards  # the raw rewards are all still there

    expire_deadline(database_url, group_id)
    dropped = exports(http, ids)
    for t in dropped:
        assert t["group"]["status"] == "dropped"
        reason = t["group"]["reason"]
        assert "deadline passed" in reason and f"1 of {size}" in reason
        assert t["return_normalized"] is None
    assert [t["return_raw"] for t in dropped] == rewards


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
