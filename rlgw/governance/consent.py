"""Training consent: which models a tenant's (and an agent key's) sessions may train, and the one
SQL test of it.

A tenant's policy (`training_policies`) names every model, none, or a list; a tenant without one
(and a session without a tenant, made with auth off) has the operator's default,
RLGW_TRAINING_CONSENT. An agent key may narrow it, never widen it (`agent_keys.training_models`:
null inherits the tenant's; a list, possibly empty, is the most its sessions may train): a
session opened with the key (`sessions.agent_key_id`) may train a model only if both its tenant
and its key consent. The trainer claims only sessions that consent to the model being trained
(`consented_sql`, in trainer/loop/claims.py); a change applies to every session not consumed yet,
since consent is checked when a session is claimed, never when it is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rlgw.db.models import AgentKey, TrainingPolicy

from . import audit

ALL, NONE = "all", "none"
Models = Literal["all", "none"] | list[str]


@dataclass(frozen=True)
class Policy:
    tenant: str
    models: Models  # "all", "none", or the model names it may train
    source: str  # "tenant": its own policy; "default": RLGW_TRAINING_CONSENT
    updated_by: str | None = None
    updated_at: datetime | None = None

    def allows(self, model: str) -> bool:
        return self.models == ALL or (isinstance(self.models, list) and model in self.models)


def consented_sql(session: str) -> str:
    """A SQL boolean: the session row `session` (a table name or alias of `sessions`) may train
    `:model`: its tenant consents (a tenant without a policy gets `:consent_default`) and the
    agent key that opened it, if any, does not narrow that consent away. Bind both."""
    return (
        "(COALESCE((SELECT p.all_models OR CAST(:model AS text) = ANY(p.models) "
        f"FROM training_policies p WHERE p.tenant = {session}.tenant), :consent_default) "
        "AND COALESCE((SELECT k.training_models IS NULL "
        "OR CAST(:model AS text) = ANY(k.training_models) "
        f"FROM agent_keys k WHERE k.id = {session}.agent_key_id), true))"
    )


def default_policy(tenant: str, consent: str) -> Policy:
    return Policy(tenant, ALL if consent == ALL else NONE, "default")


def _of(row: TrainingPolicy) -> Policy:
    models: Models = ALL if row.all_models else (list(row.models) or NONE)
    return Policy(row.tenant, models, "tenant", row.updated_by, row.updated_at)


def effective(db: Session, tenant: str, consent: str) -> Policy:
    """The policy that applies to `tenant`: its own, else the operator's default."""
    row = db.get(TrainingPolicy, tenant)
    return _of(row) if row is not None else default_policy(tenant, consent)


def put(db: Session, tenant: str, models: Models, actor: str) -> Policy:
    """Set a tenant's policy (audited), in the caller's transaction."""
    listed = [] if models in (ALL, NONE) else sorted(set(models))
    values = {
        "all_models": models == ALL,
        "models": listed,
        "updated_by": actor,
        "updated_at": datetime.now(UTC),
    }
    db.execute(
        insert(TrainingPolicy)
        .values(tenant=tenant, **values)
        .on_conflict_do_update(index_elements=["tenant"], set_=values)
    )
    audit.record(
        db,
        "training_policy",
        actor=actor,
        tenant=tenant,
        detail={"models": models if models in (ALL, NONE) else listed},
    )
    db.expire_all()
    return _of(db.get(TrainingPolicy, tenant))


INHERIT = "inherit"
KeyModels = Literal["inherit", "none"] | list[str]


@dataclass(frozen=True)
class KeyPolicy:
    """An agent key's own setting and what its sessions may train, its tenant's consent applied."""

    key_id: str
    tenant: str
    models: KeyModels  # "inherit": the tenant's; "none"; or the only models it may train
    effective: Models  # what the key's sessions may train: the tenant's consent, narrowed


def narrowed(tenant: Policy, key: list[str] | None) -> Models:
    """What a key's sessions may train: its tenant's consent, narrowed by the key's list (None:
    the tenant's as it is)."""
    if key is None:
        return tenant.models
    if tenant.models == ALL:
        allowed = sorted(key)
    elif tenant.models == NONE:
        allowed = []
    else:
        allowed = sorted(set(key) & set(tenant.models))
    return allowed or NONE


def key_effective(db: Session, key: AgentKey, consent: str) -> KeyPolicy:
    """An agent key's policy and what its sessions may train (its tenant's policy narrowed)."""
    own = key.training_models
    models: KeyModels = INHERIT if own is None else (sorted(own) or NONE)
    tenant = effective(db, key.tenant, consent)
    return KeyPolicy(key.id, key.tenant, models, narrowed(tenant, own))


def put_key(db: Session, key: AgentKey, models: KeyModels, actor: str, consent: str) -> KeyPolicy:
    """Set an agent key's narrowing (audited), in the caller's transaction. A key can only take
    models away from its tenant's consent: listing a model the tenant does not consent to is
    allowed and stays without effect until the tenant consents."""
    listed = None if models == INHERIT else [] if models == NONE else sorted(set(models))
    key.training_models = listed
    audit.record(
        db,
        "key_training_policy",
        actor=actor,
        tenant=key.tenant,
        detail={"agent_key": key.id, "models": listed or models},
    )
    db.flush()
    return key_effective(db, key, consent)
