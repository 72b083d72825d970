"""Admin routes on a tenant's data: its training consent, and purging everything it recorded."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from rlgw import agent_keys
from rlgw.governance import audit, consent
from rlgw.governance.purge import ClaimInUpdate, purge_tenant

from ..auth import client_address
from ..deps import AdminDep, ContextDep, DbDep
from ..errors import APIError, ErrorResponse
from .known_models import require_registered
from .register import MODEL_NAME_PATTERN

router = APIRouter(
    prefix="/admin/tenants",
    tags=["admin"],
    dependencies=[AdminDep],
    responses={400: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)
Tenant = Annotated[str, Path(pattern=agent_keys.TENANT_PATTERN, description="The tenant.")]
ModelName = Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]


class PolicyPublic(BaseModel):
    tenant: str
    models: Literal["all", "none"] | list[str] = Field(
        description="What its sessions may train: every model, none, or these."
    )
    source: str = Field(description="tenant: its own policy; default: RLGW_TRAINING_CONSENT")
    updated_by: str | None
    updated_at: datetime | None


class PolicyUpdate(BaseModel):
    models: Literal["all", "none"] | list[ModelName] = Field(
        description="all, none, or the registered models its sessions may train.",
    )
    actor: str | None = Field(default=None, max_length=64, pattern=r"^[^\x00-\x1f\x7f]*$")


class PurgePublic(BaseModel):
    tenant: str
    sessions: int
    completions: int
    rewards: int
    groups: int
    trained_into: list[dict[str, Any]] = Field(
        description="Versions whose update trained on this tenant's data (model, version, "
        "completions, tokens): the purge cannot take it out of their weights; the ledger keeps "
        "these counts and the tenant, without the deleted ids."
    )


@router.get("/{tenant}/training-policy", response_model=PolicyPublic)
async def read_policy(tenant: Tenant, db: DbDep, ctx: ContextDep) -> PolicyPublic:
    default = ctx.settings.training_consent
    policy = await db.run_sync(lambda s: consent.effective(s, tenant, default))
    return PolicyPublic(**vars(policy))


@router.put("/{tenant}/training-policy", response_model=PolicyPublic)
async def set_policy(
    tenant: Tenant, body: PolicyUpdate, request: Request, db: DbDep
) -> PolicyPublic:
    """Which models the tenant's sessions may train; applies to every session not consumed yet
    (the trainer checks it when it claims)."""
    actor = audit.api_actor(body.actor, client_address(request))
    async with db.begin():
        await require_registered(db, body.models)
        policy = await db.run_sync(lambda s: consent.put(s, tenant, body.models, actor))
    return PolicyPublic(**vars(policy))


@router.delete("/{tenant}/data", response_model=PurgePublic)
async def purge(tenant: Tenant, request: Request, db: DbDep) -> PurgePublic:
    """Delete the tenant's sessions, completions, rewards and groups, those waiting for
    training included; 409 while a training update holds a claim on one of them."""
    actor = audit.api_actor(None, client_address(request))
    try:
        async with db.begin():
            result = await db.run_sync(lambda s: purge_tenant(s, tenant, actor))
    except ClaimInUpdate as exc:
        raise APIError(409, str(exc), code="claim_in_progress") from None
    return PurgePublic(**vars(result))
