"""Request and response models of the session and reward API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from rlgw.trajectory import RecordVerdict, RewardOut

from ..ids import COMPLETION_ID_PATTERN, GROUP_ID_PATTERN, SESSION_ID_PATTERN

PRINTABLE = r"^[^\x00-\x1f\x7f]*$"


class SessionCreate(BaseModel):
    id: str | None = Field(
        default=None,
        pattern=SESSION_ID_PATTERN,
        description="Your own id for the session; generated when absent.",
    )
    group_id: str | None = Field(
        default=None,
        pattern=GROUP_ID_PATTERN,
        description="Sessions sharing a group id are normalized together.",
    )
    group_size: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="How many sessions the group will have: it is held back until all exist and "
        "are rewarded. Set it on every session of the group, or on the first.",
    )
    normalization: Literal["none", "mean", "mean_std"] | None = Field(
        default=None,
        description="The group's reward normalization; default from the server's "
        "RLGW_REWARD_NORMALIZATION. Fixed by the group's first session.",
    )
    sibling_normalization: Literal["none", "mean", "mean_std"] | None = Field(
        default=None,
        description="How the rewards of the sibling choices of one request (n > 1) are "
        "normalized within their sibling group for training; default mean_std. `none`: siblings "
        "are not a group of their own (every completion takes the session's return).",
    )
    task_id: str | None = Field(default=None, max_length=256, pattern=PRINTABLE)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _storable(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        if "\\u0000" in json.dumps(metadata):  # Postgres text and JSONB cannot hold NUL
            raise ValueError("metadata must not contain NUL characters")
        return metadata

    train: bool = Field(default=True, description="False: record, but never train on it.")


class SessionPublic(BaseModel):
    id: str
    group_id: str | None
    task_id: str | None
    metadata: dict[str, Any]
    train: bool
    sibling_normalization: str = Field(description="none | mean | mean_std")
    status: str = Field(description="open | closed | consumed")
    base_url: str = Field(description="Hand this to the agent as its OpenAI base URL.")
    created_at: datetime
    closed_at: datetime | None


class CompletionSummary(RecordVerdict):
    id: str
    status: str
    finish_reason: str | None
    policy_version: int | None
    retry_group: str | None
    sibling_group: str | None
    parent_id: str | None
    created_at: datetime


class SessionDetail(SessionPublic):
    completions: list[CompletionSummary]
    rewards: list[RewardOut]


class RewardCreate(BaseModel):
    value: float = Field(allow_inf_nan=False, description="A finite reward.")
    completion_id: str | None = Field(
        default=None,
        pattern=COMPLETION_ID_PATTERN,
        description="The completion rewarded (the `id` the gateway returned). Absent: the "
        "session's final kept completion at the time of posting.",
    )
