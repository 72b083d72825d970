"""POST /register_model: register a model and its vLLM backends, after the network rules
(rlgw.netguard) and a check that each target answers as a vLLM server of that model."""

from __future__ import annotations

import asyncio
from typing import Annotated

import anyio
from fastapi import APIRouter
from pydantic import BaseModel, Field

from rlgw import registry
from rlgw.netguard import parse_allowlist

from ..deps import AdminDep, ContextDep, DbDep
from ..errors import APIError, ErrorResponse

router = APIRouter(
    tags=["admin"],
    dependencies=[AdminDep],
    responses={
        400: {"model": ErrorResponse, "description": "A backend URL breaks a network rule"},
        409: {"model": ErrorResponse, "description": "Already registered"},
        422: {"model": ErrorResponse, "description": "A target is not a vLLM server of it"},
    },
)

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
RESOLVE_TIMEOUT_S = 10.0
BackendUrl = Annotated[str, Field(min_length=1, max_length=2048)]


class RegisterModel(BaseModel):
    name: str = Field(pattern=MODEL_NAME_PATTERN, description="The served model name.")
    backends: list[BackendUrl] = Field(
        min_length=1,
        max_length=16,
        description="Base URLs of vLLM servers of this model (http or https, allowlisted).",
    )
    model_path: str | None = Field(
        default=None,
        max_length=4096,
        pattern=r"^/[^\x00-\x1f\x7f]*$",
        description="The base checkpoint directory (absolute), as the trainer sees it.",
    )
    replace: bool = Field(
        default=False,
        description="Re-register an existing model: the listed backends become its routed set "
        "and its other backends are drained. Without it, an existing model is a 409.",
    )


class RegisteredBackend(BaseModel):
    id: int
    url: str
    served_version: int
    state: str


class RegisteredModelOut(BaseModel):
    model: str
    model_path: str | None
    backends: list[RegisteredBackend]


@router.post("/register_model", status_code=201, response_model=RegisteredModelOut)
async def register_model(body: RegisterModel, db: DbDep, ctx: ContextDep) -> RegisteredModelOut:
    if not body.replace and await db.run_sync(lambda s: registry.model_exists(s, body.name)):
        raise APIError(
            409,
            f"model {body.name!r} is already registered: send replace=true to re-register it",
            code="model_exists",
        )
    await db.rollback()  # end the read before the slow network checks
    allow = parse_allowlist(ctx.settings.backend_allowlist)
    targets = []
    for i, url in enumerate(body.backends):
        try:
            target = await asyncio.wait_for(
                anyio.to_thread.run_sync(registry.check_target, url, allow), RESOLVE_TIMEOUT_S
            )
        except registry.TargetNotAllowed as exc:
            raise APIError(
                400, f"backends[{i}]: {exc}", code="backend_not_allowed", param=f"backends.{i}"
            ) from None
        except TimeoutError:
            raise APIError(
                400,
                f"backends[{i}]: the host name did not resolve in time",
                code="backend_not_allowed",
                param=f"backends.{i}",
            ) from None
        if any(t.url == target.url for t in targets):
            raise APIError(
                400, f"backends[{i}] is listed twice", code="duplicate_backend", param="backends"
            )
        targets.append(target)
    probed = []
    for i, target in enumerate(targets):
        try:
            version = await anyio.to_thread.run_sync(registry.probe_backend, target, body.name)
        except registry.RegistrationError as exc:
            raise APIError(
                422, f"backends[{i}]: {exc}", code="backend_check_failed", param=f"backends.{i}"
            ) from None
        probed.append((target.url, version))
    try:
        async with db.begin():
            stored = await db.run_sync(
                lambda s: registry.store_model(
                    s, body.name, probed, model_path=body.model_path, replace=body.replace
                )
            )
    except registry.RegistrationConflict as exc:
        raise APIError(409, str(exc), code="registration_conflict") from None
    await ctx.pool.refresh()
    return RegisteredModelOut(
        model=body.name,
        model_path=body.model_path,
        backends=[RegisteredBackend(**vars(b)) for b in stored],
    )
