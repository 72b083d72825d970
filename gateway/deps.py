"""FastAPI dependencies: the process context, a database session, the admin key, the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.ext.asyncio import AsyncSession

from .auth import Caller, address_of, admin_key_matches
from .context import GatewayContext
from .errors import APIError


async def get_context(request: Request) -> GatewayContext:
    return request.app.state.context


ContextDep = Annotated[GatewayContext, Depends(get_context)]


async def get_db(ctx: ContextDep) -> AsyncIterator[AsyncSession]:
    async with ctx.db_sessions() as db:
        yield db


DbDep = Annotated[AsyncSession, Depends(get_db)]


# ----------------------------------------------------------------------------- the admin key

_admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminKey", description="The admin key (RLGW_ADMIN_KEY)."
)
_admin_header = APIKeyHeader(
    name="X-Admin-Key",
    auto_error=False,
    scheme_name="AdminKeyHeader",
    description="The admin key (RLGW_ADMIN_KEY), as a header of its own.",
)


async def presented_admin_key(
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
    x_admin_key: Annotated[str | None, Depends(_admin_header)],
) -> str | None:
    """The admin key a request presents: `X-Admin-Key`, else `Authorization: Bearer <key>`."""
    presented = x_admin_key or (bearer.credentials if bearer else None)
    return presented.strip() if presented else None


PresentedAdminKey = Annotated[str | None, Depends(presented_admin_key)]


async def require_admin(request: Request, ctx: ContextDep, presented: PresentedAdminKey) -> None:
    """Admin key as `Authorization: Bearer <key>` or `X-Admin-Key`; 401 if absent, 403 if wrong.
    The key is never echoed. Admin calls count against the "admin" rate and concurrency limits."""
    if not presented:
        raise APIError(
            401,
            "admin key required (Authorization: Bearer or X-Admin-Key)",
            code="missing_admin_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not admin_key_matches(presented, ctx.settings.admin_key):
        raise APIError(403, "admin key not accepted", code="invalid_admin_key")
    ctx.limiter.admit("admin", request.scope)


AdminDep = Depends(require_admin)


# ----------------------------------------------------------------------------- the caller

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AgentKey",
    description="An agent key (`rlgw_ak_...`) or a session token. Not needed with RLGW_AUTH=off.",
)
_x_api_key = APIKeyHeader(
    name="x-api-key",
    auto_error=False,
    scheme_name="AnthropicApiKey",
    description="The Messages API only: an agent key or session token as Anthropic clients send "
    "it (`x-api-key`). `Authorization: Bearer` works there too.",
)


BEARER_SENT_AS = "Authorization: Bearer"
ANTHROPIC_SENT_AS = "x-api-key or Authorization: Bearer"


def bearer_credential(authorization: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <credential>` header, as `_bearer` reads it
    (None for any other header)."""
    scheme, credential = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and credential) or scheme.lower() != "bearer":
        return None
    return credential


async def admit(ctx: GatewayContext, scope: Any, credential: str | None, sent_as: str) -> Caller:
    """The caller presenting `credential`, admitted under its rate and concurrency limits."""
    caller = await ctx.auth.identify(credential, sent_as, address_of(scope))
    ctx.limiter.admit(caller.limit_key, scope)
    return caller


async def authenticate(
    request: Request,
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """The caller of an agent-surface route, admitted under its rate and concurrency limits."""
    credential = credentials.credentials if credentials else None
    return await admit(ctx, request.scope, credential, BEARER_SENT_AS)


async def authenticate_anthropic(
    request: Request,
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_x_api_key)],
) -> Caller:
    """The caller of a Messages API route: Anthropic clients send their key as `x-api-key`
    (`Authorization: Bearer` is accepted as well, and wins when both are sent)."""
    credential = credentials.credentials if credentials else api_key
    return await admit(ctx, request.scope, credential, ANTHROPIC_SENT_AS)


CallerDep = Annotated[Caller, Depends(authenticate)]
AnthropicCallerDep = Annotated[Caller, Depends(authenticate_anthropic)]
