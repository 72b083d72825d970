"""Whether a recorded completion may be trained on: one pure function lists every reason it may not.

The reasons come from four kinds of fact (docs/architecture.md, "Evidence, retries and rewards"):
- its evidence: a normal finish, a known served version, the prompt's token ids, and one finite
  log-prob per output token (not vLLM's -9999 placeholder); a text completion with `echo` and
  `max_tokens` 0 has only its prompt scored (ECHO_ONLY);
- its session: closed (or further) before the completion was recorded;
- weight swaps: the request crossed a swap of its backend, or finished while the gateway could
  not follow the registry (settled against the registry when its record is written);
- its commit: the database failed during the COMMIT and the caller was told the call failed
  (learned after the row may exist: that reason is added to the stored list later).
No reason replaces another: the stored list (`completions.ineligible_reasons`) only grows.

Being a retry orphan is not a reason here. It is lineage's verdict on which attempt the
conversation kept, and later traffic can reverse it (a continuation of a superseded attempt makes
it the kept one again), so it lives in `completions.orphan_reason` alone. Training uses a
completion that is kept (no orphan reason) and eligible (no reason here); orphans are never even
exported as steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

NORMAL_FINISH = frozenset({"stop", "length", "tool_calls"})
# vLLM writes this in place of a log-prob it could not compute.
PLACEHOLDER_LOGPROB = -9999.0

# Why a completion's tokens may not all come from its stamped version (the gateway's swap doubt).
CROSSED_SWAP = "the request crossed a weight swap of its backend"
NOT_FOLLOWING = (
    "the gateway was not following backend swaps when the request finished (registry "
    "connection lost): a swap cannot be ruled out"
)
SWAP_DOUBTS = (CROSSED_SWAP, NOT_FOLLOWING)
DOUBTFUL_COMMIT = "the database failed during its commit and the client was told the call failed"
# A text completion with `echo` and `max_tokens` 0: the prompt was scored, nothing was generated
# for the client (vLLM's one hidden sampled token has no log-prob in the reply and is not kept).
ECHO_ONLY = "echo with max_tokens 0: only the prompt was scored, no output tokens"


def session_reason(status: str) -> str:
    """The reason for a completion recorded in a session that was no longer open."""
    return f"session was {status} before this completion was recorded"


def ineligible_reasons(
    *,
    status: str,
    finish_reason: str | None,
    policy_version: int | None,
    prompt_token_ids: Sequence[int] | None,
    output_token_ids: Sequence[int] | None,
    output_logprobs: Sequence[float] | None,
    session_status: str | None = None,
    swap_doubt: str | None = None,
    doubtful_commit: bool = False,
    echo_only: bool = False,
) -> list[str]:
    """Every reason training must not use a completion; empty when it may.

    The evidence is the record's own (`status` ... `output_logprobs`). `session_status`: its named
    session's status when the record was linked into it (None for an implicit session, born with
    its completion). `swap_doubt`: None, CROSSED_SWAP, or NOT_FOLLOWING while not yet settled.
    `doubtful_commit`: the caller was told the call failed although the row may have been stored.
    `echo_only`: a text completion with `echo` and `max_tokens` 0 (ECHO_ONLY in place of "no
    output tokens").
    """
    reasons = []
    if status != "complete":
        reasons.append(f"status is {status}")
    if finish_reason not in NORMAL_FINISH:
        reasons.append(f"finish_reason {finish_reason!r} is not a normal finish")
    if policy_version is None:
        reasons.append("served policy version unknown")
    if not prompt_token_ids:
        reasons.append("prompt token ids missing")
    if echo_only:
        reasons.append(ECHO_ONLY)
    elif not output_token_ids:
        reasons.append("no output tokens")
    reasons += _logprob_reasons(output_token_ids or (), output_logprobs)
    if session_status is not None and session_status != "open":
        reasons.append(session_reason(session_status))
    if swap_doubt is not None:
        if swap_doubt not in SWAP_DOUBTS:
            raise ValueError(f"not a swap doubt: {swap_doubt!r}")
        reasons.append(swap_doubt)
    if doubtful_commit:
        reasons.append(DOUBTFUL_COMMIT)
    return reasons


def _logprob_reasons(ids: Sequence[int], logprobs: Sequence[float] | None) -> list[str]:
    """A count that does not match the output, and the first value that is not a log-prob."""
    reasons = []
    if logprobs is None or len(logprobs) != len(ids):
        reasons.append(
            f"{0 if logprobs is None else len(logprobs)} log-probs for {len(ids)} output tokens"
        )
    for i, lp in enumerate(logprobs or ()):
        if not math.isfinite(lp) or lp > 0.0:
            reasons.append(f"log-prob {lp} at output position {i} is not a finite log-probability")
            break
        if lp <= PLACEHOLDER_LOGPROB:
            reasons.append(f"placeholder log-prob {lp} at output position {i}")
            break
    return reasons


def eligibility_reason(reasons: Sequence[str]) -> str | None:
    """The reasons as one text (the API's `eligibility_reason`); None when there is none."""
    return "; ".join(reasons) or None


def add_reason(statement: sa.Update, reasons: Any, reason: str) -> sa.Update:
    """`statement` (an UPDATE) adding `reason` to the `reasons` column of the rows that lack it:
    a fact learned after a record was written adds its reason, never replaces another. Rows that
    already hold it are left out (their ids are not RETURNed)."""
    lacks = sa.not_(sa.literal(reason, sa.Text) == sa.any_(reasons))
    return statement.where(lacks).values({reasons: sa.func.array_append(reasons, reason)})
