"""Streaming: forward the backend's server-sent events to the client, recording every token, and
end the stream only once the records are stored."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi.responses import StreamingResponse

from ..errors import APIError
from ..recording.recorder import Recorder
from .assembly import StreamAssembly
from .call import Call, fill, ms_since
from .echo import EchoStream
from .fastjson import loads
from .shaping import shown_as
from .sse import sse_line_batches
from .upstream import UpstreamStream

# At most this many events of one read of the backend in one write to the client.
_EVENTS_PER_WRITE = 32


class Final(bytes):
    """The stream's last bytes: they go out with the end of the response, in one write."""

    __slots__ = ()


class RecordedStream(StreamingResponse):
    """A StreamingResponse that always closes its generator, so a disconnect is recorded at once,
    and sends a `Final` chunk together with the end of the response.

    `on_abandon` runs when the client left before the generator ever started (it then holds a
    backend lease and an open upstream stream that nobody else would release).
    """

    def __init__(self, content: AsyncIterator[bytes], on_abandon: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_abandon = on_abandon

    async def stream_response(self, send: Any) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.body_iterator:
                last = isinstance(chunk, Final)
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self._on_abandon()


class Relay:
    """Forwards one upstream SSE stream to the client, recording every token on the way."""

    def __init__(
        self,
        call: Call,
        upstream: UpstreamStream,
        held: contextlib.AsyncExitStack,
        recorder: Recorder,
    ) -> None:
        self.call, self.upstream, self.held, self.recorder = call, upstream, held, recorder
        self.started = False
        self.released = False
        self.echo = EchoStream(call.echo) if call.echo is not None else None

    async def _release(self) -> None:
        if not self.released:
            self.released = True
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
                await self.held.aclose()

    async def abandon(self) -> None:
        if not self.started and not self.released:
            await self._release()
            self.recorder.record_nowait(
                self.call.finish("incomplete", "client disconnected before the stream started")
            )

    def _take(self, line: bytes, out: list[bytes]) -> tuple[str, str | None] | None:
        """Take one line of the backend's stream, adding the client's events to `out`; the
        outcome once the line ends the stream."""
        if not line.startswith(b"data:"):
            return None
        data = line[5:].strip()
        if data == b"[DONE]":
            if self.assembly.finished(len(self.call.records)):
                return ("complete", None)
            return ("incomplete", "stream ended without a finish reason")
        chunk = loads(data, errors="replace")
        if not isinstance(chunk, dict):
            raise ValueError(f"not a stream chunk: {data[:100].decode(errors='replace')!r}")
        if "error" in chunk:
            out.append(self.shaper.backend_error(chunk))
            return ("error", f"backend error in stream: {json.dumps(chunk['error'])[:500]}")
        call = self.call
        shown_as(chunk, call.surface.model)
        if call.record.ttft_ms is None and chunk.get("choices"):
            ttft = ms_since(call.t0)
            for r in call.records:
                r.ttft_ms = ttft
        self.assembly.add(chunk)
        if self.echo is not None:  # after the assembly: lineage continues the output alone
            self.echo.chunk(chunk)
        out.extend(self.shaper.chunk(chunk))
        return None

    async def run(self) -> AsyncIterator[bytes]:
        """Relay chunks as they come; end the stream only after the records are committed."""
        self.started = True
        call = self.call
        echo_text = call.echo.text if call.echo is not None else ""
        assembly = self.assembly = StreamAssembly(call.surface.wire, echo_text=echo_text)
        shaper = self.shaper = call.surface.shaper(assembly, call.record.id)
        outcome: tuple[str, str | None] = ("incomplete", "client disconnected before the end")
        out: list[bytes] = []  # events not sent yet
        try:
            if start := shaper.start():
                yield b"".join(start)
            flush_at = 1  # the first event goes out alone: nothing delays the first byte
            async for lines in sse_line_batches(self.upstream):
                ended = None
                for line in lines:
                    if ended := self._take(line, out):
                        break
                    if len(out) >= flush_at:  # a long read: its events go out as parsed
                        batch, out, flush_at = b"".join(out), [], _EVENTS_PER_WRITE
                        yield batch
                if out:  # the (rest of the) events of one read of the backend in one write
                    batch, out = b"".join(out), []
                    yield batch
                if ended:
                    outcome = ended
                    break
            else:
                outcome = ("incomplete", "backend stream ended without [DONE]")
        except (httpx.HTTPError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            outcome = ("incomplete", f"backend stream cut: {exc!r}")
        finally:
            await self._release()
            for index, r in enumerate(call.records):
                if index in assembly.choices:
                    fill(r, assembly.choices[index].tokens, call.echo)
                    call.choices[index] = assembly.choice_view(index)
                    r.response = shaper.record_response(index)
                elif r.prompt_token_ids is None:
                    r.prompt_token_ids = assembly.prompt_token_ids
            call.finish(*outcome)
            if outcome[0] != "complete":  # also runs when the client disconnected (cancellation)
                self.recorder.record_nowait(call.records)
        if outcome[0] == "complete":
            try:
                await self.recorder.record(call.records)
            except APIError as exc:  # never report success for a completion that was not stored
                yield Final(shaper.error(exc))
                return
            if end := shaper.finish():
                yield Final(b"".join(end))
        elif outcome[0] == "incomplete":  # after the events of the lines before the cut
            reason = f"stream did not complete: {outcome[1]}"
            error = shaper.error(APIError(502, reason, code="stream_incomplete"))
            yield Final(b"".join(out) + error)
