"""GET /dashboard (the page) and GET /dashboard/data (what it polls), behind the admin key."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse

from ..deps import ContextDep
from .auth import BrowserAdminDep
from .data import dashboard_data

router = APIRouter(tags=["admin"], dependencies=[BrowserAdminDep])
_PAGE = files(__package__).joinpath("dashboard.html")
# The page loads nothing from anywhere: inline script and style, data from this origin only.
_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(_PAGE.read_text(encoding="utf-8"), headers=_HEADERS)


@router.get("/dashboard/data", include_in_schema=False)
async def data(request: Request, ctx: ContextDep) -> JSONResponse:
    body: dict[str, Any] = await dashboard_data(ctx, request.app.state.metrics)
    return JSONResponse(jsonable_encoder(body), headers={"Cache-Control": "no-store"})
