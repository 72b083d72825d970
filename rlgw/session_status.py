"""The statuses of an agent session (`sessions.status`), in the order a session passes them.

A session is open while its agent works in it; closed once it is done (an implicit session is
born closed); claimed while a trainer holds it; consumed once training used it. Dropped: training
will never use it (`sessions.dropped_reason` says why). A claim given up returns it to closed.
A StrEnum: each status is its stored text, in Python and in SQL alike.
"""

from __future__ import annotations

from enum import StrEnum


class SessionStatus(StrEnum):
    OPEN = "open"
    CLOSED = "closed"
    CLAIMED = "claimed"
    CONSUMED = "consumed"
    DROPPED = "dropped"


# Done with by its agent: no more completions, its rewards may be trained on.
FINISHED = (SessionStatus.CLOSED, SessionStatus.CLAIMED, SessionStatus.CONSUMED)
FINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in FINISHED) + ")"  # for `status IN ...`
