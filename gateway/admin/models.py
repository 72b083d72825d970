"""Admin routes on what may change a model: its promotion gate and canary, rollbacks, the audit
log (docs/governance.md). Gates are set with `rlgw gate set`; a rollback asked for here is
carried out by the model's trainer."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import select

from rlgw.db.models import AuditEvent, PromotionGate
from rlgw.governance import audit, rollbacks
from rlgw.governance.canary_metrics import canary_metrics

from ..auth import client_address
from ..deps import AdminDep, ContextDep, DbDep
from ..errors import APIError, ErrorResponse
from .register import MODEL_NAME_PATTERN

router = APIRouter(
    prefix="/admin",
    tags=["admin"],
    dependencies=[AdminDep],
    responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)
ModelName = Annotated[str, Path(pattern=MODEL_NAME_PATTERN, description="The model's name.")]
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"


class AuditPublic(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    model: str | None
    tenant: str | None
    from_version: int | None
    to_version: int | None
    reason: str | None
    detail: dict[str, Any]
    state: str | None = Field(description="rollbacks: pending | running | done | failed")
    finished_at: datetime | None

    @classmethod
    def of(cls, row: AuditEvent) -> AuditPublic:
        return cls(**{name: getattr(row, name) for name in cls.model_fields})


class RollbackCreate(BaseModel):
    to: int = Field(ge=0, le=2**31 - 1, description="The version to put every backend on.")
    reason: str | None = Field(default=None, max_length=2000, pattern=PRINTABLE)
    actor: str | None = Field(
        default=None,
        max_length=64,
        pattern=PRINTABLE,
        description="Who asks (recorded beside the admin key's use, unverified).",
    )


class GatePublic(BaseModel):
    model: str
    current_version: int = Field(description="The promoted version.")
    candidate_version: int | None = Field(description="A version its gate is judging.")
    gate: dict[str, Any] | None = Field(description="The gate (null: none); see rlgw gate set.")
    canary: dict[str, Any] | None = Field(description="A running canary and its live metrics.")


def _gate(gate: PromotionGate | None) -> dict[str, Any] | None:
    if gate is None:
        return None
    fields = ("eval_name", "eval_digest", "min_score", "max_drop", "canary", "canary_percent")
    more = ("canary_sessions", "canary_max_drop", "canary_timeout_s", "set_by", "created_at")
    return {k: getattr(gate, k) for k in fields + more} | {"eval_items": len(gate.eval_items)}


async def _model(db: DbDep, name: str):
    try:
        return await db.run_sync(lambda s: rollbacks.model_named(s, name))
    except rollbacks.RollbackRefused as exc:
        raise APIError(exc.status, str(exc), code=exc.code) from None


@router.get("/models/{name:path}/gate", response_model=GatePublic)
async def read_gate(name: ModelName, db: DbDep, ctx: ContextDep) -> GatePublic:
    model = await _model(db, name)
    gate = await db.get(PromotionGate, model.id)
    consent = ctx.settings.training_consent
    metrics = await db.run_sync(lambda s: canary_metrics(s, model, consent))
    canary = None
    if metrics is not None:
        canary = {"share": model.canary_share, "started_at": model.canary_started_at}
        canary |= metrics.as_dict()
    return GatePublic(
        model=name,
        current_version=model.current_version,
        candidate_version=model.candidate_version,
        gate=_gate(gate),
        canary=canary,
    )


@router.post("/models/{name:path}/rollback", status_code=202, response_model=AuditPublic)
async def request_rollback(
    name: ModelName, body: RollbackCreate, request: Request, db: DbDep
) -> AuditPublic:
    """Ask for every backend of the model to be put on version `to` (its full weights, through
    the verified swap) and training to continue from it. Recorded at once (`state` pending);
    the model's trainer carries it out at its next poll (`rlgw rollback` does it at once)."""
    actor = audit.api_actor(body.actor, client_address(request))
    try:
        async with db.begin():
            event = await db.run_sync(
                lambda s: rollbacks.request(s, name, body.to, actor=actor, reason=body.reason)
            )
            public = AuditPublic.of(event)
    except rollbacks.RollbackRefused as exc:
        raise APIError(exc.status, str(exc), code=exc.code) from None
    return public


@router.get("/models/{name:path}/rollbacks", response_model=list[AuditPublic])
async def list_rollbacks(name: ModelName, db: DbDep) -> list[AuditPublic]:
    await _model(db, name)
    rows = await db.scalars(
        select(AuditEvent)
        .where(AuditEvent.model == name, AuditEvent.action == rollbacks.ACTION)
        .order_by(AuditEvent.id)
    )
    return [AuditPublic.of(r) for r in rows]


@router.get("/audit", response_model=list[AuditPublic])
async def read_audit(
    db: DbDep,
    model: Annotated[str | None, Query(pattern=MODEL_NAME_PATTERN)] = None,
    tenant: Annotated[str | None, Query(max_length=64, pattern=PRINTABLE)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditPublic]:
    """The latest governance events, newest first: gates, verdicts, rollbacks, training policies,
    purges, retention sweeps."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if model is not None:
        query = query.where(AuditEvent.model == model)
    if tenant is not None:
        query = query.where(AuditEvent.tenant == tenant)
    return [AuditPublic.of(r) for r in await db.scalars(query)]
