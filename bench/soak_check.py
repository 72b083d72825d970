"""The soak's verdict: what the clients received, compared row by row with what Postgres holds."""

from __future__ import annotations

from collections import Counter

import psycopg

from bench.soak_agents import Ledger


def compare(ledger: Ledger, libpq_url: str) -> dict:
    """Counts of the comparison; `exactly_once` is true when every delivered completion is stored
    exactly once as complete, nothing stored as complete was not delivered, every call left
    exactly one row except those refused because their record could not be written (503
    database_unavailable / recorder_overloaded / record_failed: by design no row), and each session
    holds exactly the rewards posted (one per key)."""
    with psycopg.connect(libpq_url) as conn:
        rows = conn.execute(
            "SELECT id, session_id, status FROM completions WHERE session_id = ANY(%s)",
            (ledger.sessions,),
        ).fetchall()
        reward_rows = conn.execute(
            "SELECT session_id, count(*) FROM rewards WHERE session_id = ANY(%s) "
            "GROUP BY session_id",
            (ledger.sessions,),
        ).fetchall()
    ids = Counter(r[0] for r in rows)
    complete = {r[0] for r in rows if r[2] == "complete"}
    rows_per_session = Counter(r[1] for r in rows)
    stored_rewards = dict(reward_rows)
    missing = ledger.delivered - complete
    undelivered_complete = complete - ledger.delivered
    duplicated = [i for i, n in ids.items() if n > 1]
    row_count_mismatch = [
        s
        for s in ledger.sessions
        if rows_per_session.get(s, 0) != ledger.calls.get(s, 0) - ledger.unrecorded.get(s, 0)
    ]
    reward_mismatch = [
        s for s in ledger.sessions if stored_rewards.get(s, 0) != ledger.rewards.get(s, 0)
    ]
    return {
        "sessions": len(ledger.sessions),
        "episodes_finished": ledger.episodes,
        "calls": sum(ledger.calls.values()),
        "delivered": len(ledger.delivered),
        "retries": ledger.retried,
        "failed_calls": len(ledger.failed),
        "refused_unrecorded": sum(ledger.unrecorded.values()),
        "rows": len(rows),
        "complete_rows": len(complete),
        "missing": len(missing),
        "duplicated": len(duplicated),
        "complete_but_not_delivered": len(undelivered_complete),
        "sessions_with_row_count_mismatch": len(row_count_mismatch),
        "rewards_posted": sum(ledger.rewards.values()) + ledger.duplicate_reward_posts,
        "rewards_stored": sum(stored_rewards.values()),
        "sessions_with_reward_mismatch": len(reward_mismatch),
        "exactly_once": not (
            missing or duplicated or undelivered_complete or row_count_mismatch or reward_mismatch
        ),
        "examples": {
            "missing": sorted(missing)[:5],
            "complete_but_not_delivered": sorted(undelivered_complete)[:5],
            "failures": ledger.failed[:5],
        },
    }
