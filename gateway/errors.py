"""The error envelopes (OpenAI's, and Anthropic's on the Messages API), and the one set of exception
handlers that produce them."""

from __future__ import annotations

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlgw.db.faults import is_connection_error

log = logging.getLogger("rlgw.gateway")

OPENAI_TAG = "openai"
ANTHROPIC_TAG = "anthropic"  # routes whose errors take Anthropic's envelope

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error envelope: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorDetail


class APIError(Exception):
    """An error a caller can cause or must be told about, rendered as the OpenAI envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPE_BY_STATUS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers

    def envelope(self) -> dict:
        return ErrorResponse(
            error=ErrorDetail(
                message=self.message, type=self.type, param=self.param, code=self.code
            )
        ).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.envelope(), status_code=self.status, headers=self.headers)

    def anthropic_envelope(self) -> dict:
        return {
            "type": "error",
            "error": {"type": anthropic_type(self.status), "message": self.message},
        }

    def anthropic_response(self) -> JSONResponse:
        """The same error in Anthropic's envelope (the Messages API)."""
        return JSONResponse(
            self.anthropic_envelope(), status_code=self.status, headers=self.headers
        )

    def response_for(self, request_scope: dict) -> JSONResponse:
        """The envelope of the API the request was made to."""
        if is_anthropic(request_scope):
            return self.anthropic_response()
        return self.response()


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def is_anthropic(scope: dict) -> bool:
    """Whether a request was made to the Messages API (its errors take Anthropic's envelope):
    by its route once routed, by its path before (the body limit answers before routing)."""
    route = scope.get("route")
    if route is not None:
        return ANTHROPIC_TAG in getattr(route, "tags", ())
    path = scope.get("path") or ""
    return path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens")


def session_not_found(session_id: str) -> APIError:
    """One answer for a missing session and for another tenant's: ids cannot be probed."""
    return APIError(404, f"no session {session_id}", code="session_not_found")


def database_unavailable() -> APIError:
    """The database cannot be reached now (restarting, cut off): retry later."""
    return APIError(
        503,
        "the database is unavailable; retry later",
        code="database_unavailable",
        headers={"Retry-After": "1"},
    )


def database_timeout(waited_s: float) -> APIError:
    """The database did not confirm a write in time (overloaded, or cut off without a reset)."""
    return APIError(
        503,
        f"the database did not confirm the write within {waited_s:g} s; the completion was not "
        "recorded; retry later",
        code="database_timeout",
        headers={"Retry-After": "1"},
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response_for(request.scope)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The model APIs (OpenAI's, Anthropic's) answer invalid bodies with 400, as OpenAI,
        # Anthropic and vLLM do; the gateway's own REST API uses 422, as FastAPI does.
        tags = getattr(request.scope.get("route"), "tags", ())
        status = 400 if OPENAI_TAG in tags or ANTHROPIC_TAG in tags else 422
        message, param = _validation_message(exc)
        error = APIError(status, message, param=param, code="invalid_request")
        return error.response_for(request.scope)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = APIError(exc.status_code, str(exc.detail), headers=exc.headers)
        return error.response_for(request.scope)

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        # An unreachable database is the caller's 503 (retry later), in the route's envelope.
        if is_connection_error(exc):
            log.warning("database unavailable on %s: %s", request.url.path, exc)
            return database_unavailable().response_for(request.scope)
        log.exception("unhandled database error")
        return APIError(500, "internal error", type="api_error").response_for(request.scope)

    app.add_exception_handler(SQLAlchemyError, _database)
    app.add_exception_handler(psycopg.Error, _database)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Log the traceback; never send it to the caller.
        log.exception("unhandled error")
        return APIError(500, "internal error", type="api_error").response_for(request.scope)
