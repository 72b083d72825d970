"""The per-task baseline's state, read from Postgres: the mean return of the latest consumed
sessions of each task_id on a model. Nothing is kept in the trainer, so a restarted trainer
(or another one) continues with the same baselines."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.orm import Session

TASK_WINDOW = 64  # the latest consumed sessions per task_id that the mean is taken over


def task_means(
    db: Session, model_id: int, task_ids: Iterable[str], window: int = TASK_WINDOW
) -> dict[str, float]:
    """task_id -> mean return (sum of counting rewards: none on a retry orphan) over its latest
    `window` sessions consumed by this model; tasks without any are absent. Summed in numeric:
    float8 arithmetic in Postgres raises on overflow, and rewards may be as large as any finite
    float."""
    tasks = sorted(set(task_ids))
    if not tasks:
        return {}
    rows = db.execute(
        text(
            "SELECT t.task_id, avg(r.ret) FROM unnest(CAST(:tasks AS text[])) AS t(task_id) "
            "CROSS JOIN LATERAL ("
            "  SELECT (SELECT sum(CAST(rw.value AS numeric)) FROM rewards rw "
            "          LEFT JOIN completions c ON c.id = rw.completion_id "
            "          WHERE rw.session_id = s.id AND c.orphan_reason IS NULL) AS ret "
            "  FROM sessions s WHERE s.task_id = t.task_id AND s.status = 'consumed' "
            "  AND EXISTS (SELECT 1 FROM consumption k "
            "              WHERE k.session_id = s.id AND k.model_id = :model_id) "
            "  ORDER BY s.consumed_at DESC LIMIT :window) r "
            "WHERE r.ret IS NOT NULL GROUP BY t.task_id"
        ),
        {"tasks": tasks, "model_id": model_id, "window": window},
    ).all()
    return {task: float(mean) for task, mean in rows}
