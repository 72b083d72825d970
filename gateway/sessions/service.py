"""Session and reward operations. Every write that depends on a session's state locks its row."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from rlgw.db.models import AgentSession, Completion, Reward, SessionGroup
from rlgw.session_rows import insert_named
from rlgw.session_status import SessionStatus
from rlgw.settings import Settings
from rlgw.trajectory import DEFAULT_SIBLING_NORMALIZATION, RewardOut

from ..auth import tenant_sees
from ..errors import APIError, session_not_found
from .protocol import CompletionSummary, RewardCreate, SessionCreate, SessionDetail, SessionPublic


def _not_found(session_id: str) -> APIError:
    return session_not_found(session_id)


def _visible(session: AgentSession | None, tenant: str | None) -> bool:
    """A session exists for a caller of `tenant`."""
    return session is not None and tenant_sees(tenant, session.tenant)


async def visible_session(db: AsyncSession, session_id: str, tenant: str | None) -> AgentSession:
    session = await db.get(AgentSession, session_id)
    if not _visible(session, tenant):
        raise _not_found(session_id)
    return session


def public(session: AgentSession, gateway_url: str) -> SessionPublic:
    return SessionPublic(
        id=session.id,
        group_id=session.group_id,
        task_id=session.task_id,
        metadata=session.meta,
        train=session.train,
        sibling_normalization=session.sibling_normalization or DEFAULT_SIBLING_NORMALIZATION,
        status=session.status,
        base_url=f"{gateway_url}/sessions/{session.id}/v1",
        created_at=session.created_at,
        closed_at=session.closed_at,
    )


async def _join_group(
    db: AsyncSession, body: SessionCreate, settings: Settings, tenant: str | None
) -> None:
    assert body.group_id is not None
    now = datetime.now(UTC)
    await db.execute(
        insert(SessionGroup)
        .values(
            id=body.group_id,
            tenant=tenant,
            normalization=body.normalization or settings.reward_normalization,
            expected_size=body.group_size,
            deadline_at=now + timedelta(seconds=settings.group_deadline_s),
        )
        .on_conflict_do_nothing()
    )
    group = (
        await db.execute(
            select(SessionGroup).where(SessionGroup.id == body.group_id).with_for_update()
        )
    ).scalar_one()
    if not tenant_sees(tenant, group.tenant):
        # Another tenant's sessions would share (and skew) its reward normalization.
        raise APIError(
            409,
            f"group id {group.id} is not available: choose another",
            code="group_unavailable",
            param="group_id",
        )
    if body.normalization and body.normalization != group.normalization:
        raise APIError(
            409,
            f"group {group.id} normalizes with {group.normalization!r}",
            code="group_conflict",
            param="normalization",
        )
    if body.group_size is not None and group.expected_size not in (None, body.group_size):
        raise APIError(
            409,
            f"group {group.id} expects {group.expected_size} sessions",
            code="group_conflict",
            param="group_size",
        )
    group.expected_size = body.group_size or group.expected_size


async def create_session(
    db: AsyncSession,
    body: SessionCreate,
    settings: Settings,
    tenant: str | None = None,
    key_id: str | None = None,
) -> AgentSession:
    """A new session of `tenant`, opened with the agent key `key_id` (its training consent)."""
    session_id = body.id or f"sess-{uuid.uuid4().hex}"
    async with db.begin():
        if body.group_id is not None:
            await _join_group(db, body, settings, tenant)
        created = (
            await db.execute(
                insert_named(
                    id=session_id,
                    group_id=body.group_id,
                    task_id=body.task_id,
                    meta=body.metadata,
                    train=body.train,
                    tenant=tenant,
                    agent_key_id=key_id,
                    sibling_normalization=body.sibling_normalization,
                )
                .on_conflict_do_nothing()
                .returning(AgentSession.id)
            )
        ).scalar_one_or_none()
        if created is None:
            raise APIError(409, f"session {session_id} already exists", code="session_exists")
    return await db.get(AgentSession, session_id)


async def session_detail(
    db: AsyncSession, session_id: str, gateway_url: str, tenant: str | None = None
) -> SessionDetail:
    session = await visible_session(db, session_id, tenant)
    completions = (
        await db.execute(
            select(
                Completion.id,
                Completion.status,
                Completion.finish_reason,
                Completion.policy_version,
                Completion.ineligible_reasons,
                Completion.orphan_reason,
                Completion.retry_group,
                Completion.sibling_group,
                Completion.parent_id,
                Completion.created_at,
            )
            .where(Completion.session_id == session_id)
            .order_by(Completion.created_at, Completion.id)
        )
    ).all()
    orphans = {c.id for c in completions if c.orphan_reason is not None}
    rewards = (
        await db.scalars(select(Reward).where(Reward.session_id == session_id).order_by(Reward.id))
    ).all()
    return SessionDetail(
        **public(session, gateway_url).model_dump(),
        completions=[CompletionSummary(**c._asdict()) for c in completions],
        rewards=[_reward_out(r, counts=r.completion_id not in orphans) for r in rewards],
    )


async def close_session(
    db: AsyncSession, session_id: str, tenant: str | None = None
) -> AgentSession:
    async with db.begin():
        session = (
            await db.execute(
                select(AgentSession).where(AgentSession.id == session_id).with_for_update()
            )
        ).scalar_one_or_none()
        if not _visible(session, tenant):
            raise _not_found(session_id)
        if session.status == SessionStatus.OPEN:  # closing twice is harmless
            session.status = SessionStatus.CLOSED
            session.closed_at = datetime.now(UTC)
    return session


def _reward_out(reward: Reward, counts: bool) -> RewardOut:
    return RewardOut(
        id=reward.id,
        value=reward.value,
        scope=reward.scope,
        completion_id=reward.completion_id,
        idempotency_key=reward.idempotency_key,
        counts=counts,
        created_at=reward.created_at,
    )


def _digest(body: RewardCreate) -> str:
    return hashlib.sha256(body.model_dump_json().encode()).hexdigest()


async def _final_completion(db: AsyncSession, session_id: str) -> str:
    """The session's final kept completion. When the last request asked for several choices
    (n > 1) and the conversation went on from none of them, "final" names no single completion:
    the reward must name the sibling it is for."""
    kept = Completion.session_id == session_id, Completion.orphan_reason.is_(None)
    final = (
        await db.execute(
            select(Completion.id, Completion.sibling_group)
            .where(*kept)
            .order_by(Completion.created_at.desc(), Completion.id.desc())
            .limit(1)
        )
    ).one_or_none()
    if final is None:
        raise APIError(
            409, f"session {session_id} has no completion to reward", code="nothing_to_reward"
        )
    if final.sibling_group is not None:
        siblings = (
            await db.scalars(
                select(Completion.id)
                .where(*kept, Completion.sibling_group == final.sibling_group)
                .order_by(Completion.id)
            )
        ).all()
        if len(siblings) > 1:
            raise APIError(
                409,
                f"the final request of session {session_id} produced {len(siblings)} choices "
                f"(n > 1): name the one this reward is for with completion_id "
                f"(one of {', '.join(siblings)})",
                code="ambiguous_final_completion",
                param="completion_id",
            )
    return final.id


async def _target_completion(db: AsyncSession, session_id: str, completion_id: str | None) -> str:
    if completion_id is None:
        return await _final_completion(db, session_id)
    target = await db.get(Completion, completion_id)
    if target is None or target.session_id != session_id:
        raise APIError(
            404,
            f"no completion {completion_id} in session {session_id}",
            code="completion_not_found",
            param="completion_id",
        )
    if target.orphan_reason is not None:
        raise APIError(
            409,
            f"completion {completion_id} is a retry orphan "
            f"({target.orphan_reason}): it is never trained on, so a reward on it "
            "would be lost. Reward the kept attempt instead.",
            code="completion_is_orphan",
            param="completion_id",
        )
    return completion_id


async def _counts(db: AsyncSession, reward: Reward) -> bool:
    """A stored reward counts unless its completion has since become a retry orphan."""
    if reward.completion_id is None:
        return True
    target = await db.get(Completion, reward.completion_id)
    return target is None or target.orphan_reason is None


def check_reward_range(value: float, settings: Settings) -> None:
    """Refuse (422) a reward outside [RLGW_REWARD_MIN, RLGW_REWARD_MAX]: nothing is stored."""
    if not settings.reward_min <= value <= settings.reward_max:
        raise APIError(
            422,
            f"reward {value!r} is outside this gateway's range [{settings.reward_min!r}, "
            f"{settings.reward_max!r}] (RLGW_REWARD_MIN, RLGW_REWARD_MAX)",
            code="reward_out_of_range",
            param="value",
        )


async def add_reward(
    db: AsyncSession,
    session_id: str,
    body: RewardCreate,
    idempotency_key: str | None,
    tenant: str | None = None,
) -> tuple[RewardOut, bool]:
    """Store a reward once per idempotency key; returns it and whether it was new."""
    async with db.begin():
        session = (
            await db.execute(
                select(AgentSession).where(AgentSession.id == session_id).with_for_update()
            )
        ).scalar_one_or_none()
        if not _visible(session, tenant):
            raise _not_found(session_id)
        if idempotency_key is not None:
            earlier = (
                await db.execute(
                    select(Reward).where(
                        Reward.session_id == session_id, Reward.idempotency_key == idempotency_key
                    )
                )
            ).scalar_one_or_none()
            if earlier is not None:
                if earlier.body_digest != _digest(body):
                    raise APIError(
                        409,
                        "this Idempotency-Key was used with a different body",
                        code="idempotency_key_reused",
                    )
                return _reward_out(earlier, counts=await _counts(db, earlier)), False
        if session.status in (SessionStatus.CLAIMED, SessionStatus.CONSUMED, SessionStatus.DROPPED):
            detail = {
                SessionStatus.CLAIMED: "is being trained on",
                SessionStatus.CONSUMED: "was already consumed by training",
                SessionStatus.DROPPED: f"was dropped from training ({session.dropped_reason})",
            }[session.status]
            raise APIError(
                409,
                f"session {session_id} {detail}: a reward now would never be trained on",
                code=f"session_{session.status}",
            )
        completion_id = await _target_completion(db, session_id, body.completion_id)
        reward = Reward(
            session_id=session_id,
            completion_id=completion_id,
            value=body.value,
            scope="completion" if body.completion_id else "session",
            idempotency_key=idempotency_key,
            body_digest=_digest(body),
        )
        db.add(reward)
        await db.flush()
        await db.refresh(reward)
    return _reward_out(reward, counts=True), True
