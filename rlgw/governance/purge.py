"""Purging a tenant's data: its sessions, completions, rewards and groups, sessions waiting for
a claim included. Refused while an update holds a claim on one of them; what was already trained
into a version is reported, and the ledger keeps the tenant and token counts of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from rlgw.session_status import SessionStatus

from . import audit


class ClaimInUpdate(Exception):
    """Sessions of the tenant are claimed by a trainer update that has not committed."""

    def __init__(self, tenant: str, count: int) -> None:
        super().__init__(
            f"{count} session(s) of tenant {tenant} are claimed by a training update that has "
            "not committed: retry once it has (a stopped trainer's claims are released when a "
            "trainer starts)"
        )
        self.count = count


@dataclass
class PurgeResult:
    tenant: str
    sessions: int = 0
    completions: int = 0
    rewards: int = 0
    groups: int = 0
    # Versions whose update consumed this tenant's data: model, version, completions and tokens
    # trained on (the weights keep what they learnt; the ledger keeps these counts).
    trained_into: list[dict[str, Any]] = field(default_factory=list)


_IDS = bindparam("ids", type_=ARRAY(Text))
_TRAINED_INTO = text(
    """
    SELECT m.name, c.version, count(*) FILTER (WHERE c.used),
           COALESCE(sum(c.tokens) FILTER (WHERE c.used), 0)
    FROM consumption c JOIN models m ON m.id = c.model_id
    WHERE c.tenant = :tenant OR c.session_id = ANY(:ids)
    GROUP BY m.name, c.version ORDER BY m.name, c.version
    """
).bindparams(_IDS)


def purge_tenant(db: Session, tenant: str, actor: str) -> PurgeResult:
    """Delete everything recorded for `tenant`, in the caller's transaction (audited)."""
    rows = db.execute(
        text("SELECT id, status FROM sessions WHERE tenant = :t ORDER BY id FOR UPDATE"),
        {"t": tenant},
    ).all()
    claimed = sum(status == SessionStatus.CLAIMED for _, status in rows)
    if claimed:
        raise ClaimInUpdate(tenant, claimed)
    ids = [session_id for session_id, _ in rows]
    result = PurgeResult(tenant, sessions=len(ids))
    trained = db.execute(_TRAINED_INTO, {"tenant": tenant, "ids": ids})
    result.trained_into = [
        {"model": model, "version": version, "completions": used, "tokens": int(tokens)}
        for model, version, used, tokens in trained
    ]
    params = {"ids": ids, "t": tenant}
    result.completions = db.execute(
        text("SELECT count(*) FROM completions WHERE session_id = ANY(:ids)").bindparams(_IDS),
        params,
    ).scalar_one()
    result.rewards = db.execute(
        text("SELECT count(*) FROM rewards WHERE session_id = ANY(:ids)").bindparams(_IDS), params
    ).scalar_one()
    # Completions and rewards go with their sessions (ON DELETE CASCADE); the ledger's rows
    # stay, their session and completion set to null (ON DELETE SET NULL), the tenant kept.
    db.execute(text("DELETE FROM sessions WHERE id = ANY(:ids)").bindparams(_IDS), params)
    result.groups = db.execute(text("DELETE FROM groups WHERE tenant = :t"), params).rowcount
    audit.record(
        db,
        "purge",
        actor=actor,
        tenant=tenant,
        detail={
            "sessions": result.sessions,
            "completions": result.completions,
            "rewards": result.rewards,
            "groups": result.groups,
            "trained_into": result.trained_into,
        },
    )
    return result
