"""The proxy's work: route to a backend, relay the answer (streamed or not), record it durably."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
from fastapi.responses import JSONResponse, StreamingResponse

from .. import lineage
from ..errors import APIError
from ..recording import CompletionRecord, Recorder
from ..routing import BackendPool, Lease
from ..session_binding import implicit_session_id, open_session
from .shaping import (
    CHAT,
    ClientAsks,
    StreamAssembly,
    client_asks,
    extract,
    make_visible,
    upstream_body,
)

log = logging.getLogger("rlgw.proxy")

_PATHS = {CHAT: "/v1/chat/completions", "completions": "/v1/completions"}
_ID_PREFIX = {CHAT: "chatcmpl-", "completions": "cmpl-"}


def _now() -> datetime:
    return datetime.now(UTC)


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


@dataclass
class _Call:
    """One generation request in flight through the gateway."""

    api: str
    body: dict[str, Any]
    asks: ClientAsks
    record: CompletionRecord
    t0: float
    crossed_swap: Any = None  # () -> bool, set once a backend is leased

    def finish(self, status: str, reason: str | None = None) -> CompletionRecord:
        rec = self.record
        rec.status, rec.status_reason = status, reason
        if self.crossed_swap is not None and self.crossed_swap():
            # Its tokens may come from two weight versions: never train on a guessed label.
            rec.exclusion_reason = "the request crossed a weight swap of its backend"
        rec.latency_ms = _ms_since(self.t0)
        rec.finished_at = _now()
        if rec.response is not None:
            seq = lineage.continuation(self.api, self.body, rec.response, rec.output_token_ids)
            rec.continuation_hash, rec.continuation_len = lineage.sequence_hash(seq), len(seq)
        return rec


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
        api: str,
        body: dict[str, Any],
        session_id: str | None,
        idempotency_key: str | None = None,
        receive: Any = None,
        *,
        tenant: str | None = None,
    ):
        """Serve one generation request. `receive` is the ASGI receive channel, watched for the
        client hanging up while a non-streamed answer is being generated. With a `tenant`, a
        named session must be that tenant's (or new, and then it becomes that tenant's); a new
        implicit session is that tenant's too."""
        record_id = _ID_PREFIX[api] + uuid.uuid4().hex
        if session_id is not None:
            await open_session(self._sessions, session_id, tenant)
        call = _Call(
            api=api,
            body=body,
            asks=client_asks(api, body),
            record=CompletionRecord(
                id=record_id,
                session_id=session_id or implicit_session_id(record_id),
                implicit_session=session_id is None,
                tenant=tenant,
                api=api,
                model=body["model"],
                stream=bool(body.get("stream")),
                request=body,
                created_at=_now(),
                sequence=lineage.request_sequence(api, body),
                retry_group=None
                if session_id is None
                else lineage.retry_key(session_id, api, body, idempotency_key),
            ),
            t0=time.perf_counter(),
        )
        headers = {"X-Session-Id": call.record.session_id, "X-Completion-Id": record_id}
        try:
            if call.record.stream:
                return await self._stream(call, headers)
            return await self._complete(call, headers, receive)
        except APIError as exc:  # tell the client which record holds the failure
            exc.headers = {**(exc.headers or {}), **headers}
            raise

    async def _complete(self, call: _Call, headers: dict[str, str], receive: Any) -> JSONResponse:
        async with self._pool.lease(call.record.model) as lease:
            self._stamp(call, lease)
            post = self._http.post(
                lease.url + _PATHS[call.api], json=upstream_body(call.api, call.body)
            )
            try:
                reply = await _unless_client_leaves(post, receive)
            except httpx.HTTPError as exc:
                await self._record_failure(call, f"backend unreachable: {exc!r}")
                raise APIError(
                    502, "the backend could not be reached", code="backend_error"
                ) from exc
            except _ClientGone:
                self._recorder.record_nowait(
                    call.finish("incomplete", "client disconnected before the answer")
                )
                return JSONResponse({}, status_code=499)  # nobody is listening
        if reply.status_code != 200:
            await self._record_failure(
                call, f"backend answered {reply.status_code}: {reply.text[:500]}"
            )
            return _relay_error(reply.status_code, reply.content, headers)
        payload = reply.json()
        tokens = extract(call.api, payload)
        rec = call.record
        rec.prompt_token_ids, rec.finish_reason = tokens.prompt_token_ids, tokens.finish_reason
        rec.output_token_ids, rec.output_logprobs = tokens.output_token_ids, tokens.output_logprobs
        make_visible(call.api, payload, call.asks, rec.id)
        rec.response = payload
        rec.ttft_ms = None
        await self._recorder.record(call.finish("complete"))
        return JSONResponse(payload, headers=headers)

    async def _stream(
        self, call: _Call, headers: dict[str, str]
    ) -> StreamingResponse | JSONResponse:
        lease_cm = self._pool.lease(call.record.model)
        lease = await lease_cm.__aenter__()
        try:
            self._stamp(call, lease)
            request = self._http.build_request(
                "POST", lease.url + _PATHS[call.api], json=upstream_body(call.api, call.body)
            )
            upstream = await self._http.send(request, stream=True)
        except BaseException as exc:
            await lease_cm.__aexit__(None, None, None)
            if isinstance(exc, httpx.HTTPError):
                await self._record_failure(call, f"backend unreachable: {exc!r}")
                raise APIError(
                    502, "the backend could not be reached", code="backend_error"
                ) from exc
            raise
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            await lease_cm.__aexit__(None, None, None)
            await self._record_failure(
                call,
                f"backend answered {upstream.status_code}: "
                f"{content[:500].decode(errors='replace')}",
            )
            return _relay_error(upstream.status_code, content, headers)
        relay = _Relay(call, upstream, lease_cm, self._recorder)
        return RecordedStream(
            relay.run(), relay.abandon, media_type="text/event-stream", headers=headers
        )

    @staticmethod
    def _fill(rec: CompletionRecord, assembly: StreamAssembly) -> None:
        tokens = assembly.tokens
        rec.prompt_token_ids, rec.finish_reason = tokens.prompt_token_ids, tokens.finish_reason
        rec.output_token_ids, rec.output_logprobs = tokens.output_token_ids, tokens.output_logprobs
        rec.response = assembly.response(rec.id)

    def _stamp(self, call: _Call, lease: Lease) -> None:
        # The version resident on the backend for the whole lease: a swap drains the backend
        # first, and a request still running when the swap pauses it is caught by its epoch.
        call.record.backend_id = lease.backend_id
        call.record.policy_version = lease.served_version
        call.crossed_swap = lambda: self._pool.crossed_swap(lease)

    async def _record_failure(self, call: _Call, reason: str) -> None:
        try:
            await self._recorder.record(call.finish("error", reason))
        except APIError:
            log.error("failed call %s could not be recorded: %s", call.record.id, reason)


