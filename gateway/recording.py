"""Durable recording of completions: a bounded queue drained by one writer in batched transactions.

A caller awaits `record()` until its row is committed, so the gateway never reports success for a
completion it failed to store; concurrent callers share one round trip (group commit).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import async_sessionmaker

from rlgw.db.models import AgentSession, Completion
from rlgw.db.token_arrays import pack_ids, pack_logprobs
from rlgw.evidence import evidence_problem

from .errors import APIError
from .lineage_store import link_into_session

log = logging.getLogger("rlgw.recording")


@dataclass
class CompletionRecord:
    """Everything the gateway learned about one completion, before packing for storage."""

    id: str
    session_id: str
    implicit_session: bool
    api: str
    model: str
    stream: bool
    request: dict[str, Any]
    created_at: datetime
    tenant: str | None = None  # of an implicit session (a named session already has its own)
    backend_id: int | None = None
    policy_version: int | None = None
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: str = "incomplete"
    status_reason: str | None = None
    response: dict[str, Any] | None = None
    # Responses/Messages: the chat completion body sent to the backend in the request's place.
    backend_request: dict[str, Any] | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    finished_at: datetime | None = None
    # Lineage: the sequence the request was conditioned on (not stored), and what is derived.
    sequence: Any = None
    retry_group: str | None = None
    sibling_group: str | None = None
    continuation_hash: str | None = None
    continuation_len: int | None = None
    parent_id: str | None = None
    is_orphan: bool = False
    orphan_reason: str | None = None
    # Why training must not use it although its evidence is complete (session closed meanwhile,
    # or the request crossed a weight swap).
    exclusion_reason: str | None = None

    def row(self) -> dict[str, Any]:
        problem = (
            evidence_problem(
                status=self.status,
                finish_reason=self.finish_reason,
                policy_version=self.policy_version,
                prompt_token_ids=self.prompt_token_ids,
                output_token_ids=self.output_token_ids,
                output_logprobs=self.output_logprobs,
            )
            or self.exclusion_reason
        )
        return {
            "id": self.id,
            "session_id": self.session_id,
            "api": self.api,
            "model": self.model,
            "backend_id": self.backend_id,
            "policy_version": self.policy_version,
            "prompt_token_ids": None
            if self.prompt_token_ids is None
            else pack_ids(self.prompt_token_ids),
            "output_token_ids": pack_ids(self.output_token_ids),
            "output_logprobs": pack_logprobs(self.output_logprobs),
            "finish_reason": self.finish_reason,
            "status": self.status,
            "status_reason": self.status_reason,
            "stream": self.stream,
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "request": self.request,
            "response": self.response,
            "backend_request": self.backend_request,
            "eligible": problem is None,
            "eligibility_reason": problem,
            "retry_group": self.retry_group,
            "sibling_group": self.sibling_group,
            "continuation_hash": self.continuation_hash,
            "continuation_len": self.continuation_len,
            "parent_id": self.parent_id,
            "is_orphan": self.is_orphan,
            "orphan_reason": self.orphan_reason,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }


@dataclass
class _Pending:
    """Records stored together or not at all (the sibling choices of one request)."""

    records: list[CompletionRecord]
    done: asyncio.Future | None


class Recorder:
    """Bounded queue + one writer task. `record()` waits for the commit; a full queue is a 503."""

    def __init__(self, sessions: async_sessionmaker, *, queue_size: int, batch_size: int) -> None:
        self._sessions = sessions
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=queue_size)
        self._batch_size = batch_size
        self._task: asyncio.Task | None = None
        self.written = 0
        self.failed = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rlgw-recorder")

    async def stop(self) -> None:
        """Write what is queued, then stop the writer."""
        await self._queue.join()
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    async def record(self, record: CompletionRecord | list[CompletionRecord]) -> None:
        """Store `record` (or several, in one transaction) durably; raise APIError(503) if it
        cannot be stored."""
        records = record if isinstance(record, list) else [record]
        done = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(records, done))
        except asyncio.QueueFull:
            raise APIError(
                503,
                "recording queue full; retry later",
                code="recorder_overloaded",
                headers={"Retry-After": "1"},
            ) from None
        try:
            await done
        except Exception as exc:  # the cause is logged by the writer; callers get no internals
            raise APIError(
                503,
                "the completion could not be recorded; retry later",
                code="record_failed",
                headers={"Retry-After": "1"},
            ) from exc

    def record_nowait(self, record: CompletionRecord | list[CompletionRecord]) -> bool:
        """Queue `record` (or several) without waiting (for cancelled requests). False when the
        queue is full."""
        records = record if isinstance(record, list) else [record]
        try:
            self._queue.put_nowait(_Pending(records, None))
            return True
        except asyncio.QueueFull:
            self.failed += len(records)
            log.error(
                "recording queue full: completion %s (status %s) NOT recorded",
                ", ".join(r.id for r in records),
                records[0].status,
            )
            return False

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write_batch(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write_batch(self, batch: list[_Pending]) -> None:
        try:
            await self._insert([r for p in batch for r in p.records])
            self._settle(batch, None)
            return
        except Exception as exc:  # one bad row must not fail its neighbours: retry one by one
            if len(batch) == 1:
                self._settle(batch, exc)
                return
            log.warning("batch of %d failed (%s); retrying one by one", len(batch), exc)
        for pending in batch:
            try:
                await self._insert(pending.records)
                self._settle([pending], None)
            except Exception as exc:
                self._settle([pending], exc)

    def _settle(self, batch: list[_Pending], exc: Exception | None) -> None:
        for pending in batch:
            if exc is None:
                self.written += len(pending.records)
            else:
                self.failed += len(pending.records)
                log.error(
                    "completion %s not recorded: %s", ", ".join(r.id for r in pending.records), exc
                )
            if pending.done is not None and not pending.done.done():
                if exc is None:
                    pending.done.set_result(None)
                else:
                    pending.done.set_exception(exc)

    async def _insert(self, records: list[CompletionRecord]) -> None:
        # An implicit session holds exactly this one completion: it is born closed.
        implicit = [
            {
                "id": r.session_id,
                "implicit": True,
                "status": "closed",
                "closed_at": r.created_at,
                "tenant": r.tenant,
            }
            for r in records
            if r.implicit_session
        ]
        named: dict[str, list[CompletionRecord]] = {}
        for r in records:
            if not r.implicit_session:
                named.setdefault(r.session_id, []).append(r)
        async with self._sessions() as db, db.begin():
            if implicit:
                await db.execute(insert(AgentSession).on_conflict_do_nothing(), implicit)
            for session_id in sorted(named):  # a fixed lock order: no deadlock between writers
                await link_into_session(db, session_id, named[session_id])
            await db.execute(insert(Completion), [r.row() for r in records])
