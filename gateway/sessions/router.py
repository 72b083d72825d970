"""Routes of the session and reward API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from pydantic import BaseModel, Field

from rlgw.training_view import TrainingView, load_training_view
from rlgw.trajectory import RewardOut, Trajectory, load_trajectory

from ..auth import DEFAULT_TOKEN_SCOPES, SCOPES
from ..deps import CallerDep, ContextDep, DbDep
from ..errors import APIError, ErrorResponse
from ..ids import SESSION_ID_PATTERN
from . import service
from .protocol import RewardCreate, SessionCreate, SessionDetail, SessionPublic

router = APIRouter(
    prefix="/v1/sessions",
    tags=["sessions"],
    responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)

SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN, description="The session's id.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=256,
        description="The same key stores one reward, however often it is posted.",
    ),
]


async def gateway_url(request: Request, ctx: ContextDep) -> str:
    """The URL agents reach this gateway at: RLGW_PUBLIC_URL, else the one this call used."""
    return ctx.settings.public_url or str(request.base_url).rstrip("/")


GatewayUrl = Annotated[str, Depends(gateway_url)]


@router.post("", status_code=201, response_model=SessionPublic)
async def create_session(
    body: SessionCreate, db: DbDep, ctx: ContextDep, url: GatewayUrl, caller: CallerDep
) -> SessionPublic:
    caller.require_unscoped("create sessions")
    session = await service.create_session(db, body, ctx.settings, caller.tenant, caller.key_id)
    return service.public(session, url)


@router.get("/{session_id}", response_model=SessionDetail)
async def read_session(
    session_id: SessionId, db: DbDep, url: GatewayUrl, caller: CallerDep
) -> SessionDetail:
    caller.require_session(session_id, "read")
    return await service.session_detail(db, session_id, url, caller.tenant)


@router.post("/{session_id}/close", response_model=SessionPublic)
async def close_session(
    session_id: SessionId, db: DbDep, url: GatewayUrl, caller: CallerDep
) -> SessionPublic:
    caller.require_session(session_id, "close")
    return service.public(await service.close_session(db, session_id, caller.tenant), url)


@router.post(
    "/{session_id}/rewards",
    status_code=201,
    response_model=RewardOut,
    responses={200: {"model": RewardOut, "description": "Replay of an idempotent post"}},
)
async def post_reward(
    session_id: SessionId,
    body: RewardCreate,
    db: DbDep,
    response: Response,
    caller: CallerDep,
    ctx: ContextDep,
    idempotency_key: IdempotencyKey = None,
) -> RewardOut:
    caller.require_session(session_id, "rewards")
    service.check_reward_range(body.value, ctx.settings)
    reward, created = await service.add_reward(db, session_id, body, idempotency_key, caller.tenant)
    if not created:
        response.status_code = 200
    return reward


TrajectoryView = Annotated[
    Literal["record", "training"],
    Query(
        description="record: the session as recorded (the default). training: the sequences "
        "the trainer builds from it (rlgw/training_view.py), in any session status."
    ),
]


@router.get(
    "/{session_id}/trajectory",
    response_model=Trajectory | TrainingView,
    responses={
        200: {
            "description": "view=record: the Trajectory; view=training: the TrainingView (each "
            "model's sequences, with their loss mask, cuts and turns, and the completions left "
            "out). docs/api.md describes both."
        },
        422: {"model": ErrorResponse, "description": "an unknown view"},
    },
)
async def read_trajectory(
    session_id: SessionId, db: DbDep, caller: CallerDep, view: TrajectoryView = "record"
) -> Trajectory | TrainingView:
    caller.require_session(session_id, "read")
    await service.visible_session(db, session_id, caller.tenant)
    now = datetime.now(UTC)
    load = load_training_view if view == "training" else load_trajectory
    result = await db.run_sync(lambda s: load(s, session_id, now))
    if result is None:
        raise APIError(404, f"no session {session_id}", code="session_not_found")
    return result


Scope = Literal["completions", "read", "close", "rewards"]


class TokenRequest(BaseModel):
    ttl_s: int = Field(
        default=3600,
        ge=1,
        description="Lifetime in seconds (at most RLGW_SESSION_TOKEN_MAX_TTL_S).",
    )
    scopes: list[Scope] = Field(
        default=list(DEFAULT_TOKEN_SCOPES),
        min_length=1,
        max_length=len(SCOPES),
        description="What the token may do in the session. Default: completions and read; "
        "close and rewards stay with the harness unless granted.",
    )


class TokenOut(BaseModel):
    token: str = Field(description="Send as `Authorization: Bearer <token>` (the OpenAI api_key).")
    expires_at: datetime
    base_url: str = Field(description="The session's OpenAI base URL, to use with the token.")
    session_id: str
    scopes: list[str]


@router.post("/{session_id}/token", status_code=201, response_model=TokenOut)
async def mint_session_token(
    session_id: SessionId,
    db: DbDep,
    ctx: ContextDep,
    url: GatewayUrl,
    caller: CallerDep,
    body: TokenRequest | None = None,
) -> TokenOut:
    """A token that reaches this one session only, to hand to an agent with its base URL."""
    body = body or TokenRequest()
    caller.require_unscoped("mint session tokens")
    if caller.key_id is None:
        raise APIError(
            400,
            "session tokens need RLGW_AUTH=on: with auth off nothing checks them",
            code="auth_disabled",
        )
    if body.ttl_s > ctx.settings.session_token_max_ttl_s:
        raise APIError(
            400,
            f"ttl_s above {ctx.settings.session_token_max_ttl_s} (RLGW_SESSION_TOKEN_MAX_TTL_S)",
            code="ttl_too_long",
            param="ttl_s",
        )
    await service.visible_session(db, session_id, caller.tenant)
    token, expires_at = ctx.auth.mint_token(caller, session_id, body.ttl_s, tuple(body.scopes))
    return TokenOut(
        token=token,
        expires_at=expires_at,
        base_url=f"{url}/sessions/{session_id}/v1",
        session_id=session_id,
        scopes=sorted(set(body.scopes)),
    )