class _Relay:
    """Forwards one upstream SSE stream to the client, recording every token on the way."""

    def __init__(
        self, call: _Call, upstream: httpx.Response, lease_cm: Any, recorder: Recorder
    ) -> None:
        self.call, self.upstream, self.lease_cm, self.recorder = call, upstream, lease_cm, recorder
        self.started = False
        self.released = False

    async def _release(self) -> None:
        if not self.released:
            self.released = True
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
                await self.lease_cm.__aexit__(None, None, None)

    async def abandon(self) -> None:
        if not self.started and not self.released:
            await self._release()
            self.recorder.record_nowait(
                self.call.finish("incomplete", "client disconnected before the stream started")
            )

    async def run(self) -> AsyncIterator[bytes]:
        """Relay chunks as they come; send [DONE] only after the record is committed."""
        self.started = True
        call, rec = self.call, self.call.record
        assembly = StreamAssembly(call.api)
        outcome: tuple[str, str | None] = ("incomplete", "client disconnected before the end")
        try:
            async for line in self.upstream.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    outcome = (
                        ("complete", None)
                        if assembly.tokens.finish_reason
                        else ("incomplete", "stream ended without a finish reason")
                    )
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome = (
                        "error",
                        f"backend error in stream: {json.dumps(chunk['error'])[:500]}",
                    )
                    yield _sse(chunk)
                    break
                if rec.ttft_ms is None and chunk.get("choices"):
                    rec.ttft_ms = _ms_since(call.t0)
                assembly.add(chunk)
                make_visible(call.api, chunk, call.asks, rec.id)
                yield _sse(chunk)
            else:
                outcome = ("incomplete", "backend stream ended without [DONE]")
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            outcome = ("incomplete", f"backend stream cut: {exc!r}")
        finally:
            await self._release()
            ProxyService._fill(rec, assembly)
            call.finish(*outcome)
            if outcome[0] != "complete":  # also runs when the client disconnected (cancellation)
                self.recorder.record_nowait(rec)
        if outcome[0] == "complete":
            try:
                await self.recorder.record(rec)
            except APIError as exc:  # never report success for a completion that was not stored
                yield _sse(exc.envelope())
                return
            yield b"data: [DONE]\n\n"
        elif outcome[0] == "incomplete":
            yield _sse(
                APIError(
                    502, f"stream did not complete: {outcome[1]}", code="stream_incomplete"
                ).envelope()
            )


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


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _relay_error(status: int, content: bytes, headers: dict[str, str]) -> JSONResponse:
    """Pass a backend's 4xx through in the OpenAI envelope; a backend 5xx becomes a 502."""
    try:
        payload = json.loads(content)
    except ValueError:
        payload = None
    if status >= 500 or not isinstance(payload, dict) or "error" not in payload:
        message = (
            "the backend failed to answer" if status >= 500 else "the backend refused the request"
        )
        detail = payload.get("error", {}).get("message") if isinstance(payload, dict) else None
        if isinstance(detail, str) and status < 500:
            message = detail
        return APIError(
            502 if status >= 500 else status, message, code="backend_error", headers=headers
        ).response()
    return JSONResponse(payload, status_code=status, headers=headers)
