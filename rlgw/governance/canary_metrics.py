"""A canary's live metrics: mean reward of the sessions pinned to the candidate vs the sessions
the promoted version served over the same time, both counted once rewarded and closed.

Shared by the trainer (which judges the canary) and `GET /admin/models/{name}/gate`. Only sessions
meant for training (`train`) whose tenant consents to the model count: the evidence that promotes
a version is the same data that may train it. A session with completions of any other version of
the model (it began before a swap) counts on neither side.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from rlgw.db.models import RegisteredModel
from rlgw.session_status import FINISHED_SQL

from .consent import consented_sql

_METRICS = text(
    f"""
    WITH returns AS (
        SELECT s.pinned_model = :model AND s.pinned_version = :candidate AS canary,
               s.pinned_version IS NULL AND NOT EXISTS (
                   SELECT 1 FROM completions c WHERE c.session_id = s.id AND c.model = :model
                     AND c.policy_version IS DISTINCT FROM :promoted) AS control,
               (SELECT sum(r.value) FROM rewards r
                  LEFT JOIN completions rc ON rc.id = r.completion_id
                 WHERE r.session_id = s.id
                   AND (rc.id IS NULL OR rc.orphan_reason IS NULL)) AS value
        FROM sessions s
        WHERE s.created_at >= :since AND s.train
          AND s.status IN {FINISHED_SQL}
          AND EXISTS (SELECT 1 FROM completions c WHERE c.session_id = s.id AND c.model = :model)
          AND {consented_sql("s")}
    )
    SELECT count(*) FILTER (WHERE canary), avg(value) FILTER (WHERE canary),
           count(*) FILTER (WHERE control), avg(value) FILTER (WHERE control)
    FROM returns WHERE value IS NOT NULL AND (canary OR control)
    """
)


@dataclass(frozen=True)
class CanaryMetrics:
    candidate: int
    promoted: int
    canary_sessions: int
    canary_mean: float | None
    control_sessions: int
    control_mean: float | None

    def as_dict(self) -> dict:
        return dict(vars(self))


def canary_metrics(db: Session, model: RegisteredModel, consent: str) -> CanaryMetrics | None:
    """The running canary's metrics; None when none runs."""
    if model.candidate_version is None or model.canary_started_at is None:
        return None
    row = db.execute(
        _METRICS,
        {
            "model": model.name,
            "candidate": model.candidate_version,
            "promoted": model.current_version,
            "since": model.canary_started_at,
            "consent_default": consent == "all",
        },
    ).one()
    return CanaryMetrics(
        model.candidate_version,
        model.current_version,
        int(row[0]),
        None if row[1] is None else float(row[1]),
        int(row[2]),
        None if row[3] is None else float(row[3]),
    )
