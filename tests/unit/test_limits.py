"""Token bucket and concurrency limits per key, with a controlled clock."""

from __future__ import annotations

import pytest

from gateway.errors import APIError
from gateway.limits import SCOPE_KEY, Limiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scope() -> dict:
    return {SCOPE_KEY: []}


def finish(s: dict) -> None:
    for f in s[SCOPE_KEY]:
        f()


def test_burst_then_429_with_retry_after_then_refill():
    clock = Clock()
    limiter = Limiter(rate=0.5, burst=3, concurrency=0, clock=clock)
    for _ in range(3):
        s = scope()
        limiter.admit("key:a", s)
        finish(s)
    with pytest.raises(APIError) as info:
        limiter.admit("key:a", scope())
    assert info.value.status == 429
    assert info.value.code == "rate_limited"
    assert info.value.headers == {"Retry-After": "2"}  # one token at 0.5/s
    limiter.admit("key:b", scope())  # another key has its own bucket
    clock.now += 2.0
    limiter.admit("key:a", scope())


def test_concurrency_slot_is_held_until_the_request_finishes():
    limiter = Limiter(rate=0, burst=1, concurrency=2, clock=Clock())
    first, second = scope(), scope()
    limiter.admit("key:a", first)
    limiter.admit("key:a", second)
    with pytest.raises(APIError) as info:
        limiter.admit("key:a", scope())
    assert (info.value.status, info.value.code) == (429, "too_many_concurrent_requests")
    assert info.value.headers == {"Retry-After": "1"}
    finish(first)
    assert limiter.in_flight("key:a") == 1
    limiter.admit("key:a", scope())


def test_a_refused_request_takes_neither_a_token_nor_a_slot():
    limiter = Limiter(rate=1, burst=1, concurrency=1, clock=Clock())
    held = scope()
    limiter.admit("key:a", held)
    with pytest.raises(APIError):
        limiter.admit("key:a", scope())
    assert limiter.in_flight("key:a") == 1


def test_admit_outside_the_middleware_is_a_programming_error():
    limiter = Limiter(rate=1, burst=1, concurrency=1, clock=Clock())
    with pytest.raises(RuntimeError):
        limiter.admit("key:a", {})
    assert limiter.in_flight("key:a") == 0
