"""Agent keys: minted with 256 bits from the OS's CSPRNG, shown once, stored as SHA-256 only.

A key is looked up by its hash (`key_hash` is unique), so checking one never compares secrets
byte by byte; a fast hash suits a high-entropy random token (no password stretching needed).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from rlgw.db.models import AgentKey

KEY_PREFIX = "rlgw_ak_"
KEY_PATTERN = re.compile(r"^rlgw_ak_[A-Za-z0-9_-]{43}$")
KEY_ID_PATTERN = r"^ak_[0-9a-f]{24}$"
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
HINT_LENGTH = 12


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def looks_like_key(credential: str) -> bool:
    return bool(KEY_PATTERN.match(credential))


def mint(db: Session, tenant: str, name: str | None = None) -> tuple[AgentKey, str]:
    """A new key of `tenant`, in the caller's transaction: the row and the key (shown once)."""
    if not re.match(TENANT_PATTERN, tenant):
        raise ValueError("tenant must be 1-64 letters, digits and . _ : - (starting alphanumeric)")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = AgentKey(
        id="ak_" + secrets.token_hex(12),
        tenant=tenant,
        name=name,
        key_hash=hash_key(key),
        hint=key[:HINT_LENGTH],
    )
    db.add(row)
    db.flush()
    db.refresh(row)
    return row, key


def list_keys(db: Session, tenant: str | None = None) -> list[AgentKey]:
    query = select(AgentKey).order_by(AgentKey.created_at, AgentKey.id)
    if tenant is not None:
        query = query.where(AgentKey.tenant == tenant)
    return list(db.scalars(query))


def revoke(db: Session, key_id: str) -> AgentKey | None:
    """Revoke a key (and every session token minted with it); None if there is no such key.
    Revoking twice keeps the first time."""
    row = db.get(AgentKey, key_id, with_for_update=True)
    if row is not None and row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
    return row
