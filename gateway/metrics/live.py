"""What a scrape reads from this process's memory: the recorder's counters and the backends as
this process's pool sees them. Nothing is updated on the request path for these."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rlgw.backend_state import STATES

_RECORDER_COUNTERS = (
    ("written", "Completions committed by this process's recorder"),
    ("failed", "Completions this process's recorder gave up on (their callers got a 503)"),
    ("retries", "Recording attempts that failed at the database connection"),
    ("timeouts", "Of those, attempts cut off because the database did not answer in time"),
)


class LiveCollector:
    """A Prometheus collector reading the app's context when scraped (nothing before its
    lifespan has started)."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def collect(self) -> Iterator[Metric]:
        context = getattr(self._app.state, "context", None)
        if context is None:
            return
        yield from _recorder(context.recorder)
        yield from _pool(context.pool)


def _recorder(recorder: Any) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "rlgw_recorder_backlog",
        "Completions queued for recording in this process, not yet committed",
        value=recorder.backlog,
    )
    for name, documentation in _RECORDER_COUNTERS:
        yield CounterMetricFamily(
            f"rlgw_recorder_{name}", documentation, value=getattr(recorder, name)
        )


def _pool(pool: Any) -> Iterator[Metric]:
    views = pool.backends()
    by_state = GaugeMetricFamily(
        "rlgw_backends",
        "Backends by registry state, as this process last read the registry",
        labels=("model", "state"),
    )
    reachable = GaugeMetricFamily(
        "rlgw_backends_reachable",
        "Of those, the backends this process can reach (its own health probes)",
        labels=("model", "state"),
    )
    total: Counter[tuple[str, str]] = Counter()
    up: Counter[tuple[str, str]] = Counter()
    for view in views:
        total[view.model, view.state] += 1
        up[view.model, view.state] += view.reachable
    for model in sorted({v.model for v in views}):
        for state in sorted(set(STATES) | {s for m, s in total if m == model}):
            by_state.add_metric((model, state), total[model, state])
            reachable.add_metric((model, state), up[model, state])
    in_flight = GaugeMetricFamily(
        "rlgw_backend_in_flight",
        "Requests this process has in flight on each backend",
        labels=("model", "backend"),
    )
    for view in views:
        in_flight.add_metric((view.model, str(view.id)), view.in_flight)
    yield by_state
    yield reachable
    yield in_flight
    yield GaugeMetricFamily(
        "rlgw_registry_following",
        "1 while this process follows backend swaps (its registry listener is connected)",
        value=int(pool.following),
    )
