"""Which versions may serve which sessions, as this gateway process knows it (docs/governance.md).

A version that is not promoted (a candidate under its gate, a rejected or rolled-back one) serves
only sessions pinned to it: an unpinned request never reaches a backend that serves it. A session
pinned to a version (`sessions.pinned_version`: a gate evaluation, or a canary) is served only by
backends serving that version, so its completions all come from one version; once that version
is neither the candidate nor the promoted one, its requests are refused (409
`pinned_version_retired`) rather than served by another. While a canary runs, each new session
of the model is pinned to the candidate with the canary's share, by a hash of its id (the same
draw on every request), when it makes its first completion.

Read with the registry (`BackendPool.refresh`: on every NOTIFY and periodically), never per
request; pinning a drawn session rides on the one statement that opens a session.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text

from rlgw.session_rows import insert_named_sql
from rlgw.session_status import SessionStatus

from ..errors import APIError

_READ = text(
    """
    SELECT m.name, m.current_version, m.candidate_version, m.canary_share, m.canary_started_at,
           ARRAY(SELECT pv.version FROM policy_versions pv
                 WHERE pv.model_id = m.id AND pv.status <> 'promoted')
    FROM models m
    """
)

# Opens a session as `session_binding` does, and pins it to the canary's candidate if it is new
# (created since the canary began, no completion yet), open, and the caller's tenant's.
OPEN_AND_PIN = text(
    f"""
    WITH created AS (
        {insert_named_sql(pinned=True)} RETURNING status, tenant, pinned_model, pinned_version
    ), pinned AS (
        UPDATE sessions SET pinned_model = :pin_model, pinned_version = :pin_version
        WHERE id = :id AND pinned_version IS NULL AND status = '{SessionStatus.OPEN}'
          AND created_at >= :since
          AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
          AND NOT EXISTS (SELECT 1 FROM completions c WHERE c.session_id = :id)
        RETURNING status, tenant, pinned_model, pinned_version
    )
    SELECT status, tenant, pinned_model, pinned_version FROM created
    UNION ALL
    SELECT status, tenant, pinned_model, pinned_version FROM pinned
    UNION ALL
    SELECT status, tenant, pinned_model, pinned_version FROM sessions WHERE id = :id
    LIMIT 1
    """
)


@dataclass(frozen=True)
class Draw:
    """A new session drawn into a canary: pin it to `version` of `model` if it began since."""

    model: str
    version: int
    since: datetime

    def params(self) -> dict:
        return {"pin_model": self.model, "pin_version": self.version, "since": self.since}


@dataclass(frozen=True)
class ModelVersions:
    current: int  # the promoted version
    candidate: int | None
    share: float | None  # set while a canary runs
    since: datetime | None
    held_back: frozenset[int]  # versions that serve pinned sessions only


@dataclass
class VersionRules:
    """Every model's rules, replaced whole on each registry read."""

    models: dict[str, ModelVersions] = field(default_factory=dict)

    def admits(self, model: str, served_version: int | None, pin: int | None) -> bool:
        """Whether a backend of `model` serving `served_version` may take a request pinned to
        `pin` (None: unpinned)."""
        if pin is not None:
            return served_version == pin
        rules = self.models.get(model)
        return rules is None or served_version not in rules.held_back

    def check_pin(self, model: str, session_id: str, pin: int | None) -> None:
        """409 when a session's pinned version no longer serves (rolled back, or superseded)."""
        rules = self.models.get(model)
        if pin is None or rules is None or pin in (rules.current, rules.candidate):
            return
        raise APIError(
            409,
            f"session {session_id} is pinned to version {pin} of {model} (a canary or a gate "
            "evaluation), which no longer serves: its completions must all come from one "
            "version, so start a new session",
            code="pinned_version_retired",
        )

    def draw(self, model: str, session_id: str) -> Draw | None:
        """The canary pin for a session of `model`, if a canary runs and the session draws it."""
        rules = self.models.get(model)
        if rules is None or rules.candidate is None or rules.share is None or rules.since is None:
            return None
        key = f"{model}\0{rules.candidate}\0{session_id}".encode()
        fraction = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        return Draw(model, rules.candidate, rules.since) if fraction < rules.share else None


def pin_for(pinned: tuple[str | None, int | None], model: str) -> int | None:
    """A session's pinned version, for a request to `model` (a pin holds for its model only)."""
    pinned_model, pinned_version = pinned
    return pinned_version if pinned_model == model else None


async def read_rules(db) -> VersionRules:
    rows = (await db.execute(_READ)).all()
    return VersionRules(
        {
            name: ModelVersions(current, candidate, share, since, frozenset(held_back))
            for name, current, candidate, share, since, held_back in rows
        }
    )
