"""The gateway's retention task: applies RLGW_RETENTION_TEXT_DAYS and RLGW_RETENTION_RECORDS_DAYS
every RLGW_RETENTION_SWEEP_S (rlgw/governance/retention.py; `rlgw retention sweep` runs it once)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from rlgw.governance import retention
from rlgw.settings import Settings

log = logging.getLogger("rlgw.retention")


def enabled(settings: Settings) -> bool:
    periods = (settings.retention_text_days, settings.retention_records_days)
    return settings.retention_sweep_s > 0 and any(p is not None for p in periods)


async def sweep_once(engine: AsyncEngine, settings: Settings) -> retention.SweepResult:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: retention.sweep(
                sync,
                text_days=settings.retention_text_days,
                records_days=settings.retention_records_days,
                now=datetime.now(UTC),
            )
        )


async def sweep_periodically(engine: AsyncEngine, settings: Settings) -> None:
    """Sweep at start, then every RLGW_RETENTION_SWEEP_S; a failed sweep is retried then."""
    while True:
        try:
            result = await sweep_once(engine, settings)
            if result.texts_dropped or result.sessions_deleted:
                log.info(
                    "retention: dropped the texts of %d completion(s), deleted %d session(s)",
                    result.texts_dropped,
                    result.sessions_deleted,
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database away: the next sweep catches up
            log.warning("retention sweep failed: %s", exc)
        await asyncio.sleep(settings.retention_sweep_s)
