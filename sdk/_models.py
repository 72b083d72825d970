"""What the gateway returns, as small read-only models (unknown fields are ignored)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CompletionInfo", "Reward", "SessionInfo"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Reward(_Model):
    """A stored reward."""

    id: int
    value: float
    scope: str = Field(description="session: posted without completion_id | completion")
    completion_id: str | None = Field(description="the completion it rewards")
    idempotency_key: str | None
    counts: bool = Field(description="False once its completion has become a retry orphan")
    created_at: datetime
    replayed: bool = Field(
        default=False,
        description="Set by Session.reward: True when the gateway already held a reward under "
        "this Idempotency-Key (an earlier call with the same key, or an earlier attempt of this "
        "call whose answer was lost) and returned it instead of storing another.",
    )


class CompletionInfo(_Model):
    """A completion recorded in a session (the summary; the tokens are in the trajectory)."""

    id: str
    status: str
    finish_reason: str | None = None
    policy_version: int | None = None
    eligible: bool
    eligibility_reason: str | None = Field(
        default=None, description="ineligible_reasons joined with '; '"
    )
    ineligible_reasons: list[str] = Field(
        default_factory=list, description="every reason training must not use it; empty: eligible"
    )
    is_orphan: bool
    orphan_reason: str | None = None
    retry_group: str | None = None
    parent_id: str | None = None
    created_at: datetime


class SessionInfo(_Model):
    """A session as `GET /v1/sessions/{id}` returns it."""

    id: str
    group_id: str | None = None
    task_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    train: bool = True
    status: str = Field(description="open | closed | consumed")
    base_url: str = Field(description="the session's OpenAI base URL")
    created_at: datetime
    closed_at: datetime | None = None
    completions: list[CompletionInfo] = Field(default_factory=list)
    rewards: list[Reward] = Field(default_factory=list)
