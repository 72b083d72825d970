"""FastAPI dependencies: the process context, a database session, the admin key, the session id."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
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


_admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminKey", description="The admin key (RLGW_ADMIN_KEY)."
)
_admin_header = APIKeyHeader(
    name="X-Admin-Key",
    auto_error=False,
    scheme_name="AdminKeyHeader",
    description="The admin key (RLGW_ADMIN_KEY), as a header of its own.",
)


def admin_key_matches(presented: str | None, settings_key: str) -> bool:
    """Constant-time comparison; an empty configured key matches nothing."""
    if not presented or not settings_key:
        return False
    return hmac.compare_digest(presented.encode(), settings_key.encode())


def require_admin(
    request: Request,
    ctx: ContextDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
    x_admin_key: Annotated[str | None, Depends(_admin_header)],
) -> None:
    """Admin key as `Authorization: Bearer <key>` or `X-Admin-Key`; 401 if absent, 403 if wrong.
    The key is never echoed. Admin calls count against the "admin" rate and concurrency limits."""
    presented = x_admin_key or (bearer.credentials if bearer else None)
    if not presented:
        raise APIError(
            401,
            "admin key required (Authorization: Bearer or X-Admin-Key)",
            code="missing_admin_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not admin_key_matches(presented.strip(), ctx.settings.admin_key):
        raise APIError(403, "admin key not accepted", code="invalid_admin_key")
    ctx.limiter.admit("admin", request.scope)


AdminDep = Depends(require_admin)


def header_session_id(
    x_session_id: Annotated[
        str | None, Header(description="Bind the call to this session.")
    ] = None,
) -> str | None:
    return x_session_id
