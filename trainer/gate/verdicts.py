"""The gate's verdicts: write one (version status, gate report, audit log, NOTIFY, in the
transaction that decides it, under the model row's lock), then put the backends where it says:
a promoted candidate onto every other backend, a rejected one's backend back on the promoted
version (full weights); both through the verified swap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import torch
from sqlalchemy import select

from rlgw import backend_state as bs
from rlgw.db.models import PolicyVersion, RegisteredModel
from rlgw.governance import audit
from rlgw.governance.version_status import PROMOTED, REJECTED

from ..backends.parity import ProbeScores, reference_scores
from ..publishing.publish import Published, Publisher
from ..publishing.versions import materialize
from ..swap.coordinator import SwapReport
from ..weight_update.stored import stored_update

ACTOR = "gate"


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Verdict:
    version: int
    outcome: str  # promoted | rejected | canary (still being judged) | superseded
    head: int  # the promoted version afterwards: what the trainer continues from
    reason: str
    swaps: list[SwapReport] = field(default_factory=list)


class Verdicts:
    """Writes the verdicts on one model's candidates and carries them out."""

    def __init__(self, publisher: Publisher, *, log: Callable[[str], None] = print) -> None:
        self.publisher, self.log = publisher, log
        self.db_sessions = publisher.db_sessions
        self.model_id, self.model_name = publisher.model.id, publisher.model.name

    def _row(self, db, version: int) -> PolicyVersion:
        return db.scalar(
            select(PolicyVersion).where(
                PolicyVersion.model_id == self.model_id, PolicyVersion.version == version
            )
        )

    def _current(self) -> int:
        with self.db_sessions() as db:
            return db.get(RegisteredModel, self.model_id).current_version

    def decide(self, version: int, status: str, report: dict, reason: str) -> int | None:
        """Write the verdict; the parent version, or None when the candidate is no longer this
        one (a rollback decided it meanwhile)."""
        with self.db_sessions() as db, db.begin():
            model = db.get(RegisteredModel, self.model_id, with_for_update=True)
            if model.candidate_version != version:
                return None
            row = self._row(db, version)
            row.status = status
            decided = {"verdict": status, "reason": reason, "decided_at": _now_iso()}
            row.gate_report = {**(row.gate_report or {}), **report, **decided}
            if status == PROMOTED:
                model.current_version = version
            model.candidate_version = model.canary_share = model.canary_started_at = None
            audit.record(
                db,
                status,
                actor=ACTOR,
                model=self.model_name,
                from_version=row.parent_version,
                to_version=version,
                reason=reason,
                detail={
                    "score": (report.get("eval") or {}).get("score"),
                    "baseline": (report.get("eval") or {}).get("baseline"),
                    "canary": report.get("canary_metrics"),
                },
            )
            db.execute(bs.NOTIFY, bs.model_notify_args(self.model_id))
            return row.parent_version

    def promote(
        self,
        version: int,
        report: dict,
        reason: str,
        *,
        model: torch.nn.Module | None = None,
        reference_old: ProbeScores | None = None,
    ) -> Verdict:
        """The candidate serves all traffic: every other backend gets it, verified."""
        parent = self.decide(version, PROMOTED, report, reason)
        if parent is None:
            return Verdict(version, "superseded", self._current(), reason)
        self.log(f"[gate] version {version} promoted: {reason}")
        with self.db_sessions() as db:
            row = self._row(db, version)
            model = model or materialize(db, self.publisher.model, version)
            if reference_old is None:
                reference_old = reference_scores(materialize(db, self.publisher.model, parent))
        published = Published(
            version,
            parent,
            stored_update(row.kind, row.weights_path, self.publisher.model.name, version),
        )
        rest = [
            b
            for b in self.publisher.coordinator.backends(self.model_id)
            if b.served_version != version
        ]
        swaps = self.publisher.push(published, model, reference_old=reference_old, backends=rest)
        return Verdict(version, PROMOTED, version, reason, swaps)

    def reject(self, version: int, report: dict, reason: str) -> Verdict:
        """The candidate never serves all traffic: its backend gets the promoted version back."""
        parent = self.decide(version, REJECTED, report, reason)
        head = self._current()
        if parent is None:
            return Verdict(version, "superseded", head, reason)
        self.log(f"[gate] version {version} rejected: {reason}")
        with self.db_sessions() as db:
            promoted = materialize(db, self.publisher.model, head)
        return Verdict(version, REJECTED, head, reason, self.publisher.sync(head, promoted))
