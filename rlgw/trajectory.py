"""The trajectory of a session: the wire schema of the export, and the one loader that builds it.

Gateway (`GET /v1/sessions/{id}/trajectory`), CLI (`rlgw export`) and trainer all read sessions
through `load_trajectory`, so the exported record is the one trained on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, computed_field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rlgw.db.models import (
    AgentSession,
    Completion,
    Consumption,
    RegisteredModel,
    Reward,
    SessionGroup,
)
from rlgw.db.token_arrays import unpack_ids, unpack_logprobs
from rlgw.eligibility import eligibility_reason
from rlgw.rewards import GroupVerdict, Member, judge_group, normalize_returns
from rlgw.session_status import FINISHED
from rlgw.siblings import sibling_advantages  # re-exported: the pure half lives there

# How the rewards of sibling choices (one request with n > 1) are normalized when the session did
# not say (sessions.sibling_normalization is null).
DEFAULT_SIBLING_NORMALIZATION = "mean_std"

OUTPUT_VERSIONS = (
    "the policy version of each output token (a weight swap may pause a request and continue it "
    "on the new weights: the first tokens at the old version, the rest at the new); null when "
    "policy_version is"
)


def stored_output_versions(c: Completion) -> list[int] | None:
    """One version per output token of a stored completion: its `output_versions`, or its
    `policy_version` on every token where the column is null; None when policy_version is."""
    if c.policy_version is None:
        return None
    if c.output_versions is not None:
        return list(c.output_versions)
    return [c.policy_version] * len(unpack_ids(c.output_token_ids))


class RewardOut(BaseModel):
    id: int
    value: float
    scope: str = Field(description="session: posted without completion_id | completion")
    completion_id: str | None
    idempotency_key: str | None
    counts: bool = Field(description="False when its completion has become a retry orphan")
    created_at: datetime


class Eligibility(BaseModel):
    """Whether a completion may be trained on (rlgw/eligibility.py): its every reason not to, and
    the two fields earlier clients read, computed from them."""

    ineligible_reasons: list[str] = Field(
        description="every reason training must not use it; empty: eligible"
    )

    @computed_field(description="True when ineligible_reasons is empty")
    @property
    def eligible(self) -> bool:
        return not self.ineligible_reasons

    @computed_field(description="ineligible_reasons joined with '; ' (null when eligible)")
    @property
    def eligibility_reason(self) -> str | None:
        return eligibility_reason(self.ineligible_reasons)


class RecordVerdict(Eligibility):
    """Eligibility and lineage's verdict of a stored completion (orphans are never trained on)."""

    orphan_reason: str | None = Field(
        description="why lineage did not keep it (a superseded retry, or it continues an "
        "orphan); null: kept"
    )

    @computed_field(description="True when orphan_reason is set")
    @property
    def is_orphan(self) -> bool:
        return self.orphan_reason is not None


class Step(Eligibility):
    """One kept completion, exactly as the agent received it."""

    completion_id: str
    parent_id: str | None
    api: str
    model: str | None = Field(
        default=None,
        description="the model that generated it (a session may call several); a trainer "
        "trains each model on its own completions only",
    )
    policy_version: int | None = Field(description="the version of its first output token")
    output_versions: list[int] | None = Field(
        default=None,
        description=OUTPUT_VERSIONS,
    )
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str | None
    sibling_group: str | None = Field(
        default=None,
        description="the choices of one request with n > 1 share it (see Trajectory."
        "sibling_groups); null for n = 1",
    )
    rewards: list[RewardOut]
    reward_raw: float | None = Field(description="sum of this completion's counting rewards")
    reward_normalized: float | None = Field(
        default=None,
        description="the normalized reward this step is trained with (its advantage): for a "
        "sibling choice (n > 1) of a session that normalizes siblings, its reward normalized "
        "within its sibling group; otherwise the session's return_normalized (every turn shares "
        "the episode's outcome); null while its group is pending or when it was dropped",
    )
    response: dict[str, Any] | None
    sampling: dict[str, Any] | None = Field(
        default=None,
        description="the sampling settings the backend applied (temperature, top_p, top_k, "
        "min_p, penalties, ...; rlgw/sampling.py); the trainer scores the step under the same "
        "temperature and masks. Null: recorded before they were kept (scored at temperature 1)",
    )
    created_at: datetime


