"""GET /metrics: the Prometheus exposition of this gateway process, behind the admin key."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import AdminDep, ContextDep
from .registry import GatewayMetrics
from .snapshot import read_snapshot, snapshot_registry

log = logging.getLogger("rlgw.metrics")
router = APIRouter(tags=["admin"], dependencies=[AdminDep])


def metrics_of(request: Request) -> GatewayMetrics:
    return request.app.state.metrics


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request, ctx: ContextDep) -> Response:
    """In-process counters and state, plus what the database says (current versions, versions
    behind, the trainer's backlog, recent swaps). A failed database read is counted in
    `rlgw_metrics_scrape_errors_total` and the rest is still answered."""
    gateway_metrics = metrics_of(request)
    body = b""
    try:
        snapshot = await read_snapshot(ctx.engine)
        body = generate_latest(snapshot_registry(snapshot))
    except Exception as exc:  # the scrape must answer: report the gap, serve the rest
        log.warning("metrics: database read failed: %s", type(exc).__name__)
        gateway_metrics.scrape_errors.labels("database").inc()
    body = generate_latest(gateway_metrics.registry) + body
    return Response(body, media_type=CONTENT_TYPE_LATEST)
