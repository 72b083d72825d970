"""The OpenAI error envelope, and the one set of exception handlers that produce it."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("rlgw.gateway")

OPENAI_TAG = "openai"

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


def session_not_found(session_id: str) -> APIError:
    """One answer for a missing session and for another tenant's: ids cannot be probed."""
    return APIError(404, f"no session {session_id}", code="session_not_found")


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
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The OpenAI surface answers invalid bodies with 400, as OpenAI and vLLM do; the
        # gateway's own REST API uses 422, as FastAPI does.
        route = request.scope.get("route")
        status = 400 if OPENAI_TAG in getattr(route, "tags", ()) else 422
        message, param = _validation_message(exc)
        return APIError(status, message, param=param, code="invalid_request").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail), headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Log the traceback; never send it to the caller.
        log.exception("unhandled error")
        return APIError(500, "internal error", type="api_error").response()
