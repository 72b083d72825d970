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
told it failed: once the database answers again it is marked ineligible (`DOUBTFUL_COMMIT`,
`doubtful.py`). Until then its id is kept in a file journal (`doubtful_journal.py`), so a gateway
stopped meanwhile leaves the marking to the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from rlgw.db.faults import DatabaseUnavailable, describe, is_connection_error, is_timeout
from rlgw.eligibility import DOUBTFUL_COMMIT

from ..errors import APIError, database_timeout, database_unavailable
from .doubtful import DoubtfulCommits
from .doubtful_journal import DoubtfulJournal
from .implicit_batch import ImplicitWriter
from .record import CompletionRecord
from .store import store_batch

log = logging.getLogger("rlgw.recording")

_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0
_MIN_ATTEMPT_S = 2.0  # an attempt is cut off at the record's deadline, but never sooner than this
_RECHECK_S = 1.0  # how often an idle writer retries marking doubtful records


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
        self._doubtful = DoubtfulCommits(engine, journal)
        self._implicit = ImplicitWriter(engine)
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=queue_size)
        self._batch_size = batch_size
        self._retry_s = retry_s
        self._task: asyncio.Task | None = None
        self._database_down = False  # the last attempt failed at the connection
        self.written = 0
        self.failed = 0
        self.retries = 0  # attempts that failed at the connection and were retried or given up
        self.timeouts = 0  # of those, attempts cut off because the database did not answer
        # Told the verdict of every stored completion (its reasons; [] when trainable): metrics.
        self.on_recorded: Callable[[list[str]], None] = lambda reasons: None

    def start(self) -> None:
        self._doubtful.adopt()
        self._task = asyncio.create_task(self._run(), name="rlgw-recorder")

    async def stop(self) -> None:
        """Write what is queued (each record waits at most its retry time), then stop."""
        await self._queue.join()
        self._recorded_doubtful(await self._doubtful.mark())
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._implicit.close()
        self._doubtful.log_unmarked()

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
                    self._recorded_doubtful(await self._doubtful.mark())
                    continue
            else:
                first = await self._queue.get()
            batch = [first]
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                if not self._database_down:  # else it would only delay the batch
                    self._recorded_doubtful(await self._doubtful.mark())
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
                        implicit=self._implicit,
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
                    describe(exc),
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
            self._doubtful.add(doubtful)
        self._settle(batch, exc)

    def _recorded_doubtful(self, ids: list[str]) -> None:
        for _ in ids:
            self.on_recorded([DOUBTFUL_COMMIT])

    def _settle(self, batch: list[_Pending], exc: Exception | None) -> None:
        for pending in batch:
            if exc is None:
                self.written += len(pending.records)
                for record in pending.records:
                    self.on_recorded(record.verdict)
            else:
                self.failed += len(pending.records)
                log.error(
                    "completion %s not recorded: %s",
                    ", ".join(r.id for r in pending.records),
                    describe(exc),
                )
            if pending.done is not None and not pending.done.done():
                if exc is None:
                    pending.done.set_result(None)
                else:
                    pending.done.set_exception(exc)
