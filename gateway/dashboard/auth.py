"""The admin key for browsers: a browser cannot send a Bearer header when it navigates, so the
dashboard also takes HTTP Basic with the admin key as the password (any user name), and asks for
it with `WWW-Authenticate: Basic`. Bearer and X-Admin-Key work as on every admin route."""

from __future__ import annotations

import base64
import binascii

from fastapi import Depends, Request

from ..deps import ContextDep, admin_key_matches
from ..errors import APIError

CHALLENGE = {"WWW-Authenticate": 'Basic realm="rlgw"'}


def _presented(request: Request) -> tuple[str | None, bool]:
    """The key a request presents, and whether it came as HTTP Basic. X-Admin-Key wins, as in
    deps.require_admin; a malformed Basic credential presents an empty key."""
    header_key = request.headers.get("x-admin-key")
    if header_key:
        return header_key, False
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return credential.strip() or None, False
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credential.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return "", True
        return decoded.partition(":")[2], True
    return None, False


async def require_admin_browser(request: Request, ctx: ContextDep) -> None:
    """401 with a Basic challenge when no key is presented, or a wrong one as Basic (so that the
    browser asks again); 403 for a wrong Bearer or X-Admin-Key. The key is never echoed."""
    presented, basic = _presented(request)
    if presented is None:
        raise APIError(
            401,
            "admin key required (HTTP Basic with the key as password, Authorization: Bearer "
            "or X-Admin-Key)",
            code="missing_admin_key",
            headers=CHALLENGE,
        )
    if not admin_key_matches(presented.strip(), ctx.settings.admin_key):
        if basic:
            raise APIError(
                401, "admin key not accepted", code="invalid_admin_key", headers=CHALLENGE
            )
        raise APIError(403, "admin key not accepted", code="invalid_admin_key")
    ctx.limiter.admit("admin", request.scope)


BrowserAdminDep = Depends(require_admin_browser)
