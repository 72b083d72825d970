"""`rlgw export`: trajectories (or their training views) as JSON Lines, one session per line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TextIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession
from rlgw.training_view import TrainingView, load_training_view
from rlgw.trajectory import Trajectory, load_trajectory


def select_session_ids(
    db: Session,
    *,
    session_id: str | None = None,
    group_id: str | None = None,
    since: datetime | None = None,
) -> list[str]:
    """Exactly one selector: a session, a group, or everything created since a time."""
    if sum(x is not None for x in (session_id, group_id, since)) != 1:
        raise ValueError("give exactly one of --session, --group, --since")
    if session_id is not None:
        return [session_id]
    query = select(AgentSession.id).order_by(AgentSession.created_at, AgentSession.id)
    if group_id is not None:
        query = query.where(AgentSession.group_id == group_id)
    else:
        query = query.where(AgentSession.created_at >= since)
    return list(db.scalars(query))


def iter_trajectories(db: Session, session_ids: list[str]) -> Iterator[Trajectory]:
    now = datetime.now(UTC)
    for sid in session_ids:
        trajectory = load_trajectory(db, sid, now)
        if trajectory is not None:
            yield trajectory


def iter_training_views(db: Session, session_ids: list[str]) -> Iterator[TrainingView]:
    now = datetime.now(UTC)
    for sid in session_ids:
        view = load_training_view(db, sid, now)
        if view is not None:
            yield view


def write_jsonl(db: Session, session_ids: list[str], out: TextIO, view: str = "record") -> int:
    """One line per session: its trajectory (view `record`) or its training view (`training`)."""
    rows = iter_training_views if view == "training" else iter_trajectories
    count = 0
    for row in rows(db, session_ids):
        out.write(row.model_dump_json() + "\n")
        count += 1
    return count


def parse_since(value: str) -> datetime:
    """An ISO 8601 time; without a zone it is taken as UTC."""
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def export_command(
    url: str,
    *,
    session_id: str | None,
    group_id: str | None,
    since: str | datetime | None,
    out_path: str | None,
    view: str = "record",
) -> int:
    """Write the selected sessions (`view`: record | training); 1 (and a message) when a named
    session or group has none."""
    from rlgw.db.engine import make_sync_engine, sync_session_factory

    engine = make_sync_engine(url)
    try:
        with sync_session_factory(engine)() as db:
            ids = select_session_ids(
                db,
                session_id=session_id,
                group_id=group_id,
                since=parse_since(since) if isinstance(since, str) else since,
            )
            if out_path in (None, "-"):
                count = write_jsonl(db, ids, sys.stdout, view)
            else:
                with open(out_path, "w", encoding="utf-8") as out:
                    count = write_jsonl(db, ids, out, view)
    finally:
        engine.dispose()
    print(f"[rlgw] exported {count} session(s)", file=sys.stderr)
    if count == 0 and session_id is not None:
        print(f"rlgw export: no session {session_id!r}", file=sys.stderr)
        return 1
    if count == 0 and group_id is not None:
        print(f"rlgw export: no session in group {group_id!r}", file=sys.stderr)
        return 1
    return 0
