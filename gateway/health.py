"""GET /healthz: the gateway, its database and each backend, checked now."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from .auth import admin_key_matches, client_address
from .deps import ContextDep, PresentedAdminKey
from .proxy.backend_health import probe

router = APIRouter(tags=["health"])


async def _database_ok(ctx: ContextDep) -> str | None:
    """None when the database answers now; else why not. Bounded: a database that does not
    answer is reported down after the connect timeout, and a new connection is tried next time
    (the pool drops dead ones), so health recovers by itself."""
    try:
        async with asyncio.timeout(ctx.settings.database_connect_timeout_s + 1):
            async with ctx.db_sessions() as db:
                await db.execute(text("SELECT 1"))
        return None
    except Exception as exc:  # report, do not raise: health must answer
        return type(exc).__name__


def _shows_addresses(ctx: ContextDep, admin_key: str | None) -> bool:
    """Backend URLs are internal addresses: with auth on, only the admin key sees them."""
    return not ctx.auth.enabled or admin_key_matches(admin_key, ctx.settings.admin_key)


@router.get("/healthz")
async def healthz(request: Request, ctx: ContextDep, admin_key: PresentedAdminKey) -> JSONResponse:
    """Open to all (load balancers need no key), under the client address's rate limit. With
    auth on, the admin key (optional) also shows the backends' addresses and errors."""
    ctx.limiter.admit(f"addr:{client_address(request)}", request.scope)
    views = ctx.pool.backends()
    db_error, *backend_errors = await asyncio.gather(
        _database_ok(ctx), *(probe(ctx.http, b.url) for b in views)
    )
    backends: list[dict[str, Any]] = [
        {
            "id": b.id,
            "model": b.model,
            "url": b.url,
            "state": b.state,
            "served_version": b.served_version,
            "in_flight": b.in_flight,
            "reachable": err is None,
            "error": err,
            "routable": b.routable,  # this process's routing view (its own health probes)
        }
        for b, err in zip(views, backend_errors, strict=True)
    ]
    serving = any(b["reachable"] and b["state"] == "active" for b in backends)
    # `rlgw up`'s trainer and vLLM, when this gateway was started beside them
    children = request.app.state.children() if request.app.state.children else None
    # Not following the registry: calls are served but recorded as not trainable (swap_doubt).
    healthy = serving and ctx.pool.following
    healthy = healthy and all(c["running"] for c in (children or {}).values())
    status = "ok" if db_error is None and healthy else ("degraded" if db_error is None else "down")
    body = {
        "status": status,
        "process": os.getpid(),  # tells the replicas of `rlgw serve --workers N` apart
        "database": {"ok": db_error is None, "error": db_error},
        "registry": {"following": ctx.pool.following},
        "recorder": {
            "backlog": ctx.recorder.backlog,
            "written": ctx.recorder.written,
            "failed": ctx.recorder.failed,
            "retries": ctx.recorder.retries,
            "timeouts": ctx.recorder.timeouts,
        },
        "backends": backends
        if _shows_addresses(ctx, admin_key)
        else [{k: v for k, v in b.items() if k not in ("url", "error")} for b in backends],
    }
    if children is not None:  # log paths are the host's: only where addresses are shown
        shown = _shows_addresses(ctx, admin_key)
        body["children"] = {
            name: {k: v for k, v in c.items() if shown or k != "log"}
            for name, c in children.items()
        }
    return JSONResponse(body, status_code=200 if db_error is None else 503)
