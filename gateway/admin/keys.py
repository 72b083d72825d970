"""Admin routes for agent keys: mint (the key is shown once), list (never a secret), revoke."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from rlgw import agent_keys
from rlgw.db.models import AgentKey

from ..deps import AdminDep, ContextDep, DbDep
from ..errors import APIError

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
