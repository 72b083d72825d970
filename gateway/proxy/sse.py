"""Server-sent events: writing the client's, reading the backend's lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from .fastjson import dumps
from .upstream import UpstreamStream


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


def sse_event(event: str, payload: dict[str, Any]) -> bytes:
    """A named server-sent event (the Responses and Messages APIs name theirs)."""
    return b"event: " + event.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


async def sse_line_batches(upstream: UpstreamStream) -> AsyncIterator[list[bytes]]:
    """The lines of a server-sent event stream, those completed by one read of the backend's
    body together (the relay then answers them in one write). A line ends with CRLF, LF or CR,
    as SSE defines it (not at U+2028 and its kin, which a JSON string may hold)."""
    rest = b""
    async for data in upstream.aiter_bytes():
        data = rest + data
        held = b""
        if b"\r" in data:
            if data.endswith(b"\r"):  # may be the first half of a CRLF
                data, held = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        rest = lines.pop() + held
        if lines:
            yield lines
    if rest:
        yield [rest.removesuffix(b"\r")]


async def sse_lines(upstream: UpstreamStream) -> AsyncIterator[bytes]:
    """The lines of a server-sent event stream, one by one."""
    async for lines in sse_line_batches(upstream):
        for line in lines:
            yield line