class Excluded(BaseModel):
    completion_id: str
    reason: str


class GroupOut(BaseModel):
    id: str
    normalization: str
    status: str = Field(description="ready | pending | dropped")
    reason: str | None
    size: int


class SiblingGroupOut(BaseModel):
    """The kept sibling choices of one request with n > 1, and their normalized rewards."""

    id: str = Field(description="the record id of choice 0")
    completion_ids: list[str]
    status: str = Field(description="ready (every sibling rewarded) | pending")
    returns: dict[str, float] = Field(description="each rewarded sibling's reward_raw")
    normalized: dict[str, float] = Field(
        description="each sibling's reward normalized within the group (the session's "
        "sibling_normalization); empty until ready"
    )


class TrainedInto(BaseModel):
    """One version whose update consumed the session (the trainer's ledger)."""

    model: str
    version: int
    completions: int = Field(description="its completions that update trained on")


class Trajectory(BaseModel):
    session_id: str
    group_id: str | None
    task_id: str | None
    status: str
    train: bool
    tenant: str | None = Field(
        default=None,
        description="the tenant whose agent key created it (null: created with auth off); its "
        "training policy decides which models it may train",
    )
    trained_into: list[TrainedInto] = Field(
        default_factory=list,
        description="provenance: the versions whose update consumed this session",
    )
    metadata: dict[str, Any]
    group: GroupOut | None
    return_raw: float | None = Field(description="sum of the session's counting rewards")
    return_normalized: float | None = Field(
        description="return after group normalization; equal to return_raw for a group of one; "
        "null while the group is pending or when it was dropped"
    )
    steps: list[Step]
    excluded: list[Excluded] = Field(description="retry orphans: not exported, not trained on")
    sibling_normalization: str = Field(
        default=DEFAULT_SIBLING_NORMALIZATION,
        description="none | mean | mean_std: how sibling choices' rewards are normalized",
    )
    sibling_groups: list[SiblingGroupOut] = Field(
        default_factory=list,
        description="sibling groups (n > 1) among the steps; with sibling_normalization other "
        "than none, a trainer uses a sibling's `normalized` reward as that step's advantage "
        "(GRPO over the choices of one prompt) instead of the session's return",
    )


def _counting_rewards(db: Session, session_ids: list[str]) -> list[tuple[Reward, bool]]:
    """Rewards of these sessions, each with whether it counts (not on an orphan)."""
    rows = db.execute(
        select(Reward, Completion.orphan_reason)
        .outerjoin(Completion, Completion.id == Reward.completion_id)
        .where(Reward.session_id.in_(session_ids))
        .order_by(Reward.id)
    ).all()
    return [(reward, orphan_reason is None) for reward, orphan_reason in rows]


def group_verdict(db: Session, group: SessionGroup, now: datetime) -> tuple[GroupVerdict, int]:
    members = db.execute(
        select(AgentSession.id, AgentSession.status).where(AgentSession.group_id == group.id)
    ).all()
    values: dict[str, list[float]] = {sid: [] for sid, _ in members}
    for reward, counts in _counting_rewards(db, list(values)):
        if counts:
            values[reward.session_id].append(reward.value)
    verdict = judge_group(
        [Member(sid, status in FINISHED, values[sid]) for sid, status in members],
        group.normalization,
        expected_size=group.expected_size,
        deadline_at=group.deadline_at,
        now=now,
        dropped_reason=group.dropped_reason if group.status == "dropped" else None,
    )
    return verdict, max(group.expected_size or 0, len(members))


