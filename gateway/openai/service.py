"""The proxy's work: route to a backend, relay the answer (streamed or not), record it durably."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..errors import APIError
from ..recording import lineage
from ..recording.record import CompletionRecord
from ..recording.recorder import Recorder
from ..routing import BackendPool, Lease
from ..session_binding import implicit_session_id, open_session
from .fastjson import FastJSONResponse, loads
from .shaping import (
    CHAT,
    COMPLETIONS,
    Extracted,
    StreamAssembly,
    choices_by_index,
    extract_choices,
    sibling_id,
)
from .surface import Surface, backend_error_message

log = logging.getLogger("rlgw.proxy")

_PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}
# Failures to connect: nothing reached the backend, so nothing was generated and another backend
# may take the request. A read error or timeout comes after the request was sent: never retried.
_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)


def _now() -> datetime:
    return datetime.now(UTC)


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


@dataclass
class _Call:
    """One generation request in flight through the gateway: one record per choice."""

    surface: Surface
    records: list[CompletionRecord]
    t0: float
    sequence: Any = None  # what the request was conditioned on (lineage)
    choices: dict[int, dict[str, Any]] = field(default_factory=dict)  # wire-format, by index
    swap_doubt: Any = None  # () -> str | None, set once a backend is leased

    @property
    def record(self) -> CompletionRecord:
        """The record of choice 0 (whose id is the reply's id)."""
        return self.records[0]

    def finish(self, status: str, reason: str | None = None) -> list[CompletionRecord]:
        doubt = self.swap_doubt() if self.swap_doubt is not None else None
        latency, finished = _ms_since(self.t0), _now()
        wire = self.surface.wire
        for index, rec in enumerate(self.records):
            rec.status, rec.status_reason = status, reason
            if status == "complete" and index not in self.choices:
                rec.status = "error"
                rec.status_reason = f"the backend's reply has no choice {index}"
            elif status == "complete" and rec.finish_reason == "abort":
                # vLLM ends an aborted request (a swap's drain timed out, a stop) like a finished
                # one: its output was cut, so the record must not look complete.
                rec.status = "incomplete"
                rec.status_reason = "the backend aborted the generation (finish_reason abort)"
            # Its tokens may come from two weight versions: never train on a guessed label.
            # Not following: the recorder settles it against the registry when it writes.
            rec.swap_doubt = doubt
            rec.latency_ms = latency
            rec.finished_at = finished
            if rec.response is not None:
                seq = lineage.continuation_of(
                    wire, self.sequence, self.choices.get(index), rec.output_token_ids
                )
                rec.continuation_hash, rec.continuation_len = lineage.sequence_hash(seq), len(seq)
        return self.records


class RecordedStream(StreamingResponse):
    """A StreamingResponse that always closes its generator, so a disconnect is recorded at once.

    `on_abandon` runs when the client left before the generator ever started (it then holds a
    backend lease and an open upstream stream that nobody else would release).
    """

    def __init__(self, content: AsyncIterator[bytes], on_abandon: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_abandon = on_abandon

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self._on_abandon()


def _fill(rec: CompletionRecord, tokens: Extracted | None) -> None:
    if tokens is None:
        return
    rec.prompt_token_ids, rec.finish_reason = tokens.prompt_token_ids, tokens.finish_reason
    rec.output_token_ids, rec.output_logprobs = tokens.output_token_ids, tokens.output_logprobs


class ProxyService:
    def __init__(
        self, pool: BackendPool, recorder: Recorder, http: httpx.AsyncClient, sessions: Any
    ) -> None:
        self._pool = pool
        self._recorder = recorder
        self._http = http
        self._sessions = sessions

    async def generate(
        self,
        surface: Surface,
        session_id: str | None,
        idempotency_key: str | None = None,
        receive: Any = None,
        *,
        tenant: str | None = None,
    ):
        """Serve one generation request. `receive` is the ASGI receive channel, watched for the
        client hanging up while a non-streamed answer is being generated. With a `tenant`, a
        named session must be that tenant's (or new, and then it becomes that tenant's); a new
        implicit session is that tenant's too.

        Each choice is recorded on its own: choice `i` under `sibling_id(record_id, i)`; with
        n > 1 they share `sibling_group` (the record id of choice 0)."""
        record_id = surface.record_prefix + uuid.uuid4().hex
        if session_id is not None:
            await open_session(self._sessions, session_id, tenant)
        n = surface.choices
        created = _now()
        retry_group = (
            None
            if session_id is None
            else lineage.retry_key(session_id, surface.api, surface.body, idempotency_key)
        )
        records = [
            CompletionRecord(
                id=sibling_id(record_id, i),
                session_id=session_id or implicit_session_id(record_id),
                implicit_session=session_id is None,
                tenant=tenant,
                api=surface.api,
                model=surface.model,
                stream=surface.stream,
                request=surface.body,
                backend_request=surface.wire_body if surface.translated else None,
                created_at=created,
                sequence=None,
                retry_group=retry_group,
                sibling_group=record_id if n > 1 else None,
            )
            for i in range(n)
        ]
        call = _Call(surface=surface, records=records, t0=time.perf_counter())
        call.sequence = lineage.request_sequence(surface.wire, surface.wire_body)
        for rec in records:
            rec.sequence = call.sequence
        headers = {"X-Session-Id": call.record.session_id, "X-Completion-Id": record_id}
        if n > 1:
            headers["X-Completion-Ids"] = ",".join(r.id for r in records)
        try:
            if surface.stream:
                return await self._stream(call, headers)
            return await self._complete(call, headers, receive)
        except APIError as exc:  # tell the client which record holds the failure
            exc.headers = {**(exc.headers or {}), **headers}
            raise

    async def count_tokens(self, chat: dict[str, Any]) -> int:
        """How many tokens the backend renders a chat request's prompt to (nothing recorded)."""
        body = {
            k: chat[k]
            for k in ("model", "messages", "tools", "chat_template_kwargs")
            if chat.get(k) is not None
        }
        body["add_generation_prompt"] = True
        try:
            held, reply = await self._send(
                chat["model"], lambda lease: self._http.post(lease.url + "/tokenize", json=body)
            )
        except httpx.HTTPError as exc:
            raise APIError(502, "the backend could not be reached", code="backend_error") from exc
        await held.aclose()
        if reply.status_code != 200:
            message, _ = backend_error_message(reply.status_code, reply.content)
            status = 502 if reply.status_code >= 500 else reply.status_code
            raise APIError(status, message, code="backend_error")
        try:
            return int(reply.json()["count"])
        except (ValueError, KeyError, TypeError):
            raise APIError(502, "the backend sent an invalid reply", code="backend_error") from None

    async def _complete(self, call: _Call, headers: dict[str, str], receive: Any) -> Response:
        surface = call.surface

        def post(lease: Lease) -> Awaitable[httpx.Response]:
            request = self._http.post(lease.url + _PATHS[surface.wire], json=surface.upstream())
            return _unless_client_leaves(request, receive)

        try:
            held, reply = await self._send(surface.model, post, call)
        except httpx.HTTPError as exc:
            await self._record_failure(call, f"backend unreachable: {exc!r}")
            raise APIError(502, "the backend could not be reached", code="backend_error") from exc
        except _ClientGone:
            self._recorder.record_nowait(
                call.finish("incomplete", "client disconnected before the answer")
            )
            return JSONResponse({}, status_code=499)  # nobody is listening
        await held.aclose()
        if reply.status_code != 200:
            await self._record_failure(
                call, f"backend answered {reply.status_code}: {reply.text[:500]}"
            )
            return surface.relay_error(reply.status_code, reply.content, headers)
        try:
            payload = loads(reply.content)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            await self._record_failure(call, f"backend sent invalid JSON: {reply.text[:200]!r}")
            raise APIError(502, "the backend sent an invalid reply", code="backend_error") from None
        call.choices = choices_by_index(payload)
        tokens = extract_choices(surface.wire, payload)
        for index, rec in enumerate(call.records):
            _fill(rec, tokens.get(index))
        client_payload, stored = surface.reply(payload, call.record.id)
        for index, rec in enumerate(call.records):
            rec.response = stored[index] if index < len(stored) else None
        await self._recorder.record(call.finish("complete"))
        return FastJSONResponse(client_payload, headers=headers)

    async def _stream(self, call: _Call, headers: dict[str, str]) -> Response:
        surface = call.surface

        def send(lease: Lease) -> Awaitable[httpx.Response]:
            url = lease.url + _PATHS[surface.wire]
            request = self._http.build_request("POST", url, json=surface.upstream())
            return self._http.send(request, stream=True)

        try:
            held, upstream = await self._send(surface.model, send, call)
        except httpx.HTTPError as exc:
            await self._record_failure(call, f"backend unreachable: {exc!r}")
            raise APIError(502, "the backend could not be reached", code="backend_error") from exc
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            await held.aclose()
            await self._record_failure(
                call,
                f"backend answered {upstream.status_code}: "
                f"{content[:500].decode(errors='replace')}",
            )
            return surface.relay_error(upstream.status_code, content, headers)
        relay = _Relay(call, upstream, held, self._recorder)
        return RecordedStream(
            relay.run(), relay.abandon, media_type="text/event-stream", headers=headers
        )

    async def _send(
        self,
        model: str,
        send: Callable[[Lease], Awaitable[Any]],
        call: _Call | None = None,
    ) -> tuple[contextlib.AsyncExitStack, Any]:
        """Lease a backend of `model` and `send(lease)` to it; returns the held lease (close it to
        release the backend) and the reply. A backend that cannot be connected to is marked
        unreachable in this process and the request goes to another, each tried once; when none
        is left, 503 `backend_unavailable`. `call`, if given, is stamped with the backend that
        answered, and recorded as failed when no backend could take it."""
        refused: dict[int, str] = {}  # backend id -> why it could not be connected to
        while True:
            held = contextlib.AsyncExitStack()
            try:
                lease = await held.enter_async_context(self._pool.lease(model, exclude=refused))
            except APIError as exc:
                if call is not None and exc.code == "backend_unavailable":
                    tried = "".join(f"; backend {i}: {why}" for i, why in refused.items())
                    await self._record_failure(call, exc.message + tried)
                raise
            if call is not None:
                self._stamp(call, lease)
            try:
                return held, await send(lease)
            except BaseException as exc:
                await held.aclose()
                if not isinstance(exc, _CONNECT_ERRORS):
                    raise
                refused[lease.backend_id] = repr(exc)
                await self._pool.mark(lease.backend_id, type(exc).__name__)

    def _stamp(self, call: _Call, lease: Lease) -> None:
        # The version resident on the backend for the whole lease: a swap drains the backend
        # first, and a request still running when the swap pauses it is caught by its epoch.
        for rec in call.records:
            rec.backend_id = lease.backend_id
            rec.policy_version = lease.served_version
            rec.lease_epoch = lease.swap_epoch
        call.swap_doubt = lambda: self._pool.swap_doubt(lease)

    async def _record_failure(self, call: _Call, reason: str) -> None:
        try:
            await self._recorder.record(call.finish("error", reason))
        except APIError:
            log.error("failed call %s could not be recorded: %s", call.record.id, reason)


class _Relay:
    """Forwards one upstream SSE stream to the client, recording every token on the way."""

    def __init__(
        self,
        call: _Call,
        upstream: httpx.Response,
        held: contextlib.AsyncExitStack,
        recorder: Recorder,
    ) -> None:
        self.call, self.upstream, self.held, self.recorder = call, upstream, held, recorder
        self.started = False
        self.released = False

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
        if call.record.ttft_ms is None and chunk.get("choices"):
            ttft = _ms_since(call.t0)
            for r in call.records:
                r.ttft_ms = ttft
        self.assembly.add(chunk)
        out.extend(self.shaper.chunk(chunk))
        return None

    async def run(self) -> AsyncIterator[bytes]:
        """Relay chunks as they come; end the stream only after the records are committed."""
        self.started = True
        call = self.call
        assembly = self.assembly = StreamAssembly(call.surface.wire)
        shaper = self.shaper = call.surface.shaper(assembly, call.record.id)
        outcome: tuple[str, str | None] = ("incomplete", "client disconnected before the end")
        out: list[bytes] = []  # events not sent yet
        try:
            if start := shaper.start():
                yield b"".join(start)
            async for line in _sse_lines(self.upstream):
                ended = self._take(line, out)
                if out:  # the events of one chunk in one write
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
                    _fill(r, assembly.choices[index].tokens)
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
                yield shaper.error(exc)
                return
            if end := shaper.finish():
                yield b"".join(end)
        elif outcome[0] == "incomplete":  # after the events of the lines before the cut
            reason = f"stream did not complete: {outcome[1]}"
            yield b"".join(out) + shaper.error(APIError(502, reason, code="stream_incomplete"))


async def _sse_lines(upstream: httpx.Response) -> AsyncIterator[bytes]:
    """The lines of a server-sent event stream. A line ends with CRLF, LF or CR, as SSE defines
    it (not at U+2028 and its kin, which a JSON string may hold)."""
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
        for line in lines:
            yield line
    if rest:
        yield rest.removesuffix(b"\r")


class _ClientGone(Exception):
    """The client hung up while its answer was being generated."""


async def _wait_for_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(work: Any, receive: Any) -> Any:
    """Await `work`, cancelling it (and so the backend request) if the client disconnects."""
    if receive is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise _ClientGone
    return task.result()
