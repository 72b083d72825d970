"""The load generator: a fixed number of identical requests at a fixed concurrency against one URL,
with per-request latency (full response, or last byte of a stream) and time to first byte.

It runs in the benchmark's own process, never inside a server: one aiohttp session (keep-alive,
at most `concurrency` connections) on uvloop when available, `concurrency` workers taking requests
from a shared count. Warm-up requests go first on the same connections and are not measured.
A request counts as an error unless it answers 200 and, for a stream, ends with `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
    uvloop = None

DONE = b"data: [DONE]"


@dataclass
class PointResult:
    """What one (path, concurrency, stream, tokens) point measured."""

    ok: int = 0
    errors: int = 0
    wall_s: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    ttfb_ms: list[float] = field(default_factory=list)
    first_error: str | None = None
    cpu_before: dict[str, float] = field(default_factory=dict)
    cpu_after: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> tuple:
    """(latency ms, ttfb ms or None, error or None) of one request."""
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body) as resp:
            if not stream:
                payload = await resp.read()
                latency = (time.perf_counter() - t0) * 1000.0
                if resp.status != 200:
                    return latency, None, f"HTTP {resp.status}: {payload[:200]!r}"
                return latency, None, None
            first = await resp.content.readany()
            ttfb = (time.perf_counter() - t0) * 1000.0
            tail = first[-64:]
            while chunk := await resp.content.readany():
                tail = (tail + chunk)[-64:]
            latency = (time.perf_counter() - t0) * 1000.0
            if resp.status != 200:
                return latency, ttfb, f"HTTP {resp.status}: {(first + tail)[:200]!r}"
            if DONE not in tail:
                return latency, ttfb, f"stream ended without [DONE]: {tail!r}"
            return latency, ttfb, None
    except (aiohttp.ClientError, TimeoutError) as exc:
        return (time.perf_counter() - t0) * 1000.0, None, f"{type(exc).__name__}: {exc}"


async def _drive(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    concurrency: int,
    count: int,
    result: PointResult | None,
    max_s: float | None = None,
) -> None:
    left = count
    deadline = None if max_s is None else time.perf_counter() + max_s

    async def worker() -> None:
        nonlocal left
        while left > 0 and (deadline is None or time.perf_counter() < deadline):
            left -= 1
            latency, ttfb, error = await _one(session, url, body, stream)
            if result is None:
                continue
            if error is None:
                result.ok += 1
                result.latency_ms.append(latency)
                if ttfb is not None:
                    result.ttfb_ms.append(ttfb)
            else:
                result.errors += 1
                result.first_error = result.first_error or error

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run_point_async(
    url: str,
    body: bytes,
    *,
    stream: bool,
    concurrency: int,
    requests: int,
    warmup: int,
    max_s: float | None = None,
    warmup_max_s: float | None = 15.0,
    timeout_s: float = 300.0,
    probe: Callable[[], dict[str, float]] | None = None,
) -> PointResult:
    """`warmup` unmeasured requests (no new one after `warmup_max_s`), then `requests` measured
    ones, none started after `max_s` seconds (the requests in flight then still finish and
    count). `probe` (CPU times) is read just before and after the measured requests."""
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as s:
        if warmup:
            await _drive(s, url, body, stream, concurrency, warmup, None, warmup_max_s)
        result = PointResult()
        result.cpu_before = probe() if probe else {}
        t0 = time.perf_counter()
        await _drive(s, url, body, stream, concurrency, requests, result, max_s)
        result.wall_s = time.perf_counter() - t0
        result.cpu_after = probe() if probe else {}
    return result


def run_point(url: str, body: bytes, **kwargs) -> PointResult:
    """run_point_async on a fresh event loop (uvloop when installed)."""
    if uvloop is not None:
        return uvloop.run(run_point_async(url, body, **kwargs))
    return asyncio.run(run_point_async(url, body, **kwargs))
