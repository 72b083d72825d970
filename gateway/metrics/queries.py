"""Small reads of the registry, the trainer's versions and its backlog, shared by /metrics and the
dashboard. Each is one bounded statement; `bounded_read` runs them under a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rlgw.session_status import SessionStatus

NON_FINITE_KINDS = ("advantage", "update")
SKIP_KIND = re.compile(r"[a-z_]{1,32}")
SWAP_WINDOW = 1000  # swaps are counted over each model's latest this many versions
# A scrape or a dashboard poll answers within this even when the database does not (Prometheus
# waits 10 s by default).
READ_TIMEOUT_S = 3.0


@contextlib.asynccontextmanager
async def bounded_read(
    engine: AsyncEngine, timeout_s: float = READ_TIMEOUT_S
) -> AsyncIterator[AsyncConnection]:
    """A read-only transaction, connect included, cut off after `timeout_s` (TimeoutError); the
    server cancels its statements then too."""
    async with asyncio.timeout(timeout_s), engine.connect() as conn:
        await conn.execute(text("SET TRANSACTION READ ONLY"))
        await conn.execute(
            text("SELECT set_config('statement_timeout', :ms, true)"),
            {"ms": f"{int(timeout_s * 1000)}ms"},
        )
        yield conn
        await conn.rollback()


@dataclass(frozen=True)
class BackendVersion:
    id: int
    model: str
    url: str
    state: str
    state_reason: str | None
    served_version: int | None
    versions_behind: int | None  # the model's current version minus the served one
    updated_at: Any


async def current_versions(conn: AsyncConnection) -> dict[str, int]:
    """Each registered model's current version (the trainer's latest committed)."""
    rows = await conn.execute(text("SELECT name, current_version FROM models ORDER BY name"))
    return {name: version for name, version in rows}


async def backend_versions(conn: AsyncConnection) -> list[BackendVersion]:
    rows = await conn.execute(
        text(
            "SELECT b.id, m.name, b.url, b.state, b.state_reason, b.served_version, "
            "m.current_version - b.served_version, b.updated_at "
            "FROM backends b JOIN models m ON m.id = b.model_id ORDER BY b.id"
        )
    )
    return [BackendVersion(*row) for row in rows]


async def trainer_backlog(conn: AsyncConnection) -> tuple[int, float]:
    """Training sessions closed and rewarded but not yet claimed or consumed by the trainer:
    how many, and how long ago the oldest closed (seconds; 0 with none)."""
    count, oldest_age_s = (
        await conn.execute(
            text(
                "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(s.closed_at)), 0) "
                f"FROM sessions s WHERE s.status = '{SessionStatus.CLOSED}' AND s.train "
                "AND EXISTS (SELECT 1 FROM rewards r WHERE r.session_id = s.id)"
            )
        )
    ).one()
    return int(count), float(oldest_age_s)


async def recent_swaps(
    conn: AsyncConnection, window: int = SWAP_WINDOW
) -> dict[tuple[str, str], int]:
    """Swap outcomes (policy_versions.metrics.swaps: {backend id: outcome}) over each model's
    latest `window` versions: (model, outcome) -> count."""
    rows = await conn.execute(
        text(
            "SELECT m.name, s.outcome, count(*) FROM models m "
            "CROSS JOIN LATERAL (SELECT pv.metrics -> 'swaps' AS swaps FROM policy_versions pv "
            "  WHERE pv.model_id = m.id ORDER BY pv.version DESC LIMIT :window) v "
            "CROSS JOIN LATERAL jsonb_each_text(CASE WHEN jsonb_typeof(v.swaps) = 'object' "
            "  THEN v.swaps ELSE '{}'::jsonb END) AS s(backend, outcome) "
            "GROUP BY m.name, s.outcome ORDER BY m.name, s.outcome"
        ),
        {"window": window},
    )
    return {(model, outcome): count for model, outcome, count in rows}


async def versions(conn: AsyncConnection, per_model: int) -> list[dict[str, Any]]:
    """The latest `per_model` versions of each model, oldest first, with what the trainer
    recorded about them (training reward, timings, swap outcomes, where the step's time went:
    `phases`, {phase: seconds}, {} on a version recorded without them; jsonb keeps no key
    order, the page puts them in the trainer's)."""
    rows = await conn.execute(
        text(
            "SELECT m.name, v.version, v.kind, v.created_at, v.metrics -> 'reward_mean', "
            "v.metrics -> 'pause_s', v.metrics -> 'step_s', v.metrics -> 'swaps', "
            "v.metrics -> 'phases' FROM models m "
            "CROSS JOIN LATERAL (SELECT * FROM policy_versions pv WHERE pv.model_id = m.id "
            "  ORDER BY pv.version DESC LIMIT :n) v ORDER BY m.name, v.version"
        ),
        {"n": per_model},
    )
    return [
        {
            "model": model,
            "version": version,
            "kind": kind,
            "created_at": created_at,
            "reward_mean": _number(reward),
            "pause_s": _number(pause_s),
            "step_s": _number(step_s),
            "swaps": {str(k): str(v) for k, v in swaps.items()} if isinstance(swaps, dict) else {},
            "phases": _seconds(phases),
        }
        for model, version, kind, created_at, reward, pause_s, step_s, swaps, phases in rows
    ]


def _seconds(phases: Any) -> dict[str, float]:
    """A version's `metrics.phases` as {phase: seconds}: its numbers only."""
    if not isinstance(phases, dict):
        return {}
    return {str(k): n for k, v in phases.items() if (n := _number(v)) is not None}


async def latest_values(
    conn: AsyncConnection, fields: Sequence[str]
) -> dict[tuple[str, str], float]:
    """For each model and field of policy_versions.metrics, the value of the latest version
    holding it as a number: (model, field) -> value. A version whose swap is still running has
    no `pause_s` yet; the one before it answers meanwhile."""
    rows = await conn.execute(
        text(
            "SELECT m.name, f.field, (SELECT pv.metrics -> f.field FROM policy_versions pv "
            "  WHERE pv.model_id = m.id AND pv.metrics -> f.field IS NOT NULL "
            "  ORDER BY pv.version DESC LIMIT 1) "
            "FROM models m CROSS JOIN unnest(CAST(:fields AS text[])) AS f(field)"
        ),
        {"fields": list(fields)},
    )
    return {
        (model, field): number
        for model, field, value in rows
        if (number := _number(value)) is not None
    }


async def latest_skipped_fractions(conn: AsyncConnection) -> dict[tuple[str, str], float]:
    """Each model's latest version's `metrics.skipped_frac` ({reason kind: share of the claimed
    completions not trained on}): (model, kind) -> share. Kinds are the trainer's; one that is
    not a short lowercase word is left out (a label value the trainer did not mean)."""
    rows = await conn.execute(
        text(
            "SELECT m.name, f.key, f.value FROM models m CROSS JOIN LATERAL ("
            "  SELECT pv.metrics -> 'skipped_frac' AS fractions FROM policy_versions pv "
            "  WHERE pv.model_id = m.id AND jsonb_typeof(pv.metrics -> 'skipped_frac') = 'object' "
            "  ORDER BY pv.version DESC LIMIT 1) v "
            "CROSS JOIN LATERAL jsonb_each(v.fractions) AS f(key, value)"
        )
    )
    return {
        (model, kind): number
        for model, kind, value in rows
        if SKIP_KIND.fullmatch(kind) and (number := _number(value)) is not None
    }


async def latest_sequence_cuts(conn: AsyncConnection) -> dict[tuple[str, str], float]:
    """Each model's latest version's `metrics.cuts` ({cut reason: sequences of its update that
    began with it}, rlgw/sequences.py): (model, reason) -> count. A reason that is not a short
    lowercase word is left out, as with the skipped fractions."""
    rows = await conn.execute(
        text(
            "SELECT m.name, f.key, f.value FROM models m CROSS JOIN LATERAL ("
            "  SELECT pv.metrics -> 'cuts' AS cuts FROM policy_versions pv "
            "  WHERE pv.model_id = m.id AND jsonb_typeof(pv.metrics -> 'cuts') = 'object' "
            "  ORDER BY pv.version DESC LIMIT 1) v "
            "CROSS JOIN LATERAL jsonb_each(v.cuts) AS f(key, value)"
        )
    )
    return {
        (model, reason): number
        for model, reason, value in rows
        if SKIP_KIND.fullmatch(reason) and (number := _number(value)) is not None
    }


async def non_finite_drops(conn: AsyncConnection) -> dict[str, int]:
    """Sessions the trainer dropped for a non-finite number, by what was non-finite: `advantage`
    (dropped before an update) or `update` (a NaN or infinite loss or gradient norm: the update
    was skipped, no version made). Read from `sessions.dropped_reason`, which the trainer words
    "non-finite advantage: ..." and "non-finite update: ..." (trainer/loop/advantages.py,
    trainer/loop/update.py)."""
    rows = await conn.execute(
        text(
            "SELECT k.kind, (SELECT count(*) FROM sessions s WHERE s.status = :dropped "
            "  AND s.dropped_reason LIKE 'non-finite ' || k.kind || '%') "
            "FROM unnest(CAST(:kinds AS text[])) AS k(kind)"
        ),
        {"dropped": SessionStatus.DROPPED.value, "kinds": list(NON_FINITE_KINDS)},
    )
    return {kind: int(n) for kind, n in rows}


async def held_out_rewards(conn: AsyncConnection) -> dict[tuple[str, int], tuple[float, int]]:
    """Rewards of held-out sessions (`train: false`), by the model and policy version that
    served the completion each is attached to: (model, version) -> (mean, count). Rewards on
    retry orphans do not count, as in training."""
    rows = await conn.execute(
        text(
            "SELECT c.model, c.policy_version, avg(r.value), count(*) FROM rewards r "
            "JOIN sessions s ON s.id = r.session_id JOIN completions c ON c.id = r.completion_id "
            "WHERE NOT s.train AND c.policy_version IS NOT NULL AND c.orphan_reason IS NULL "
            "GROUP BY c.model, c.policy_version"
        )
    )
    return {(model, version): (float(mean), int(n)) for model, version, mean, n in rows}


async def sessions_by_status(conn: AsyncConnection) -> dict[str, int]:
    rows = await conn.execute(text("SELECT status, count(*) FROM sessions GROUP BY status"))
    return {status: int(n) for status, n in rows}


def _number(value: Any) -> float | None:
    """A JSON value as a finite float, else None (the metrics map is the trainer's, not ours)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None
