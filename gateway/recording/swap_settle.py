"""Settling a record's swap doubt when it is written: which version sampled each output token.

A record whose backend was paused by a swap since its lease (its epoch moved on) is matched to the
boundaries those pauses recorded (rlgw/swap_boundaries.py). Resolved: the record gets one version
per output token (`output_versions`, kept only when they differ), its `policy_version` becomes its
first token's, and the pauses it went through (`crossed_epochs`) so that a swap whose new weights
then fail verification can mark it. Unresolved: it stays ineligible, with the reason.

The writer takes the boundary lock of each backend shared first: a swap holds it exclusively from
the epoch bump until its counts are stored, so a record never reads a boundary half written; and
the boundary rows are read FOR SHARE, so a swap marking its boundary failed waits for this
transaction and then sees (and marks) the records it wrote.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rlgw import swap_boundaries as sb
from rlgw.db.models import Backend, SwapBoundary
from rlgw.eligibility import CROSSED_SWAP, NOT_FOLLOWING, SERVED_UNVERIFIED

from .record import CompletionRecord

_SETTLED = (CROSSED_SWAP, NOT_FOLLOWING)


async def settle_swap_doubts(conn: AsyncConnection, records: list[CompletionRecord]) -> None:
    """Resolve the swap doubt of every record in `records` that has one (in the writer's
    transaction)."""
    doubtful = [
        r
        for r in records
        if r.swap_doubt in _SETTLED and r.backend_id is not None and r.lease_epoch is not None
    ]
    if not doubtful:
        return
    backend_ids = sorted({r.backend_id for r in doubtful if r.backend_id is not None})
    for backend_id in backend_ids:  # a fixed order: no deadlock between writers
        await conn.execute(select(func.pg_advisory_xact_lock_shared(sb.LOCK_NAMESPACE, backend_id)))
    epochs = dict(
        (
            await conn.execute(
                select(Backend.id, Backend.swap_epoch).where(Backend.id.in_(backend_ids))
            )
        ).all()
    )
    oldest = min(r.lease_epoch for r in doubtful if r.lease_epoch is not None)
    rows = (
        await conn.execute(
            select(SwapBoundary)
            .where(SwapBoundary.backend_id.in_(backend_ids), SwapBoundary.epoch > oldest)
            .order_by(SwapBoundary.backend_id, SwapBoundary.epoch)
            .with_for_update(read=True)
        )
    ).all()
    boundaries: dict[int, list[sb.Boundary]] = {}
    for row in rows:
        boundaries.setdefault(row.backend_id, []).append(
            sb.Boundary(
                epoch=row.epoch,
                from_version=row.from_version,
                to_version=row.to_version,
                outcome=row.outcome,
                running=row.running,
                finished=frozenset(row.finished or ()),
            )
        )
    for r in doubtful:
        _settle(r, epochs.get(r.backend_id), boundaries.get(r.backend_id, []))


def _settle(r: CompletionRecord, current: int | None, boundaries: list[sb.Boundary]) -> None:
    assert r.lease_epoch is not None
    if current is None:  # the backend is gone from the registry
        r.swap_doubt = CROSSED_SWAP
        return
    if current == r.lease_epoch:
        r.swap_doubt = None  # no pause since the lease
        return
    n = len(r.output_token_ids)
    resolved = sb.resolve(
        key=sb.request_key(r.id),
        lease_version=r.policy_version,
        lease_epoch=r.lease_epoch,
        n_tokens=n,
        boundaries=boundaries,
        current_epoch=current,
    )
    if resolved.versions is None:
        r.swap_doubt = SERVED_UNVERIFIED if resolved.unverified else CROSSED_SWAP
        return
    r.swap_doubt = None
    r.crossed_epochs = list(range(r.lease_epoch + 1, current + 1))
    if n:
        r.policy_version = resolved.policy_version
        if len(set(resolved.versions)) > 1:
            r.output_versions = resolved.versions
