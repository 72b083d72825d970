"""The database-derived metrics: read once per scrape (bounded by a timeout), then turned into
Prometheus families by a collector of that scrape alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.ext.asyncio import AsyncEngine

from . import queries

# What trainer/swap/coordinator.py reports; anything else is counted as "other".
SWAP_OUTCOMES = frozenset({"swapped", "rolled_back", "refused", "failed", "skipped"})
# policy_versions.metrics fields exposed as gauges of the latest version that holds each.
LATEST_FIELDS = (
    ("pause_s", "rlgw_last_swap_pause_seconds", "Longest backend pause in the latest swap"),
    ("step_s", "rlgw_last_step_seconds", "The latest version's whole update step (train + swap)"),
    ("reward_mean", "rlgw_last_reward_mean", "Mean training reward of the latest version's batch"),
)


@dataclass(frozen=True)
class Snapshot:
    current_versions: dict[str, int]
    backends: list[queries.BackendVersion]
    backlog_sessions: int
    backlog_oldest_age_s: float
    swaps: dict[tuple[str, str], int]
    latest: dict[tuple[str, str], float]  # (model, metrics field) -> its latest value


async def read_snapshot(engine: AsyncEngine) -> Snapshot:
    """Everything in one bounded read-only transaction (TimeoutError when it takes too long)."""
    async with queries.bounded_read(engine) as conn:
        backlog, oldest = await queries.trainer_backlog(conn)
        return Snapshot(
            current_versions=await queries.current_versions(conn),
            backends=await queries.backend_versions(conn),
            backlog_sessions=backlog,
            backlog_oldest_age_s=oldest,
            swaps=await queries.recent_swaps(conn),
            latest=await queries.latest_values(conn, [f for f, _, _ in LATEST_FIELDS]),
        )


class SnapshotCollector:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        current = GaugeMetricFamily(
            "rlgw_model_current_version",
            "Each model's current policy version (the trainer's latest committed)",
            labels=("model",),
        )
        for model, version in s.current_versions.items():
            current.add_metric((model,), version)
        yield current
        behind = GaugeMetricFamily(
            "rlgw_backend_versions_behind",
            "The model's current version minus the version the backend serves (verified)",
            labels=("model", "backend"),
        )
        for b in s.backends:
            if b.versions_behind is not None:
                behind.add_metric((b.model, str(b.id)), b.versions_behind)
        yield behind
        yield GaugeMetricFamily(
            "rlgw_trainer_backlog_sessions",
            "Training sessions closed and rewarded, not yet claimed or consumed by the trainer",
            value=s.backlog_sessions,
        )
        yield GaugeMetricFamily(
            "rlgw_trainer_backlog_oldest_seconds",
            "How long ago the oldest of those sessions closed (0 with none)",
            value=s.backlog_oldest_age_s,
        )
        swaps = GaugeMetricFamily(
            "rlgw_recent_swaps",
            f"Backend swaps by outcome over each model's latest {queries.SWAP_WINDOW} versions "
            "(policy_versions.metrics.swaps)",
            labels=("model", "outcome"),
        )
        outcomes: Counter[tuple[str, str]] = Counter()
        for (model, outcome), count in s.swaps.items():
            outcomes[model, outcome if outcome in SWAP_OUTCOMES else "other"] += count
        for labels, count in sorted(outcomes.items()):
            swaps.add_metric(labels, count)
        yield swaps
        for field, name, documentation in LATEST_FIELDS:
            family = GaugeMetricFamily(name, documentation, labels=("model",))
            for (model, of), number in sorted(s.latest.items()):
                if of == field:
                    family.add_metric((model,), number)
            yield family


def snapshot_registry(snapshot: Snapshot) -> CollectorRegistry:
    """A registry of one scrape, holding only that scrape's database-derived families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return registry
