"""A swap's pause in place, as the registry records it: the epoch bump, the counts read while
paused, and the boundary's outcome (rlgw/swap_boundaries.py says what they mean to a record).

    open_pause     one transaction: the backend leaves routing (PAUSED, epoch + 1, NOTIFY) and
                   its boundary row is inserted as `pausing`
    store_counts   the counts read from the paused backend (`pending`), or none (a worker that
                   cannot say): the records that crossed it then stay ineligible
    close          `served` (its weights verified), or `failed`: every record already written
                   through it gets the SERVED_UNVERIFIED reason, the later ones get it when written

The boundary lock (advisory, shared by the gateway's writers) is held by `BoundaryLock` from
before the epoch bump until the counts are stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from rlgw import backend_state as bs
from rlgw import swap_boundaries as sb
from rlgw.db.models import Backend, Completion, SwapBoundary
from rlgw.eligibility import SERVED_UNVERIFIED, add_reason


@contextlib.contextmanager
def boundary_lock(engine: Engine, backend_id: int) -> Iterator[None]:
    """Hold the backend's boundary lock: a gateway writer settling a record of this backend
    waits until the boundary it may need is complete."""
    with engine.connect() as conn:
        conn.execute(select(func.pg_advisory_lock(sb.LOCK_NAMESPACE, backend_id)))
        conn.commit()
        try:
            yield
        finally:
            conn.execute(select(func.pg_advisory_unlock(sb.LOCK_NAMESPACE, backend_id)))
            conn.commit()


def open_pause(
    db_sessions: sessionmaker[Session],
    backend_id: int,
    reason: str,
    *,
    from_version: int | None,
    to_version: int | None,
) -> int:
    """Take the backend out of routing for a pause; returns the epoch the pause begins."""
    with db_sessions() as db, db.begin():
        epoch = db.execute(
            bs.set_state(backend_id, bs.PAUSED, reason, bump_epoch=True).returning(
                Backend.swap_epoch
            )
        ).scalar_one()
        db.execute(
            insert(SwapBoundary).values(
                backend_id=backend_id,
                epoch=epoch,
                from_version=from_version,
                to_version=to_version,
                outcome=sb.PAUSING,
            )
        )
        db.execute(bs.NOTIFY, bs.notify_args(backend_id))
    return int(epoch)


def counts_from(state: Mapping[str, Any]) -> tuple[dict[str, int], list[str]]:
    """A worker's `rlgw_generation_state` as request keys: running -> tokens, finished."""
    running: dict[str, int] = {}
    for engine_id, tokens in (state.get("running") or {}).items():
        key = sb.engine_request_key(str(engine_id))
        if key is not None:
            running[key] = max(running.get(key, 0), int(tokens))
    finished = sorted(
        {k for e in state.get("finished") or () if (k := sb.engine_request_key(str(e)))}
    )
    return running, finished


def store_counts(
    db_sessions: sessionmaker[Session],
    backend_id: int,
    epoch: int,
    state: Mapping[str, Any] | None,
) -> int | None:
    """Store what the paused backend held (None: it could not say); returns how many requests
    it held, None when unknown."""
    running, finished = counts_from(state) if state is not None else (None, None)
    with db_sessions() as db, db.begin():
        db.execute(
            update(SwapBoundary)
            .where(SwapBoundary.backend_id == backend_id, SwapBoundary.epoch == epoch)
            .values(outcome=sb.PENDING, running=running, finished=finished)
        )
    return None if running is None else len(running)


def close(
    db: Session,
    backend_id: int,
    epoch: int,
    outcome: str,
    *,
    to_version: int | None = None,
) -> list[str]:
    """Settle the boundary in the caller's transaction; `to_version` corrects what the pause
    led to (the old weights kept). Returns the ids of the completions a failure marked."""
    if outcome not in (sb.SERVED, sb.FAILED):
        raise ValueError(f"a boundary closes served or failed, not {outcome!r}")
    where = (SwapBoundary.backend_id == backend_id, SwapBoundary.epoch == epoch)
    db.execute(select(SwapBoundary.epoch).where(*where).with_for_update())
    values: dict[str, Any] = {"outcome": outcome}
    if to_version is not None:
        values["to_version"] = to_version
    db.execute(update(SwapBoundary).where(*where).values(**values))
    if outcome != sb.FAILED:
        return []
    mark = update(Completion).where(
        Completion.backend_id == backend_id,
        Completion.crossed_epochs.is_not(None),
        Completion.crossed_epochs.contains([epoch]),
    )
    marked = db.execute(
        add_reason(mark, Completion.ineligible_reasons, SERVED_UNVERIFIED).returning(Completion.id)
    )
    return list(marked.scalars().all())
