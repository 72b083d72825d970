"""Training consent: which models a tenant's sessions may train, and the one SQL test of it.

A tenant's policy (`training_policies`) names every model, none, or a list; a tenant without one
(and a session without a tenant, made with auth off) has the operator's default,
RLGW_TRAINING_CONSENT. The trainer claims only sessions whose tenant consents to the model being
trained (`consented_sql`, in trainer/claims.py); a change applies to every session not consumed
yet, since consent is checked when a session is claimed, never when it is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rlgw.db.models import TrainingPolicy

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


def consented_sql(tenant_column: str) -> str:
    """A SQL boolean: the session whose tenant is `tenant_column` may train `:model`; a tenant
    without a policy gets `:consent_default`. Bind both."""
    return (
        "COALESCE((SELECT p.all_models OR CAST(:model AS text) = ANY(p.models) "
        f"FROM training_policies p WHERE p.tenant = {tenant_column}), :consent_default)"
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
