"""GET /healthz: the gateway, its database and each backend, checked now."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from .deps import ContextDep

router = APIRouter(tags=["health"])


async def _database_ok(ctx: ContextDep) -> str | None:
    try:
        async with ctx.sessions() as db:
            await db.execute(text("SELECT 1"))
        return None
    except Exception as exc:  # report, do not raise: health must answer
        return type(exc).__name__


async def _backend_ok(http: httpx.AsyncClient, url: str) -> str | None:
    try:
        reply = await http.get(url + "/health", timeout=2.0)
        return None if reply.status_code == 200 else f"HTTP {reply.status_code}"
    except httpx.HTTPError as exc:
        return type(exc).__name__


@router.get("/healthz")
async def healthz(ctx: ContextDep) -> JSONResponse:
    views = ctx.pool.backends()
    db_error, *backend_errors = await asyncio.gather(
        _database_ok(ctx), *(_backend_ok(ctx.http, b.url) for b in views)
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
        }
        for b, err in zip(views, backend_errors, strict=True)
    ]
    serving = any(b["reachable"] and b["state"] == "active" for b in backends)
    status = "ok" if db_error is None and serving else ("degraded" if db_error is None else "down")
    body = {
        "status": status,
        "database": {"ok": db_error is None, "error": db_error},
        "recorder": {
            "backlog": ctx.recorder.backlog,
            "written": ctx.recorder.written,
            "failed": ctx.recorder.failed,
        },
        "backends": backends,
    }
    return JSONResponse(body, status_code=200 if db_error is None else 503)
