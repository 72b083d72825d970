"""Durable recording of completions: a bounded queue drained by one writer in batched transactions.

A caller awaits `record()` until its row is committed, so the gateway never reports success for a
completion it failed to store; concurrent callers share one round trip (group commit).

Database faults: a write that fails at the connection (Postgres restarting, unreachable, a
dropped connection) is retried with backoff until `record_retry_s` after the record was queued,
while its callers wait; the queue stays bounded meanwhile (full: 503 `recorder_overloaded`).
Then the callers get 503 `database_unavailable` and the records are dropped, never written later;
when the last attempt was cut off because the database did not answer in time (overloaded, or
unreachable without a reset) the code is `database_timeout` instead.
A retry after a connection failure first settles the earlier attempt, whose COMMIT may have
landed: it locks the batch's session rows (waiting out a transaction the server is still
finishing), then skips the records already stored, so nothing is stored twice. A record given up
on after such a failure may still have been committed by its last attempt although its caller was
told it failed: once the database answers again it is marked ineligible (`DOUBTFUL_REASON`). Until
then its id is kept in a file journal (`doubtful_journal.py`), so a gateway stopped meanwhile
leaves the marking to the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from rlgw.db.faults import DatabaseUnavailable, is_connection_error, is_timeout
from rlgw.db.token_arrays import pack_ids, pack_logprobs
from rlgw.evidence import evidence_problem

from .doubtful_journal import DoubtfulJournal
from .errors import APIError, database_timeout, database_unavailable
from .record_store import mark_ineligible, store_batch

log = logging.getLogger("rlgw.recording")

DOUBTFUL_REASON = "the database failed during its commit and the client was told the call failed"
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0
_MIN_ATTEMPT_S = 2.0  # an attempt is cut off at the record's deadline, but never sooner than this
_RECHECK_S = 1.0  # how often an idle writer retries marking doubtful records


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
    # The backend's swap epoch when the request was leased. A record excluded as NOT_FOLLOWING
    # (finished while the gateway was not following the registry) is settled at its write by
    # comparing it with the epoch in the registry.
    lease_epoch: int | None = None
    ineligible_reasons: list[str] = field(default_factory=list)  # set by row(): metrics hook

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
        self.ineligible_reasons = [r for r in (problem, self.orphan_reason) if r]
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
    deadline: float  # time.monotonic() after which a connection failure is no longer retried
    doubtful: bool = False  # an attempt failed at the connection: its commit may have landed


class Recorder:
    """Bounded queue + one writer task. `record()` waits for the commit; a full queue is a 503."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        queue_size: int,
        batch_size: int,
        retry_s: float = 5.0,
        journal: DoubtfulJournal | None = None,
    ) -> None:
        self._engine = engine
        self._journal = journal
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=queue_size)
        self._batch_size = batch_size
        self._retry_s = retry_s
        self._task: asyncio.Task | None = None
        self._database_down = False  # the last attempt failed at the connection
        self._doubtful: dict[str, str] = {}  # completion id -> session id, to mark ineligible
        self.written = 0
        self.failed = 0
        self.retries = 0  # attempts that failed at the connection and were retried or given up
        self.timeouts = 0  # of those, attempts cut off because the database did not answer
        self.on_recorded: Callable[[list[str]], None] = lambda reasons: None  # metrics hook

    def start(self) -> None:
        if self._journal is not None:
            self._doubtful.update(self._journal.adopt())
        self._task = asyncio.create_task(self._run(), name="rlgw-recorder")

    async def stop(self) -> None:
        """Write what is queued (each record waits at most its retry time), then stop."""
        await self._queue.join()
        await self._mark_doubtful()
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._doubtful:
            log.error(
                "stopping with %d completion(s) whose commit outcome is unknown: %s (%s)",
                len(self._doubtful),
                ", ".join(sorted(self._doubtful)),
                "NOT journaled"
                if self._journal is None
                else f"journaled in {self._journal.path}; the next start marks them",
            )

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    def _pending(self, records: list[CompletionRecord], done: asyncio.Future | None) -> _Pending:
        return _Pending(records, done, deadline=time.monotonic() + self._retry_s)

    async def record(self, record: CompletionRecord | list[CompletionRecord]) -> None:
        """Store `record` (or several, in one transaction) durably; raise APIError(503) if it
        cannot be stored."""
        records = record if isinstance(record, list) else [record]
        done = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(self._pending(records, done))
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
            if is_timeout(exc):
                raise database_timeout(self._retry_s) from exc
            if is_connection_error(exc):
                raise database_unavailable() from exc
            raise APIError(
                503,
                "the completion could not be recorded; retry later",
                code="record_failed",
                headers={"Retry-After": "1"},
            ) from exc

    def record_nowait(self, record: CompletionRecord | list[CompletionRecord]) -> bool:
        """Queue `record` (or several) without waiting (for cancelled requests). False when the
        queue is full. Retried on a connection failure like any other record."""
        records = record if isinstance(record, list) else [record]
        try:
            self._queue.put_nowait(self._pending(records, None))
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
            if self._doubtful:
                try:
                    first = await asyncio.wait_for(self._queue.get(), _RECHECK_S)
                except TimeoutError:
                    await self._mark_doubtful()
                    continue
            else:
                first = await self._queue.get()
            batch = [first]
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                if not self._database_down:  # else it would only delay the batch
                    await self._mark_doubtful()
                await self._write_batch(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write_batch(self, batch: list[_Pending]) -> None:
        try:
            await self._store(batch)
            return
        except Exception as exc:  # one bad row must not fail its neighbours: retry one by one
            if len(batch) == 1:
                self._fail(batch, exc)
                return
            log.warning("batch of %d failed (%s); retrying one by one", len(batch), exc)
        for pending in batch:
            try:
                await self._store([pending])
            except Exception as exc:
                self._fail([pending], exc)

    async def _store(self, batch: list[_Pending]) -> None:
        """Write `batch` in one transaction and settle it. A connection failure is retried with
        backoff; while the database is down, a record whose deadline has passed is failed and
        leaves the batch. Any other error is raised, the batch unsettled."""
        backoff = _FIRST_BACKOFF_S
        last: Exception = DatabaseUnavailable("the database is unavailable")
        while True:
            if self._database_down:
                now = time.monotonic()
                expired = [p for p in batch if p.deadline <= now]
                if expired:
                    self._fail(expired, last)
                    batch = [p for p in batch if p.deadline > now]
                if not batch:
                    return
            deadline = min(p.deadline for p in batch)
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), _MIN_ATTEMPT_S)):
                    await store_batch(
                        self._engine,
                        [p.records for p in batch],
                        settle_first=any(p.doubtful for p in batch),
                    )
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                last = exc
                self._database_down = True
                self.retries += 1
                self.timeouts += is_timeout(exc)
                for pending in batch:
                    pending.doubtful = True
                log.warning(
                    "database %s while recording %d completion(s) (%s); retrying",
                    "too slow" if is_timeout(exc) else "unavailable",
                    sum(len(p.records) for p in batch),
                    _describe(exc),
                )
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            if self._database_down:
                log.warning("database available again: recording resumed")
            self._database_down = False
            self._settle(batch, None)
            return

    def _fail(self, batch: list[_Pending], exc: Exception) -> None:
        doubtful = [r for pending in batch if pending.doubtful for r in pending.records]
        if doubtful:
            self._doubtful.update((r.id, r.session_id) for r in doubtful)
            self._journal_write(lambda journal: journal.write(self._doubtful))
        self._settle(batch, exc)

    def _journal_write(self, action) -> None:
        if self._journal is None:
            return
        try:
            action(self._journal)
        except OSError as exc:  # the ids are still held in memory and logged at stop
            log.error("could not write the doubtful-commit journal: %s", _describe(exc))

    def _settle(self, batch: list[_Pending], exc: Exception | None) -> None:
        for pending in batch:
            if exc is None:
                self.written += len(pending.records)
                for record in pending.records:
                    self.on_recorded(record.ineligible_reasons)
            else:
                self.failed += len(pending.records)
                log.error(
                    "completion %s not recorded: %s",
                    ", ".join(r.id for r in pending.records),
                    _describe(exc),
                )
            if pending.done is not None and not pending.done.done():
                if exc is None:
                    pending.done.set_result(None)
                else:
                    pending.done.set_exception(exc)

    async def _mark_doubtful(self) -> None:
        """Mark ineligible the records given up on whose last commit may have landed (their
        callers were told they failed). Kept for a later try while the database is down."""
        if not self._doubtful:
            return
        doubtful = dict(self._doubtful)
        try:
            async with asyncio.timeout(_MIN_ATTEMPT_S):
                ids = await mark_ineligible(self._engine, doubtful, DOUBTFUL_REASON)
        except Exception as exc:
            log.warning(
                "could not mark %d doubtful completion(s) yet: %s", len(doubtful), _describe(exc)
            )
            return
        for completion_id in doubtful:
            self._doubtful.pop(completion_id, None)
        self._journal_write(lambda journal: journal.settled(self._doubtful))
        for _ in ids:
            self.on_recorded([DOUBTFUL_REASON])
        if ids:
            log.warning(
                "completion(s) %s were stored although their callers were told they failed: "
                "marked ineligible",
                ", ".join(ids),
            )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
