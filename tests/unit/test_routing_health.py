"""The pool routes only to reachable ACTIVE backends, fails fast when none is reachable, and holds
requests only while no backend is in service (a swap)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gateway.errors import APIError
from gateway.proxy.backend_health import SLOW_STRIKES, probe_all
from gateway.proxy.routing import BackendPool, BackendView

MODEL = "m"


def pool_of(*views: BackendView, hold_timeout_s: float = 30.0) -> BackendPool:
    """A pool holding `views` as if read from the registry (refresh() is never called here)."""
    pool = BackendPool(db_sessions=None, hold_timeout_s=hold_timeout_s)  # type: ignore[arg-type]
    pool._by_id.update({v.id: v for v in views})
    return pool


def backend(id: int, state: str = "active", unreachable: str | None = None) -> BackendView:
    return BackendView(id, MODEL, f"http://b{id}", state, 0, 0, unreachable_reason=unreachable)


async def leased_id(pool: BackendPool, exclude: tuple[int, ...] = ()) -> int:
    async with pool.lease(MODEL, exclude=exclude) as lease:
        return lease.backend_id


async def refused(pool: BackendPool, exclude: tuple[int, ...] = ()) -> tuple[APIError, float]:
    t0 = time.monotonic()
    with pytest.raises(APIError) as caught:
        await leased_id(pool, exclude)
    return caught.value, time.monotonic() - t0


def test_routable_needs_active_served_and_reachable():
    assert backend(1).routable
    assert not backend(1, unreachable="ConnectError").routable
    assert not backend(1, state="draining").routable
    assert not BackendView(1, MODEL, "http://b1", "active", None, 0).routable


async def test_an_unreachable_backend_is_skipped():
    pool = pool_of(backend(1, unreachable="ConnectError"), backend(2))
    assert await leased_id(pool) == 2


async def test_mark_takes_a_backend_out_and_back_in():
    pool = pool_of(backend(1), backend(2))
    await pool.mark(1, "HTTP 503")
    assert await leased_id(pool) == 2
    assert pool.backends()[0].unreachable_reason == "HTTP 503"
    await pool.mark(1, None)
    assert await leased_id(pool) == 1  # least in flight, then lowest id


async def test_all_active_unreachable_fails_fast_with_503():
    pool = pool_of(backend(1, unreachable="ConnectError"), backend(2, state="draining"))
    error, elapsed = await refused(pool)
    assert (error.status, error.code) == (503, "backend_unavailable")
    assert error.headers and "Retry-After" in error.headers
    assert elapsed < 1.0  # not the 30 s hold


async def test_excluded_backends_fail_fast_too():
    pool = pool_of(backend(1), backend(2))
    error, elapsed = await refused(pool, exclude=(1, 2))
    assert error.code == "backend_unavailable" and elapsed < 1.0
    assert await leased_id(pool, exclude=(1,)) == 2


async def test_no_active_backend_holds_until_the_timeout():
    pool = pool_of(backend(1, state="draining"), hold_timeout_s=0.3)
    error, elapsed = await refused(pool)
    assert error.code == "backend_unavailable"
    assert elapsed >= 0.3


async def test_a_backend_coming_back_wakes_a_held_request():
    view = backend(1, state="draining", unreachable="ConnectError")
    pool = pool_of(view, hold_timeout_s=10.0)
    waiting = asyncio.ensure_future(leased_id(pool))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # held: no backend is in service
    view.state = "active"  # as a refresh would (it notifies; here the probe's mark does)
    await pool.mark(1, None)
    assert await asyncio.wait_for(waiting, 1.0) == 1


async def test_a_held_request_fails_fast_once_the_backend_is_active_but_unreachable():
    view = backend(1, state="draining", unreachable="ConnectError")
    pool = pool_of(view, hold_timeout_s=10.0)
    waiting = asyncio.ensure_future(refused(pool))
    await asyncio.sleep(0.05)
    view.state = "active"
    await pool.mark(1, "ReadTimeout")  # any change wakes the waiters, who look again
    error, elapsed = await asyncio.wait_for(waiting, 1.0)
    assert error.code == "backend_unavailable" and elapsed < 1.0


async def test_unknown_model_is_still_404():
    with pytest.raises(APIError) as caught:
        async with pool_of(backend(1)).lease("other"):
            pass
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")


def _answering(statuses: dict[str, int | None]) -> httpx.AsyncClient:
    """Backends whose /health answers with the given status; None: the connection is refused.
    (A unit test of the probe's bookkeeping; the real-backend probe is in test_backend_health.)"""

    def reply(request: httpx.Request) -> httpx.Response:
        status = statuses[f"http://{request.url.host}"]
        if status is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status)

    return httpx.AsyncClient(transport=httpx.MockTransport(reply))


async def test_a_refused_probe_marks_at_once_a_slow_one_after_three_in_a_row():
    pool = pool_of(backend(1), backend(2))
    statuses: dict[str, int | None] = {"http://b1": None, "http://b2": 503}
    strikes: dict[int, int] = {}
    async with _answering(statuses) as http:
        await probe_all(pool, http, strikes)
        assert [b.reachable for b in pool.backends()] == [False, True]
        await probe_all(pool, http, strikes)
        assert pool.backends()[1].reachable  # two 503s: maybe only busy
        statuses["http://b2"] = 200
        await probe_all(pool, http, strikes)  # an answer clears the count
        statuses["http://b2"] = 503
        for _ in range(SLOW_STRIKES - 1):
            await probe_all(pool, http, strikes)
        assert pool.backends()[1].reachable
        await probe_all(pool, http, strikes)
        assert pool.backends()[1].unreachable_reason == "HTTP 503"
        statuses.update({"http://b1": 200, "http://b2": 200})
        await probe_all(pool, http, strikes)
        assert all(b.reachable for b in pool.backends())


async def test_a_swap_or_a_lost_registry_connection_during_a_lease_is_a_doubt():
    pool = pool_of(backend(1))
    pool.follow(connected=True)
    async with pool.lease(MODEL) as lease:
        assert pool.swap_doubt(lease) is None
        pool.backends()[0].swap_epoch += 1  # a swap paused the backend meanwhile
        assert "crossed a weight swap" in pool.swap_doubt(lease)
    async with pool.lease(MODEL) as lease:
        pool.follow(connected=False)
        assert "not following" in pool.swap_doubt(lease)  # cannot tell now
        pool.follow(connected=True)  # reconnected, registry re-read: the epoch is unchanged
        assert pool.swap_doubt(lease) is None


async def test_a_pool_that_never_followed_the_registry_vouches_for_nothing():
    pool = pool_of(backend(1))
    async with pool.lease(MODEL) as lease:
        assert "not following" in pool.swap_doubt(lease)
