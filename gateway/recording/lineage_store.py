"""Applies retry lineage inside the recording transaction, under the session's row lock."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rlgw.db.models import AgentSession, Completion

from .lineage import LineageRow, find_parent, resolve_orphans
from .record import CompletionRecord


async def link_into_session(
    db: AsyncConnection, session_id: str, new: list[CompletionRecord]
) -> None:
    """Give each new record its parent, its orphan reason and its session's status; re-mark the
    earlier completions whose orphan reason changed."""
    status = (
        await db.execute(
            select(AgentSession.status).where(AgentSession.id == session_id).with_for_update()
        )
    ).scalar_one()
    existing = (
        await db.execute(
            select(
                Completion.id,
                Completion.api,
                Completion.created_at,
                Completion.retry_group,
                Completion.parent_id,
                Completion.continuation_hash,
                Completion.continuation_len,
                Completion.sibling_group,
                Completion.orphan_reason,
            ).where(Completion.session_id == session_id)
        )
    ).all()
    rows = [LineageRow(*r[:8]) for r in existing]
    before = {r.id: r.orphan_reason for r in existing}
    for rec in sorted(new, key=lambda r: (r.created_at, r.id)):
        rec.parent_id = find_parent(rec.api, rec.sequence or [], rows)
        rows.append(
            LineageRow(
                rec.id,
                rec.api,
                rec.created_at,
                rec.retry_group,
                rec.parent_id,
                rec.continuation_hash,
                rec.continuation_len,
                rec.sibling_group,
            )
        )
        rec.session_status = status  # a session no longer open excludes it from training
    reasons = resolve_orphans(rows)
    for rec in new:
        rec.orphan_reason = reasons[rec.id]
    for completion_id, old_reason in before.items():
        if reasons[completion_id] != old_reason:
            await db.execute(
                update(Completion)
                .where(Completion.id == completion_id)
                .values(orphan_reason=reasons[completion_id])
            )
