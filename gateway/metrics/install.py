"""Wires metrics into a gateway app: its registry, the request-timing middleware, /metrics."""

from __future__ import annotations

from fastapi import FastAPI

from .live import LiveCollector
from .middleware import RequestMetrics
from .registry import GatewayMetrics
from .router import router


def install_metrics(app: FastAPI) -> GatewayMetrics:
    """Call after the other middleware is added: the timing middleware is then the outermost
    and times everything, the body limit and the rate limits included."""
    metrics = GatewayMetrics()
    metrics.registry.register(LiveCollector(app))
    metrics.scrape_errors.labels("database")  # exposed at 0 before any error
    app.state.metrics = metrics
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.include_router(router)
    return metrics
