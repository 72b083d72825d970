"""FastAPI dependencies: the process context, a database session, the admin key, the session id."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession

from .context import GatewayContext
from .errors import APIError


def get_context(request: Request) -> GatewayContext:
    return request.app.state.context


ContextDep = Annotated[GatewayContext, Depends(get_context)]


async def get_db(ctx: ContextDep) -> AsyncIterator[AsyncSession]:
    async with ctx.sessions() as db:
        yield db


DbDep = Annotated[AsyncSession, Depends(get_db)]


def _presented_key(authorization: str | None, x_admin_key: str | None) -> str | None:
    if x_admin_key:
        return x_admin_key
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token:
            return token.strip()
    return None


def require_admin(
    ctx: ContextDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_admin_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    """Admin key as `Authorization: Bearer <key>` or `X-Admin-Key`; 401 if absent, 403 if wrong."""
    presented = _presented_key(authorization, x_admin_key)
    if presented is None:
        raise APIError(
            401,
            "admin key required (Authorization: Bearer or X-Admin-Key)",
            code="missing_admin_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(presented.encode(), ctx.settings.admin_key.encode()):
        raise APIError(403, "admin key not accepted", code="invalid_admin_key")


AdminDep = Depends(require_admin)


def header_session_id(
    x_session_id: Annotated[
        str | None, Header(description="Bind the call to this session.")
    ] = None,
) -> str | None:
    return x_session_id
