"""Routes of the session and reward API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request, Response

from rlgw.trajectory import RewardOut, Trajectory, load_trajectory

from ..deps import ContextDep, DbDep
from ..errors import APIError, ErrorResponse
from . import service
from .protocol import ID_PATTERN, RewardCreate, SessionCreate, SessionDetail, SessionPublic

router = APIRouter(
    prefix="/v1/sessions",
    tags=["sessions"],
    responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)

SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="The session's id.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=256,
        description="The same key stores one reward, however often it is posted.",
    ),
]


def gateway_url(request: Request, ctx: ContextDep) -> str:
    """The URL agents reach this gateway at: RLGW_PUBLIC_URL, else the one this call used."""
    return ctx.settings.public_url or str(request.base_url).rstrip("/")


GatewayUrl = Annotated[str, Depends(gateway_url)]


@router.post("", status_code=201, response_model=SessionPublic)
async def create_session(
    body: SessionCreate, db: DbDep, ctx: ContextDep, url: GatewayUrl
) -> SessionPublic:
    return service.public(await service.create_session(db, body, ctx.settings), url)


@router.get("/{session_id}", response_model=SessionDetail)
async def read_session(session_id: SessionId, db: DbDep, url: GatewayUrl) -> SessionDetail:
    return await service.session_detail(db, session_id, url)


@router.post("/{session_id}/close", response_model=SessionPublic)
async def close_session(session_id: SessionId, db: DbDep, url: GatewayUrl) -> SessionPublic:
    return service.public(await service.close_session(db, session_id), url)


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
    idempotency_key: IdempotencyKey = None,
) -> RewardOut:
    reward, created = await service.add_reward(db, session_id, body, idempotency_key)
    if not created:
        response.status_code = 200
    return reward


@router.get("/{session_id}/trajectory", response_model=Trajectory)
async def read_trajectory(session_id: SessionId, db: DbDep) -> Trajectory:
    now = datetime.now(UTC)
    trajectory = await db.run_sync(lambda s: load_trajectory(s, session_id, now))
    if trajectory is None:
        raise APIError(404, f"no session {session_id}", code="session_not_found")
    return trajectory
