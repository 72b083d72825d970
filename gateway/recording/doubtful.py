"""Completions whose COMMIT may have landed although their callers were told the call failed.

The recorder hands them over when it gives up on a record after a connection failure. They are
held here (and in this process's journal, `doubtful_journal.py`, so a restart still knows them)
until the database answers again; then each stored one gets the reason DOUBTFUL_COMMIT added, so
it is never trained on.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from rlgw.db.faults import describe

from .doubtful_journal import DoubtfulJournal
from .record import CompletionRecord
from .store import mark_doubtful

log = logging.getLogger("rlgw.recording")

MARK_TIMEOUT_S = 2.0  # one attempt at marking; the writer tries again while any are left


class DoubtfulCommits:
    """The doubtful completions of this process (id -> session id) and its journal of them."""

    def __init__(self, engine: AsyncEngine, journal: DoubtfulJournal | None) -> None:
        self._engine = engine
        self.journal = journal
        self._pending: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def adopt(self) -> None:
        """Take over the journals that stopped processes left behind."""
        if self.journal is not None:
            self._pending.update(self.journal.adopt())

    def add(self, records: list[CompletionRecord]) -> None:
        self._pending.update((r.id, r.session_id) for r in records)
        self._journal(lambda journal: journal.write(self._pending))

    async def mark(self) -> list[str]:
        """Add DOUBTFUL_COMMIT to the stored ones; kept for a later try if the database is down.
        Returns the ids it marked (the stored ones)."""
        if not self._pending:
            return []
        doubtful = dict(self._pending)
        try:
            async with asyncio.timeout(MARK_TIMEOUT_S):
                ids = await mark_doubtful(self._engine, doubtful)
        except Exception as exc:
            log.warning(
                "could not mark %d doubtful completion(s) yet: %s", len(doubtful), describe(exc)
            )
            return []
        for completion_id in doubtful:
            self._pending.pop(completion_id, None)
        self._journal(lambda journal: journal.settled(self._pending))
        if ids:
            log.warning(
                "completion(s) %s were stored although their callers were told they failed: "
                "marked ineligible",
                ", ".join(ids),
            )
        return list(ids)

    def log_unmarked(self) -> None:
        """At stop: say which are left, and where the next start will find them."""
        if not self._pending:
            return
        log.error(
            "stopping with %d completion(s) whose commit outcome is unknown: %s (%s)",
            len(self._pending),
            ", ".join(sorted(self._pending)),
            "NOT journaled"
            if self.journal is None
            else f"journaled in {self.journal.path}; the next start marks them",
        )

    def _journal(self, action) -> None:
        if self.journal is None:
            return
        try:
            action(self.journal)
        except OSError as exc:  # the ids are still held in memory and logged at stop
            log.error("could not write the doubtful-commit journal: %s", describe(exc))
