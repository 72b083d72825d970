"""ASGI middleware that refuses request bodies over a size limit with 413, before parsing them."""

from __future__ import annotations

from typing import Any

from .errors import APIError


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = APIError(
            413, f"request body exceeds {self.max_bytes} bytes", code="body_too_large"
        )
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await too_large.response_for(scope)(scope, receive, send)
                return
        seen = 0
        started = False  # the app's response has begun: it can no longer be replaced
        exceeded = False
        answered = False

        async def counting_receive() -> Any:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise _TooLarge
            return message

        async def answer_413() -> None:
            nonlocal answered
            if not answered:
                answered = True
                await too_large.response_for(scope)(scope, receive, send)

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if exceeded and not started:
                # The app caught the overflow and answered something else (FastAPI turns any
                # error while reading a body into a 400): the caller gets the 413 instead.
                await answer_413()
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _TooLarge:
            if not started:
                await answer_413()
