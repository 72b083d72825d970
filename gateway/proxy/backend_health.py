"""Probes every backend's `/health` on a timer and marks it reachable or not in this process."""

from __future__ import annotations

import asyncio
import logging

import httpx

from .routing import BackendPool

log = logging.getLogger("rlgw.backend_health")

PROBE_TIMEOUT_S = 2.0


async def probe(http: httpx.AsyncClient, url: str) -> str | None:
    """None when `url` answers `/health` with 200 now; else why not (`ConnectError`, `HTTP 503`)."""
    try:
        reply = await http.get(url + "/health", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return None if reply.status_code == 200 else f"HTTP {reply.status_code}"


# A backend that refuses connections is not listening: out at once. A slow or failing answer
# (timeout, 5xx) may be a busy CPU backend whose engine loop is held (a weight stage, a long
# prefill): it leaves routing only after this many such probes in a row.
SLOW_STRIKES = 3


def _strike_limit(error: str) -> int:
    return 1 if error == "ConnectError" else SLOW_STRIKES


async def probe_all(
    pool: BackendPool, http: httpx.AsyncClient, strikes: dict[int, int] | None = None
) -> None:
    """Probe every backend of the pool at once and record the outcomes. `strikes` counts each
    backend's failed probes in a row (kept by the caller between rounds)."""
    strikes = {} if strikes is None else strikes
    views = pool.backends()
    errors = await asyncio.gather(*(probe(http, b.url) for b in views))
    for view, error in zip(views, errors, strict=True):
        if error is None:
            strikes.pop(view.id, None)
            await pool.mark(view.id, None)
            continue
        strikes[view.id] = strikes.get(view.id, 0) + 1
        if strikes[view.id] >= _strike_limit(error):
            await pool.mark(view.id, error)


async def watch_backends(pool: BackendPool, http: httpx.AsyncClient, *, interval_s: float) -> None:
    """Probe all backends every `interval_s` seconds, until cancelled."""
    strikes: dict[int, int] = {}
    while True:
        try:
            await probe_all(pool, http, strikes)
        except Exception:  # never let one bad round stop the watch
            log.exception("backend health probe failed")
        await asyncio.sleep(interval_s)
