"""What the dashboard shows, as one JSON document: versions with their training and held-out
rewards and swap figures, backends, sessions by status (from the database, read with a timeout),
and this process's completions by eligibility and recorder counters (from memory)."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

from ..context import GatewayContext
from ..metrics import queries
from ..metrics.registry import GatewayMetrics

log = logging.getLogger("rlgw.dashboard")
VERSIONS_SHOWN = 200  # per model, the latest


async def _from_database(ctx: GatewayContext) -> dict[str, Any]:
    async with queries.bounded_read(ctx.engine) as conn:
        versions = await queries.versions(conn, per_model=VERSIONS_SHOWN)
        held_out = await queries.held_out_rewards(conn)
        backends = await queries.backend_versions(conn)
        backlog, oldest = await queries.trainer_backlog(conn)
        return {
            "models": await queries.current_versions(conn),
            "versions": [_with_held_out(v, held_out) for v in versions],
            "backends": [vars(b) for b in backends],
            "sessions_by_status": await queries.sessions_by_status(conn),
            "trainer_backlog": {"sessions": backlog, "oldest_age_s": oldest},
        }


def _with_held_out(version: dict[str, Any], held_out: dict[tuple[str, int], tuple[float, int]]):
    mean, count = held_out.get((version["model"], version["version"]), (None, 0))
    return {**version, "held_out_reward_mean": mean, "held_out_rewards": count}


def _here(ctx: GatewayContext, backends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The registry's backends with this process's own view of each (reachable, in flight)."""
    views = {v.id: v for v in ctx.pool.backends()}
    for b in backends:
        view = views.get(b["id"])
        b["reachable_here"] = view.reachable if view else None
        b["unreachable_reason"] = view.unreachable_reason if view else None
        b["in_flight_here"] = view.in_flight if view else 0
    return backends


async def dashboard_data(ctx: GatewayContext, metrics: GatewayMetrics) -> dict[str, Any]:
    """The document; a failed database read leaves its parts empty and says why."""
    try:
        stored, error = await _from_database(ctx), None
    except Exception as exc:  # the page still shows what this process knows
        log.warning("dashboard: database read failed: %s", type(exc).__name__)
        stored, error = {}, type(exc).__name__
    recorder = ctx.recorder
    return {
        "generated_at": datetime.now(UTC).isoformat(),
        "process": os.getpid(),
        "database": {"ok": error is None, "error": error},
        "models": stored.get("models", {}),
        "versions": stored.get("versions", []),
        "backends": _here(ctx, stored.get("backends", [])),
        "sessions_by_status": stored.get("sessions_by_status", {}),
        "trainer_backlog": stored.get("trainer_backlog"),
        "completions": metrics.completion_counts(),
        "recorder": {
            "backlog": recorder.backlog,
            "written": recorder.written,
            "failed": recorder.failed,
            "retries": recorder.retries,
            "timeouts": recorder.timeouts,
        },
    }
