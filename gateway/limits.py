"""Per-caller request rate (token bucket) and concurrency limits, enforced in this process.

Every caller is limited under one key: an agent key (its session tokens share its bucket), the
admin key, or, with auth off and on the public routes, the client address. Each replica keeps its
own buckets, so N replicas admit up to N times the configured rate in total.

A request takes its concurrency slot when it is admitted and gives it back when its response has
been sent in full (streams included): `ReleaseSlots` wraps the whole ASGI call for that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import APIError

SCOPE_KEY = "rlgw.on_finish"
_PRUNE_EVERY = 1024


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    in_flight: int = 0


class Limiter:
    def __init__(
        self, rate: float, burst: int, concurrency: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst, self.concurrency = rate, burst, concurrency
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._ops = 0

    def in_flight(self, key: str) -> int:
        bucket = self._buckets.get(key)
        return bucket.in_flight if bucket else 0

    def admit(self, key: str, scope: dict[str, Any]) -> None:
        """Take one request token and one concurrency slot for `key`, or raise 429."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), stamp=now)
        if self.rate > 0:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
            if bucket.tokens < 1.0:
                wait = math.ceil((1.0 - bucket.tokens) / self.rate)
                raise APIError(
                    429,
                    f"rate limit: {self.rate:g} requests/s (burst {self.burst}) for this key",
                    code="rate_limited",
                    headers={"Retry-After": str(max(1, wait))},
                )
        if self.concurrency > 0 and bucket.in_flight >= self.concurrency:
            raise APIError(
                429,
                f"concurrency limit: {self.concurrency} requests in flight for this key",
                code="too_many_concurrent_requests",
                headers={"Retry-After": "1"},
            )
        if self.rate > 0:
            bucket.tokens -= 1.0
        bucket.in_flight += 1
        finishers = scope.get(SCOPE_KEY)
        if finishers is None:  # not under ReleaseSlots: nothing would give the slot back
            bucket.in_flight -= 1
            raise RuntimeError("Limiter.admit outside ReleaseSlots")
        finishers.append(lambda: self._release(key))
        self._maybe_prune(now)

    def _release(self, key: str) -> None:
        bucket = self._buckets.get(key)
        if bucket is not None and bucket.in_flight > 0:
            bucket.in_flight -= 1

    def _maybe_prune(self, now: float) -> None:
        # Forget idle callers whose bucket has refilled: they would start full anyway.
        self._ops += 1
        if self._ops % _PRUNE_EVERY:
            return
        refill_s = self.burst / self.rate if self.rate > 0 else 0.0
        for key in [
            k for k, b in self._buckets.items() if b.in_flight == 0 and now - b.stamp >= refill_s
        ]:
            del self._buckets[key]


class ReleaseSlots:
    """ASGI middleware: runs what a request registered under SCOPE_KEY once it is fully over."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        finishers: list[Callable[[], None]] = []
        scope[SCOPE_KEY] = finishers
        try:
            await self.app(scope, receive, send)
        finally:
            for finish in finishers:
                finish()
