"""The metrics one gateway app owns: its own Prometheus registry (never the global default, so
several apps in one process do not collide) and the counters fed while it serves."""

from __future__ import annotations

import os
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from .reasons import KINDS, reason_kind

# Seconds: a proxied generation takes from milliseconds (a refusal) to minutes (a long stream).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class GatewayMetrics:
    """The registry of one app and its in-process counters. Everything else it exposes (the
    recorder, the pool, the database) is read when Prometheus scrapes (`live.py`, `snapshot.py`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ("api", "status", "model")
        self.requests = Counter(
            "rlgw_http_requests",
            "HTTP requests answered by this process, by API, status code and served model",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "rlgw_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response (streams: the last byte)",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.completions = Counter(
            "rlgw_completions_recorded",
            "Completions whose row this process committed, by training eligibility and the kind "
            "of the first reason against it (orphans included); doubtful commits are counted "
            "when marked",
            ("eligible", "reason"),
            registry=self.registry,
        )
        self.scrape_errors = Counter(
            "rlgw_metrics_scrape_errors",
            "Scrapes that answered without the database-derived metrics (the read failed or "
            "took too long)",
            ("source",),
            registry=self.registry,
        )
        info = Gauge(
            "rlgw_gateway_process",
            "1, labelled with this gateway process's pid (counters are per process)",
            ("pid",),
            registry=self.registry,
        )
        info.labels(str(os.getpid())).set(1)
        ProcessCollector(registry=self.registry)  # process_start_time_seconds tells restarts apart
        # Label children are looked up once per label set, not on every request.
        self._request_children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
        self._eligible = self.completions.labels("true", "")
        self._ineligible = {kind: self.completions.labels("false", kind) for kind in KINDS}

    def observe_request(self, api: str, status: str, model: str, seconds: float) -> None:
        key = (api, status, model)
        children = self._request_children.get(key)
        if children is None:
            children = (self.requests.labels(*key), self.latency.labels(*key))
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def completion_recorded(self, reasons: Sequence[str]) -> None:
        """Hook, called once per completion whose row is committed: `reasons` are why it may
        not be trained on (empty: eligible). It is counted once, under its first reason's kind."""
        if reasons:
            self._ineligible[reason_kind(reasons[0])].inc()
        else:
            self._eligible.inc()

    def completion_counts(self) -> dict[str, int]:
        """Completions counted so far: "eligible", then each ineligibility kind."""
        counts = {}
        for family in self.completions.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    eligible = sample.labels["eligible"] == "true"
                    counts["eligible" if eligible else sample.labels["reason"]] = int(sample.value)
        return counts
