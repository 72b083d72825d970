"""Times every HTTP request in a pure ASGI middleware (no BaseHTTPMiddleware: it would cost a task
per request), labelled by API, status code and served model with bounded label values."""

from __future__ import annotations

import time
from typing import Any

from ..proxy.params import MODEL_STATE_KEY
from .registry import GatewayMetrics

MODEL_KEY = MODEL_STATE_KEY  # set by the proxy in the request's state: the model it named
NO_RESPONSE = "none"  # the status label of a request that ended before answering

# Route templates to APIs, first match wins; a path no route matched (a 404) is "other".
_API_RULES = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completions"),
    ("/v1/responses", "responses"),
    ("/v1/messages/count_tokens", "count_tokens"),
    ("/v1/messages", "messages"),
    ("/v1/models", "models"),
    ("/v1/sessions", "sessions"),
    ("/admin/", "admin"),
    ("/register_model", "admin"),
    ("/healthz", "health"),
    ("/metrics", "metrics"),
    ("/dashboard", "dashboard"),
    ("/docs", "docs"),
    ("/redoc", "docs"),
    ("/openapi.json", "docs"),
)


def api_of(route_path: str) -> str:
    """The API a route template belongs to ("other" for none)."""
    for fragment, api in _API_RULES:
        if route_path.endswith(fragment) or route_path.startswith(fragment):
            return api
    return "other"


class RequestMetrics:
    """Counts and times each HTTP request once it is fully answered (streams included)."""

    def __init__(self, app: Any, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self._api_by_route: dict[str, str] = {}  # bounded by the app's routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: str | None = None

        async def send_noting_status(message: Any) -> None:
            nonlocal status
            if status is None and message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except Exception:
            status = status or "500"  # the server's error handler answers it outside of here
            raise
        finally:
            self.metrics.observe_request(
                self._api(scope),
                status or NO_RESPONSE,
                _served_model(scope),
                time.perf_counter() - started,
            )

    def _api(self, scope: Any) -> str:
        path = getattr(scope.get("route"), "path", None)
        if not isinstance(path, str):
            return "other"
        api = self._api_by_route.get(path)
        if api is None:
            api = self._api_by_route[path] = api_of(path)
        return api


def _served_model(scope: Any) -> str:
    state = scope.get("state")
    model = state.get(MODEL_KEY) if isinstance(state, dict) else None
    if not model:
        return ""
    context = getattr(getattr(scope.get("app"), "state", None), "context", None)
    return model if context is not None and model in context.pool.models() else ""
