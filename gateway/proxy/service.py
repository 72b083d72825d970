"""The proxy's work: route to a backend, relay the answer (streamed or not), record it durably."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi.responses import JSONResponse, Response

from rlgw.sampling import effective_sampling

from ..errors import APIError
from ..recording import lineage
from ..recording.record import CompletionRecord
from ..recording.recorder import Recorder
from .call import Call, fill, now
from .canary import pin_for
from .disconnect import ClientGone, unless_client_leaves
from .echo import echo_for, echoes, restore, the_prompt
from .fastjson import FastJSONResponse, loads
from .params import GenerationCall
from .relay import RecordedStream, Relay
from .routing import BackendPool, Lease
from .session_binding import implicit_session_id, open_session
from .shaping import CHAT, COMPLETIONS, choices_by_index, extract_choices, shown_as, sibling_id
from .surface import Surface, backend_error_message
from .upstream import Upstream, UpstreamReply, UpstreamStream

log = logging.getLogger("rlgw.proxy")

_PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}
# Failures to connect: nothing reached the backend, so nothing was generated and another backend
# may take the request. A read error or timeout comes after the request was sent: never retried.
_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)


class ProxyService:
    """Serves the generation requests of every surface: leases a backend, relays its answer and
    records each choice. One per gateway process."""

    def __init__(
        self, pool: BackendPool, recorder: Recorder, upstream: Upstream, db_sessions: Any
    ) -> None:
        self._pool = pool
        self._recorder = recorder
        self._upstream = upstream
        self._db_sessions = db_sessions

    async def generate(self, surface: Surface, call: GenerationCall) -> Response:
        """Serve one generation request `call` of `surface`. The call's ASGI receive channel is
        watched for the client hanging up while a non-streamed answer is being generated. With a
        caller's tenant, a named session must be that tenant's (or new, and then it becomes that
        tenant's); a new implicit session is that tenant's too. A new session, named or implicit,
        remembers the agent key it was opened with (its training consent).

        Each choice is recorded on its own: choice `i` under `sibling_id(record_id, i)`; with
        n > 1 they share `sibling_group` (the record id of choice 0)."""
        session_id, idempotency_key, receive = call.session_id, call.idempotency_key, call.receive
        tenant, key_id = call.caller.tenant, call.caller.key_id
        record_id = surface.record_prefix + uuid.uuid4().hex
        pin = None  # the session's pinned version (a canary, a gate evaluation)
        if session_id is not None:
            draw = self._pool.versions.draw(surface.model, session_id)
            pinned = await open_session(self._db_sessions, session_id, tenant, draw, key_id)
            pin = pin_for(pinned, surface.model)
            self._pool.versions.check_pin(surface.model, session_id, pin)
        n = surface.choices
        created = now()
        retry_group = (
            None
            if session_id is None
            else lineage.retry_key(session_id, surface.api, surface.body, idempotency_key)
        )
        # The settings the backend applies: its body's sampling fields (the gateway adds only
        # logprobs and token ids to it), vLLM's defaults filled in.
        sampling = effective_sampling(surface.wire_body)
        records = [
            CompletionRecord(
                id=sibling_id(record_id, i),
                session_id=session_id or implicit_session_id(record_id),
                implicit_session=session_id is None,
                tenant=tenant,
                agent_key_id=key_id,
                api=surface.api,
                model=surface.model,
                stream=surface.stream,
                request=surface.body,
                backend_request=surface.wire_body if surface.translated else None,
                sampling=sampling,
                created_at=created,
                sequence=None,
                retry_group=retry_group,
                sibling_group=record_id if n > 1 else None,
            )
            for i in range(n)
        ]
        exchange = Call(surface=surface, records=records, t0=time.perf_counter(), pin=pin)
        exchange.sequence = lineage.request_sequence(surface.wire, surface.wire_body)
        for rec in records:
            rec.sequence = exchange.sequence
        headers = {"X-Session-Id": exchange.record.session_id, "X-Completion-Id": record_id}
        if n > 1:
            headers["X-Completion-Ids"] = ",".join(r.id for r in records)
        try:
            if echoes(surface.wire, surface.wire_body):
                refused = await self._prepare_echo(exchange, headers)
                if refused is not None:
                    return refused
            if surface.stream:
                return await self._stream(exchange, headers)
            return await self._complete(exchange, headers, receive)
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
                chat["model"], lambda lease: self._upstream.post(lease.url + "/tokenize", body)
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

    async def _prepare_echo(self, call: Call, headers: dict[str, str]) -> Response | None:
        """Learn the prompt text an echoing request's choices start with (gateway/proxy/echo.py):
        a text prompt as sent, token ids decoded by the backend. The backend's refusal (a token id
        outside its vocabulary, ...) is relayed and recorded like a refused generation."""
        surface = call.surface
        prompt = the_prompt(surface.wire_body)
        if isinstance(prompt, str):
            call.echo = echo_for(surface.wire_body, prompt)
            return None
        body = {"model": surface.model, "tokens": prompt}

        def detokenize(lease: Lease) -> Awaitable[UpstreamReply]:
            return self._upstream.post(lease.url + "/detokenize", body)

        try:
            # With the call: no backend left is recorded as for the generation (which leases
            # again and stamps the record with the backend that answers it).
            held, reply = await self._send(surface.model, detokenize, call)
        except httpx.HTTPError as exc:
            await self._record_failure(call, f"backend unreachable: {exc!r}")
            raise APIError(502, "the backend could not be reached", code="backend_error") from exc
        await held.aclose()
        if reply.status_code != 200:
            await self._record_failure(
                call, f"backend answered {reply.status_code} to /detokenize: {reply.text[:500]}"
            )
            return call.surface.relay_error(reply.status_code, reply.content, headers)
        try:
            text = reply.json()["prompt"]
            if not isinstance(text, str):
                raise TypeError("not a string")
        except (ValueError, KeyError, TypeError):
            await self._record_failure(
                call, f"backend sent an invalid /detokenize reply: {reply.text[:200]!r}"
            )
            raise APIError(502, "the backend sent an invalid reply", code="backend_error") from None
        call.echo = echo_for(surface.wire_body, text)
        return None

    async def _complete(self, call: Call, headers: dict[str, str], receive: Any) -> Response:
        surface = call.surface

        def post(lease: Lease) -> Awaitable[UpstreamReply]:
            body = surface.upstream(lease.served_name, call.record.id)
            request = self._upstream.post(lease.url + _PATHS[surface.wire], body)
            return unless_client_leaves(request, receive)

        try:
            held, reply = await self._send(surface.model, post, call)
        except httpx.HTTPError as exc:
            await self._record_failure(call, f"backend unreachable: {exc!r}")
            raise APIError(502, "the backend could not be reached", code="backend_error") from exc
        except ClientGone:
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
            shown_as(payload, surface.model)
        except ValueError:
            await self._record_failure(call, f"backend sent invalid JSON: {reply.text[:200]!r}")
            raise APIError(502, "the backend sent an invalid reply", code="backend_error") from None
        call.choices = choices_by_index(payload)
        tokens = extract_choices(surface.wire, payload)
        for index, rec in enumerate(call.records):
            fill(rec, tokens.get(index), call.echo)
        if call.echo is not None:
            # Lineage continues the output alone; the client gets (and the record keeps) the echo.
            call.choices = {i: dict(c) for i, c in call.choices.items()}
            for choice in choices_by_index(payload).values():
                restore(choice, call.echo)
        client_payload, stored = surface.reply(payload, call.record.id)
        for index, rec in enumerate(call.records):
            rec.response = stored[index] if index < len(stored) else None
        await self._recorder.record(call.finish("complete"))
        return FastJSONResponse(client_payload, headers=headers)

    async def _stream(self, call: Call, headers: dict[str, str]) -> Response:
        surface = call.surface

        def send(lease: Lease) -> Awaitable[UpstreamStream]:
            body = surface.upstream(lease.served_name, call.record.id)
            return self._upstream.stream(lease.url + _PATHS[surface.wire], body)

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
        relay = Relay(call, upstream, held, self._recorder)
        return RecordedStream(
            relay.run(), relay.abandon, media_type="text/event-stream", headers=headers
        )

    async def _send(
        self,
        model: str,
        send: Callable[[Lease], Awaitable[Any]],
        call: Call | None = None,
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
                pin = call.pin if call is not None else None
                lease = await held.enter_async_context(self._pool.lease(model, refused, pin))
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

    def _stamp(self, call: Call, lease: Lease) -> None:
        # The version resident on the backend when the lease began: a swap that pauses the
        # backend meanwhile moves its epoch on, and the writer then finds, in the pause's
        # boundary, the version of each output token (gateway/recording/swap_settle.py).
        for rec in call.records:
            rec.backend_id = lease.backend_id
            rec.policy_version = lease.served_version
            rec.lease_epoch = lease.swap_epoch
        call.swap_doubt = lambda: self._pool.swap_doubt(lease)

    async def _record_failure(self, call: Call, reason: str) -> None:
        try:
            await self._recorder.record(call.finish("error", reason))
        except APIError:
            log.error("failed call %s could not be recorded: %s", call.record.id, reason)
