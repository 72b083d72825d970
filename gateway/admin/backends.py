"""Admin routes for backends and policy versions: inspect, drain, resume (after a check)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field
from sqlalchemy import select

from rlgw import backend_state
from rlgw.db.models import Backend, PolicyVersion, RegisteredModel
from rlgw.registry import version_label

from ..deps import AdminDep, ContextDep, DbDep
from ..errors import APIError
from ..proxy.routing import BackendView

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])
# Backend ids are Postgres integers: a larger number is a 422, not a database error.
BackendId = Annotated[int, Path(ge=1, le=2**31 - 1)]


class HeardPublic(BaseModel):
    state: str
    served_version: int | None
    swap_epoch: int
    at: float  # when this process learnt it (Unix time): compare with the row's updated_at


class BackendPublic(BaseModel):
    id: int
    model: str
    url: str
    state: str
    state_reason: str | None
    served_version: int | None
    swap_epoch: int
    in_flight_here: int
    reachable_here: bool
    unreachable_reason: str | None
    updated_at: datetime
    heard_here: list[HeardPublic]  # the last registry changes this process learnt, oldest first


class VersionPublic(BaseModel):
    model: str
    version: int
    parent_version: int | None
    kind: str
    weights_path: str | None
    checksum: str | None
    metrics: dict[str, Any]
    status: str = Field(description="candidate | promoted | rejected | rolled_back")
    gate_report: dict[str, Any] | None = Field(
        description="its promotion gate: scores, canary metrics, verdict and reason"
    )
    created_at: datetime


def _public(backend: Backend, model: str, here: BackendView | None) -> BackendPublic:
    """A registry row with this process's own view of the backend (`here`; None for one added
    since the pool last read the registry: nothing in flight, not known to be unreachable)."""
    return BackendPublic(
        id=backend.id,
        model=model,
        url=backend.url,
        state=backend.state,
        state_reason=backend.state_reason,
        served_version=backend.served_version,
        swap_epoch=backend.swap_epoch,
        in_flight_here=here.in_flight if here else 0,
        reachable_here=here.reachable if here else True,
        unreachable_reason=here.unreachable_reason if here else None,
        updated_at=backend.updated_at,
        heard_here=[HeardPublic(**vars(h)) for h in here.heard] if here else [],
    )


async def _backends(db: DbDep, ctx: ContextDep, backend_id: int | None = None):
    query = select(Backend, RegisteredModel.name).join(RegisteredModel).order_by(Backend.id)
    if backend_id is not None:
        query = query.where(Backend.id == backend_id)
    here = {view.id: view for view in ctx.pool.backends()}
    return [_public(b, name, here.get(b.id)) for b, name in (await db.execute(query)).all()]


async def _change(
    db: DbDep, ctx: ContextDep, backend_id: int, state: str, reason: str | None
) -> BackendPublic:
    await db.execute(backend_state.set_state(backend_id, state, reason))
    await db.execute(backend_state.NOTIFY, backend_state.notify_args(backend_id))
    await db.commit()
    await ctx.pool.refresh()
    (backend,) = await _backends(db, ctx, backend_id)
    return backend


async def _existing(db: DbDep, backend_id: int) -> Backend:
    backend = await db.get(Backend, backend_id)
    if backend is None:
        raise APIError(404, f"no backend {backend_id}", code="backend_not_found")
    return backend


@router.get("/backends", response_model=list[BackendPublic])
async def list_backends(db: DbDep, ctx: ContextDep) -> list[BackendPublic]:
    return await _backends(db, ctx)


@router.post("/backends/{backend_id}/drain", response_model=BackendPublic)
async def drain_backend(backend_id: BackendId, db: DbDep, ctx: ContextDep) -> BackendPublic:
    """Take the backend out of routing; requests already on it finish."""
    await _existing(db, backend_id)
    return await _change(db, ctx, backend_id, backend_state.DRAINING, "drained by an admin")


@router.post("/backends/{backend_id}/resume", response_model=BackendPublic)
async def resume_backend(backend_id: BackendId, db: DbDep, ctx: ContextDep) -> BackendPublic:
    """Put the backend back into routing, only if it serves exactly the version on record."""
    backend = await _existing(db, backend_id)
    if backend.served_version is None:
        raise APIError(
            409,
            "the backend's served version is unknown: push weights to it first",
            code="version_unknown",
        )
    try:
        reply = await ctx.http.get(f"{backend.url}/weight_info", timeout=5.0)
        label = str(reply.json().get("weight_version"))
        paused = (await ctx.http.get(f"{backend.url}/is_paused", timeout=5.0)).json()
    except Exception as exc:
        raise APIError(
            409, f"the backend does not answer: {type(exc).__name__}", code="backend_unreachable"
        ) from exc
    if label != version_label(backend.served_version):
        raise APIError(
            409,
            f"the backend reports weight version {label!r}, the registry "
            f"{backend.served_version}: it stays out of routing",
            code="version_mismatch",
        )
    if isinstance(paused, dict) and paused.get("is_paused"):
        await ctx.http.post(f"{backend.url}/resume", timeout=10.0)
    return await _change(db, ctx, backend_id, backend_state.ACTIVE, None)


@router.get("/versions", response_model=list[VersionPublic])
async def list_versions(db: DbDep) -> list[VersionPublic]:
    rows = (
        await db.execute(
            select(PolicyVersion, RegisteredModel.name)
            .join(RegisteredModel)
            .order_by(RegisteredModel.name, PolicyVersion.version)
        )
    ).all()
    return [
        VersionPublic(
            model=name,
            version=v.version,
            parent_version=v.parent_version,
            kind=v.kind,
            weights_path=v.weights_path,
            checksum=v.checksum,
            metrics=v.metrics,
            status=v.status,
            gate_report=v.gate_report,
            created_at=v.created_at,
        )
        for v, name in rows
    ]
