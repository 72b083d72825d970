"""Which backends a request may reach under promotion gates and canaries: unpinned requests only
those serving a promoted version, a pinned session only those serving its version, a retired pin
is refused, and a canary's draw is the same on every request of a session."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.errors import APIError
from gateway.proxy.canary import ModelVersions, VersionRules, pin_for
from gateway.proxy.routing import BackendPool, BackendView

MODEL = "m"
SINCE = datetime(2026, 12, 1, tzinfo=UTC)


def rules(current=1, candidate=2, share=None, held_back=(2,)) -> VersionRules:
    return VersionRules(
        {MODEL: ModelVersions(current, candidate, share, SINCE, frozenset(held_back))}
    )


def pool(versions: VersionRules, *served: int) -> BackendPool:
    p = BackendPool(db_sessions=None, hold_timeout_s=0.2)  # type: ignore[arg-type]
    p._by_id.update(
        {i: BackendView(i, MODEL, f"http://b{i}", "active", v, 0) for i, v in enumerate(served, 1)}
    )
    p.versions = versions
    return p


async def leased_version(p: BackendPool, pin: int | None) -> int:
    async with p.lease(MODEL, pin=pin) as lease:
        return lease.served_version


async def test_unpinned_requests_never_reach_a_candidate():
    p = pool(rules(), 1, 2)
    assert {await leased_version(p, None) for _ in range(6)} == {1}


async def test_a_pinned_session_reaches_only_its_version():
    p = pool(rules(), 1, 2)
    assert {await leased_version(p, 2) for _ in range(6)} == {2}
    assert {await leased_version(p, 1) for _ in range(6)} == {1}


async def test_an_unpinned_request_waits_while_only_a_candidate_serves():
    p = pool(rules(), 2)
    with pytest.raises(APIError) as caught:
        await leased_version(p, None)
    assert caught.value.status == 503  # held for the hold time, then refused: never the candidate


def test_a_model_without_governance_rows_admits_every_version():
    assert VersionRules().admits(MODEL, 7, None)


def test_a_retired_pin_is_refused_with_409():
    with pytest.raises(APIError) as caught:
        rules(current=3, candidate=None, held_back=()).check_pin(MODEL, "s", 2)
    assert caught.value.status == 409 and caught.value.code == "pinned_version_retired"
    rules().check_pin(MODEL, "s", 2)  # the candidate: served
    rules().check_pin(MODEL, "s", 1)  # the promoted version: served
    rules().check_pin(MODEL, "s", None)  # not pinned


def test_the_canary_draw_is_stable_and_close_to_its_share():
    canary = rules(share=0.3)
    draws = [canary.draw(MODEL, f"sess-{i}") for i in range(2000)]
    assert draws == [canary.draw(MODEL, f"sess-{i}") for i in range(2000)]
    assert 0.25 < sum(d is not None for d in draws) / 2000 < 0.35
    assert {d.version for d in draws if d} == {2}
    assert rules(share=None).draw(MODEL, "sess-1") is None  # evaluation only: no canary draw


def test_a_pin_holds_for_its_own_model_only():
    assert pin_for(("m", 4), "m") == 4
    assert pin_for(("other", 4), "m") is None
    assert pin_for((None, None), "m") is None
