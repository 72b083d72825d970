"""Rolling a model back to an earlier version: every backend gets that version's full weights
(rebuilt by trainer/publishing/versions.py) through the verified swap, and training continues from
it.

Carried out for a request in the audit log (rlgw/governance/rollbacks.py), made by
`rlgw rollback` (which carries it out at once) or `POST /admin/models/{name}/rollback` (carried
out by the model's trainer, at its next poll). In the transaction that takes the request: the
target becomes the model's current version (status promoted), the versions rolled back past (on
the old version's lineage but not the target's) become `rolled_back`, a candidate being judged is
rejected, and the gateways are told; from then on no unpinned session reaches a backend that
still serves a rolled-back version. Then the backends are swapped, one at a time. Numbers are
never reused: the next version trained is numbered after the newest, with the target as parent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select

from rlgw import backend_state as bs
from rlgw.db.models import AuditEvent, PolicyVersion, RegisteredModel
from rlgw.governance import rollbacks
from rlgw.governance.version_status import PROMOTED, REJECTED, ROLLED_BACK
from rlgw.version_lineage import lineage

from ..swap.coordinator import SwapReport
from .publish import Publisher
from .versions import materialize


@dataclass
class RollbackOutcome:
    request_id: int
    from_version: int | None
    to_version: int
    state: str  # done | failed (refused: nothing changed)
    reason: str | None = None
    swaps: list[SwapReport] = field(default_factory=list)


def _take(db, publisher: Publisher, event: AuditEvent) -> tuple[int, str | None]:
    """The database half, in the caller's transaction: (the version rolled back from, why it was
    refused or None)."""
    name = publisher.model.name
    db.scalar(select(RegisteredModel).where(RegisteredModel.name == name).with_for_update())
    try:  # under the model's row lock, which publishers and the gate take too
        model, _ = rollbacks.target(db, name, event.to_version)
    except rollbacks.RollbackRefused as exc:
        return event.from_version, str(exc)
    old, new = model.current_version, event.to_version
    rows = {
        r.version: r
        for r in db.scalars(select(PolicyVersion).where(PolicyVersion.model_id == model.id))
    }
    keep = lineage(db, model.id, new)
    for version in lineage(db, model.id, old):
        if version not in keep:
            rows[version].status = ROLLED_BACK
    rows[new].status = PROMOTED
    if model.candidate_version is not None:
        candidate = rows[model.candidate_version]
        candidate.status = REJECTED
        candidate.gate_report = {
            **(candidate.gate_report or {}),
            "verdict": REJECTED,
            "reason": f"superseded by rollback {event.id} to version {new}",
        }
    model.current_version = new
    model.candidate_version = model.canary_share = model.canary_started_at = None
    db.execute(bs.NOTIFY, bs.model_notify_args(model.id))
    return old, None


def carry_out(
    publisher: Publisher, request_id: int, *, log: Callable[[str], None] = print
) -> RollbackOutcome | None:
    """Carry out a pending rollback request; None when it is not pending (someone else took it)."""
    with publisher.db_sessions() as db, db.begin():
        event = db.get(AuditEvent, request_id, with_for_update=True)
        if event is None or event.state != rollbacks.PENDING:
            return None
        old, refused = _take(db, publisher, event)
        event.from_version = old
        event.state = rollbacks.FAILED if refused else rollbacks.RUNNING
        if refused:
            event.detail, event.finished_at = {"refused": refused}, datetime.now(UTC)
        target = event.to_version
    if refused:
        log(f"[rollback] request {request_id} refused: {refused}")
        return RollbackOutcome(request_id, old, target, rollbacks.FAILED, refused)
    log(f"[rollback] {publisher.model.name}: version {old} -> {target} (request {request_id})")
    with publisher.db_sessions() as db:
        reference = materialize(db, publisher.model, target)
    swaps = publisher.sync(target, reference)
    with publisher.db_sessions() as db, db.begin():
        event = db.get(AuditEvent, request_id)
        event.state, event.finished_at = rollbacks.DONE, datetime.now(UTC)
        event.detail = {
            "swaps": {str(r.backend_id): r.outcome for r in swaps},
            "reasons": {str(r.backend_id): r.reason for r in swaps if r.reason},
        }
    return RollbackOutcome(request_id, old, target, rollbacks.DONE, None, swaps)


def carry_out_pending(
    publisher: Publisher, *, log: Callable[[str], None] = print
) -> list[RollbackOutcome]:
    """Every rollback of the model asked for over the admin API and not carried out yet."""
    with publisher.db_sessions() as db:
        ids = [e.id for e in rollbacks.pending(db, publisher.model.name)]
    outcomes = [carry_out(publisher, i, log=log) for i in ids]
    return [o for o in outcomes if o is not None]
