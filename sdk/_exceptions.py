"""Exceptions raised by rlgw_sdk.

    GatewayError                    every failure of a call to the gateway
    ├── GatewayConnectionError      no answer: the gateway could not be reached, the connection
    │                               broke, or the call timed out (after the retries it allows)
    └── APIStatusError              the gateway answered with an error status; carries
        │                           status_code, code, message (and type, param, response)
        ├── BadRequestError         400 or 422: the request was invalid (bad id, non-finite reward)
        ├── AuthenticationError     401: the API key is missing or wrong
        ├── PermissionDeniedError   403: the API key may not do this
        ├── NotFoundError           404: no such session, or no such completion in it
        ├── ConflictError           409: the id exists, the completion is a retry orphan, the
        │                           session was consumed or has nothing to reward, an
        │                           Idempotency-Key was reused with another body, ...
        ├── RateLimitError          429: too many requests (after the retries it allows)
        └── ServerError             5xx: the gateway or something behind it failed

A status with no class of its own (405, 413, ...) raises `APIStatusError` itself. `code` is the
gateway's machine-readable reason (`session_not_found`, `completion_is_orphan`, ...), or None when
the answer was not the gateway's JSON error envelope (a proxy's HTML page, say).

Invalid arguments caught before any request (a NaN reward) raise `ValueError`, not these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

__all__ = [
    "GatewayError",
    "GatewayConnectionError",
    "APIStatusError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "RateLimitError",
    "ServerError",
]


class GatewayError(Exception):
    """Base of every error a gateway call raises."""


class GatewayConnectionError(GatewayError):
    """No answer came: connection refused or broken, or a timeout. The cause is chained."""


class APIStatusError(GatewayError):
    """The gateway answered with an error status (4xx or 5xx)."""

    def __init__(
        self,
        status_code: int,
        code: str | None,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        response: httpx.Response | None = None,
    ) -> None:
        super().__init__(status_code, code, message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.type = type
        self.param = param
        self.response = response

    def __str__(self) -> str:
        code = f" {self.code}" if self.code else ""
        return f"{self.status_code}{code}: {self.message}"


class BadRequestError(APIStatusError):
    """400 or 422: the request was malformed or a value was out of range."""


class AuthenticationError(APIStatusError):
    """401: no API key, or a wrong one."""


class PermissionDeniedError(APIStatusError):
    """403: the API key is valid but may not do this."""


class NotFoundError(APIStatusError):
    """404: the session, or the completion named in it, does not exist."""


class ConflictError(APIStatusError):
    """409: the request contradicts the stored state; `code` says which conflict."""


class RateLimitError(APIStatusError):
    """429: too many requests; raised once the retries are spent."""


class ServerError(APIStatusError):
    """5xx: the gateway failed; 502 and 503 are raised once the retries are spent."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    422: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitError,
}


def error_class(status_code: int) -> type[APIStatusError]:
    """The exception class for an error status."""
    if status_code >= 500:
        return ServerError
    return _BY_STATUS.get(status_code, APIStatusError)
