"""Admin routes for agent keys: mint (the key is shown once), list (never a secret), revoke, and
the key's training consent (it may narrow its tenant's, never widen it)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from rlgw import agent_keys
from rlgw.db.models import AgentKey
from rlgw.governance import audit, consent

from ..auth import client_address
from ..deps import AdminDep, ContextDep, DbDep
from ..errors import APIError
from .known_models import require_registered
from .register import MODEL_NAME_PATTERN

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])


class AgentKeyCreate(BaseModel):
    tenant: str = Field(
        pattern=agent_keys.TENANT_PATTERN,
        description="The tenant the key acts for: it sees and creates only this tenant's sessions.",
    )
    name: str | None = Field(
        default=None, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$", description="A label."
    )


class AgentKeyPublic(BaseModel):
    id: str
    tenant: str
    name: str | None
    hint: str = Field(description="The key's first characters; the key itself is not stored.")
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: AgentKey) -> AgentKeyPublic:
        return cls(
            id=row.id,
            tenant=row.tenant,
            name=row.name,
            hint=row.hint,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
        )


class AgentKeyMinted(AgentKeyPublic):
    key: str = Field(description="The key. Shown this once: only its SHA-256 is stored.")


KeyId = Annotated[str, Path(pattern=agent_keys.KEY_ID_PATTERN)]


@router.post("/agent_keys", status_code=201, response_model=AgentKeyMinted)
async def mint_agent_key(body: AgentKeyCreate, db: DbDep) -> AgentKeyMinted:
    async with db.begin():
        row, key = await db.run_sync(lambda s: agent_keys.mint(s, body.tenant, body.name))
    return AgentKeyMinted(**AgentKeyPublic.of(row).model_dump(), key=key)


@router.get("/agent_keys", response_model=list[AgentKeyPublic])
async def list_agent_keys(
    db: DbDep,
    tenant: Annotated[str | None, Query(pattern=agent_keys.TENANT_PATTERN)] = None,
) -> list[AgentKeyPublic]:
    rows = await db.run_sync(lambda s: agent_keys.list_keys(s, tenant))
    return [AgentKeyPublic.of(r) for r in rows]


@router.delete("/agent_keys/{key_id}", response_model=AgentKeyPublic)
async def revoke_agent_key(key_id: KeyId, db: DbDep, ctx: ContextDep) -> AgentKeyPublic:
    """Revoke a key and every session token minted with it."""
    async with db.begin():
        row = await db.run_sync(lambda s: agent_keys.revoke(s, key_id))
        if row is None:
            raise APIError(404, f"no agent key {key_id}", code="agent_key_not_found")
        public = AgentKeyPublic.of(row)
    ctx.auth.forget(key_id)
    return public


class KeyPolicyPublic(BaseModel):
    key_id: str
    tenant: str
    models: Literal["inherit", "none"] | list[str] = Field(
        description="The key's own setting: inherit its tenant's consent, none, or at most these."
    )
    effective: Literal["all", "none"] | list[str] = Field(
        description="What the key's sessions may train: the tenant's consent, narrowed by the key."
    )


class KeyPolicyUpdate(BaseModel):
    models: Literal["inherit", "none"] | list[Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]] = (
        Field(
            description="inherit (the tenant's consent), none, or the registered models the "
            "key's sessions may train at most (never more than the tenant's consent)."
        )
    )
    actor: str | None = Field(default=None, max_length=64, pattern=r"^[^\x00-\x1f\x7f]*$")


def _key_or_404(db, key_id: str) -> AgentKey:
    row = db.get(AgentKey, key_id)
    if row is None:
        raise APIError(404, f"no agent key {key_id}", code="agent_key_not_found")
    return row


@router.get("/agent_keys/{key_id}/training-policy", response_model=KeyPolicyPublic)
async def read_key_policy(key_id: KeyId, db: DbDep, ctx: ContextDep) -> KeyPolicyPublic:
    default = ctx.settings.training_consent
    policy = await db.run_sync(lambda s: consent.key_effective(s, _key_or_404(s, key_id), default))
    return KeyPolicyPublic(**vars(policy))


@router.put("/agent_keys/{key_id}/training-policy", response_model=KeyPolicyPublic)
async def set_key_policy(
    key_id: KeyId, body: KeyPolicyUpdate, request: Request, db: DbDep, ctx: ContextDep
) -> KeyPolicyPublic:
    """Narrow what the key's sessions may train (or inherit the tenant's consent again); applies
    to every session of the key not consumed yet (the trainer checks it when it claims)."""
    actor = audit.api_actor(body.actor, client_address(request))
    default = ctx.settings.training_consent
    async with db.begin():
        await require_registered(db, body.models)
        policy = await db.run_sync(
            lambda s: consent.put_key(s, _key_or_404(s, key_id), body.models, actor, default)
        )
    return KeyPolicyPublic(**vars(policy))
