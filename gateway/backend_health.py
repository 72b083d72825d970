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


async def probe_all(pool: BackendPool, http: httpx.AsyncClient) -> None:
    """Probe every backend of the pool at once and record the outcomes."""
    views = pool.backends()
    errors = await asyncio.gather(*(probe(http, b.url) for b in views))
    for view, error in zip(views, errors, strict=True):
        await pool.mark(view.id, error)


async def watch_backends(pool: BackendPool, http: httpx.AsyncClient, *, interval_s: float) -> None:
    """Probe all backends every `interval_s` seconds, until cancelled."""
    while True:
        try:
            await probe_all(pool, http)
        except Exception:  # never let one bad round stop the watch
            log.exception("backend health probe failed")
        await asyncio.sleep(interval_s)