def _step(c: Completion, rewards: list[RewardOut]) -> Step:
    counting = [r.value for r in rewards if r.counts]
    return Step(
        completion_id=c.id,
        parent_id=c.parent_id,
        api=c.api,
        model=c.model,
        policy_version=c.policy_version,
        output_versions=stored_output_versions(c),
        prompt_token_ids=unpack_ids(c.prompt_token_ids),
        output_token_ids=unpack_ids(c.output_token_ids),
        output_logprobs=unpack_logprobs(c.output_logprobs),
        finish_reason=c.finish_reason,
        sibling_group=c.sibling_group,
        ineligible_reasons=c.ineligible_reasons,
        rewards=rewards,
        reward_raw=sum(counting) if counting else None,
        response=c.response,
        sampling=c.sampling,
        created_at=c.created_at,
    )


def load_trajectory(db: Session, session_id: str, now: datetime) -> Trajectory | None:
    session = db.get(AgentSession, session_id)
    if session is None:
        return None
    completions = db.scalars(
        select(Completion)
        .where(Completion.session_id == session_id)
        .order_by(Completion.created_at, Completion.id)
    ).all()
    by_completion: dict[str | None, list[RewardOut]] = {}
    for reward, counts in _counting_rewards(db, [session_id]):
        by_completion.setdefault(reward.completion_id, []).append(
            RewardOut(
                id=reward.id,
                value=reward.value,
                scope=reward.scope,
                completion_id=reward.completion_id,
                idempotency_key=reward.idempotency_key,
                counts=counts,
                created_at=reward.created_at,
            )
        )
    steps = [_step(c, by_completion.get(c.id, [])) for c in completions if c.orphan_reason is None]
    counting = [r.value for rs in by_completion.values() for r in rs if r.counts]
    return_raw = sum(counting) if counting else None
    group_out, return_normalized = None, return_raw
    if session.group_id is not None:
        group = db.get(SessionGroup, session.group_id)
        verdict, size = group_verdict(db, group, now)
        group_out = GroupOut(
            id=group.id,
            normalization=group.normalization,
            status=verdict.status,
            reason=verdict.reason,
            size=size,
        )
        return_normalized = verdict.normalized.get(session_id)
    sibling_normalization = session.sibling_normalization or DEFAULT_SIBLING_NORMALIZATION
    trajectory = Trajectory(
        session_id=session.id,
        group_id=session.group_id,
        task_id=session.task_id,
        status=session.status,
        train=session.train,
        tenant=session.tenant,
        trained_into=_trained_into(db, session_id),
        metadata=session.meta,
        group=group_out,
        return_raw=return_raw,
        return_normalized=return_normalized,
        steps=steps,
        excluded=[
            Excluded(completion_id=c.id, reason=c.orphan_reason)
            for c in completions
            if c.orphan_reason is not None
        ],
        sibling_normalization=sibling_normalization,
        sibling_groups=sibling_groups(steps, sibling_normalization),
    )
    siblings = sibling_advantages(trajectory)
    for step in steps:
        step.reward_normalized = siblings.get(step.completion_id, return_normalized)
    return trajectory


def _trained_into(db: Session, session_id: str) -> list[TrainedInto]:
    rows = db.execute(
        select(RegisteredModel.name, Consumption.version, func.count().filter(Consumption.used))
        .join(RegisteredModel, RegisteredModel.id == Consumption.model_id)
        .where(Consumption.session_id == session_id)
        .group_by(RegisteredModel.name, Consumption.version)
        .order_by(RegisteredModel.name, Consumption.version)
    ).all()
    return [TrainedInto(model=m, version=v, completions=n) for m, v, n in rows]


def sibling_groups(steps: list[Step], how: str) -> list[SiblingGroupOut]:
    """The sibling groups among `steps`: ready once every kept sibling has a counting reward, then
    normalized with `how` (a group of one keeps its raw reward)."""
    members: dict[str, list[Step]] = {}
    for step in steps:
        if step.sibling_group is not None:
            members.setdefault(step.sibling_group, []).append(step)
    out = []
    for group_id, group in members.items():
        returns = {s.completion_id: s.reward_raw for s in group if s.reward_raw is not None}
        ready = len(returns) == len(group)
        out.append(
            SiblingGroupOut(
                id=group_id,
                completion_ids=[s.completion_id for s in group],
                status="ready" if ready else "pending",
                returns=returns,
                normalized=normalize_returns(returns, how) if ready else {},
            )
        )
    return out
