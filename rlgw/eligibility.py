"""Whether a recorded completion may be trained on: one pure function lists every reason it may not.

The reasons come from five kinds of fact (docs/architecture.md, "Evidence, retries and rewards"):
- its evidence: a normal finish, a known served version, the prompt's token ids, and one finite
  log-prob per output token (not vLLM's -9999 placeholder); a text completion with `echo` and
  `max_tokens` 0 has only its prompt scored (ECHO_ONLY);
- its session: closed (or further) before the completion was recorded;
- weight swaps: the request crossed a swap of its backend, or finished while the gateway could
  not follow the registry (settled against the registry when its record is written);
- its sampling settings: processing of the logits the trainer cannot reproduce (penalties,
  logit_bias, structured outputs, greedy decoding...: rlgw/sampling.py);
- its commit: the database failed during the COMMIT and the caller was told the call failed
  (learned after the row may exist: that reason is added to the stored list later).
No reason replaces another: the stored list (`completions.ineligible_reasons`) only grows.

Each reason is a `Reason`: its text (stored, shown) and its `ReasonKind` (the bounded label the
gateway's metrics count it under), given where the reason is decided, never read back from text.

Being a retry orphan is not a reason here. It is lineage's verdict on which attempt the
conversation kept, and later traffic can reverse it (a continuation of a superseded attempt makes
it the kept one again), so it lives in `completions.orphan_reason` alone. Training uses a
completion that is kept (no orphan reason) and eligible (no reason here); orphans are never even
exported as steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from rlgw.sampling import sampling_problems
from rlgw.session_status import SessionStatus


class ReasonKind(StrEnum):
    """What kind of fact a reason states; a metric label, so a bounded set."""

    STATUS = "status"  # the completion did not complete
    FINISH = "finish"  # not a normal finish
    VERSION = "version"  # served version unknown
    TOKENS = "tokens"  # prompt or output token ids missing
    ECHO_ONLY = "echo_only"
    LOGPROBS = "logprobs"  # missing, miscounted or not log-probabilities
    SESSION_CLOSED = "session_closed"  # its session was no longer open
    CROSSED_SWAP = "crossed_swap"
    NOT_FOLLOWING = "not_following"
    DOUBTFUL_COMMIT = "doubtful_commit"
    ORPHAN = "orphan"  # a retry orphan (lineage's verdict: `completions.orphan_reason`)
    SAMPLING = "sampling"  # sampled with processing the trainer cannot reproduce (rlgw/sampling.py)
    OTHER = "other"  # a text that was not made as a `Reason` (read back from the database)


class Reason(str):
    """A reason a completion may not be trained on: its text, carrying its `kind`."""

    kind: ReasonKind

    def __new__(cls, text: str, kind: ReasonKind) -> Reason:
        reason = super().__new__(cls, text)
        reason.kind = kind
        return reason

    def __getnewargs__(self) -> tuple[str, ReasonKind]:  # copied and pickled with its kind
        return str(self), self.kind


def kind_of(reason: str) -> ReasonKind:
    """The kind a reason was made with; OTHER for a plain text."""
    return getattr(reason, "kind", ReasonKind.OTHER)


NORMAL_FINISH = frozenset({"stop", "length", "tool_calls"})
# vLLM writes this in place of a log-prob it could not compute.
PLACEHOLDER_LOGPROB = -9999.0

# Why a completion's tokens may not all come from its stamped version (the gateway's swap doubt).
CROSSED_SWAP = Reason("the request crossed a weight swap of its backend", ReasonKind.CROSSED_SWAP)
NOT_FOLLOWING = Reason(
    "the gateway was not following backend swaps when the request finished (registry "
    "connection lost): a swap cannot be ruled out",
    ReasonKind.NOT_FOLLOWING,
)
# Tokens of it were sampled under weights a swap installed and then failed to verify (the swap
# paused the request in place: rlgw/swap_boundaries.py). Learned when it is written, or later.
SERVED_UNVERIFIED = Reason(
    "part of it was sampled under weights that failed verification during a swap",
    ReasonKind.CROSSED_SWAP,
)
SWAP_DOUBTS = (CROSSED_SWAP, NOT_FOLLOWING, SERVED_UNVERIFIED)
DOUBTFUL_COMMIT = Reason(
    "the database failed during its commit and the client was told the call failed",
    ReasonKind.DOUBTFUL_COMMIT,
)
# A text completion with `echo` and `max_tokens` 0: the prompt was scored, nothing was generated
# for the client (vLLM's one hidden sampled token has no log-prob in the reply and is not kept).
ECHO_ONLY = Reason(
    "echo with max_tokens 0: only the prompt was scored, no output tokens", ReasonKind.ECHO_ONLY
)


def session_reason(status: str) -> Reason:
    """The reason for a completion recorded in a session that was no longer open."""
    return Reason(
        f"session was {status} before this completion was recorded", ReasonKind.SESSION_CLOSED
    )


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
    sampling: Mapping[str, Any] | None = None,
) -> list[Reason]:
    """Every reason training must not use a completion; empty when it may.

    The evidence is the record's own (`status` ... `output_logprobs`). `session_status`: its named
    session's status when the record was linked into it (None for an implicit session, born with
    its completion). `swap_doubt`: None, CROSSED_SWAP, or NOT_FOLLOWING while not yet settled.
    `doubtful_commit`: the caller was told the call failed although the row may have been stored.
    `echo_only`: a text completion with `echo` and `max_tokens` 0 (ECHO_ONLY in place of "no
    output tokens"). `sampling`: the settings the backend applied (`rlgw.sampling.
    effective_sampling`; None when not recorded).
    """
    reasons = []
    if status != "complete":
        reasons.append(Reason(f"status is {status}", ReasonKind.STATUS))
    if finish_reason not in NORMAL_FINISH:
        reasons.append(
            Reason(f"finish_reason {finish_reason!r} is not a normal finish", ReasonKind.FINISH)
        )
    if policy_version is None:
        reasons.append(Reason("served policy version unknown", ReasonKind.VERSION))
    if not prompt_token_ids:
        reasons.append(Reason("prompt token ids missing", ReasonKind.TOKENS))
    if echo_only:
        reasons.append(ECHO_ONLY)
    elif not output_token_ids:
        reasons.append(Reason("no output tokens", ReasonKind.TOKENS))
    reasons += _logprob_reasons(output_token_ids or (), output_logprobs)
    reasons += [Reason(text, ReasonKind.SAMPLING) for text in sampling_problems(sampling)]
    if session_status is not None and session_status != SessionStatus.OPEN:
        reasons.append(session_reason(session_status))
    if swap_doubt is not None:
        if swap_doubt not in SWAP_DOUBTS:
            raise ValueError(f"not a swap doubt: {swap_doubt!r}")
        reasons.append(swap_doubt)
    if doubtful_commit:
        reasons.append(DOUBTFUL_COMMIT)
    return reasons


def _logprob_reasons(ids: Sequence[int], logprobs: Sequence[float] | None) -> list[Reason]:
    """A count that does not match the output, and the first value that is not a log-prob."""
    texts = []
    if logprobs is None or len(logprobs) != len(ids):
        texts.append(
            f"{0 if logprobs is None else len(logprobs)} log-probs for {len(ids)} output tokens"
        )
    for i, lp in enumerate(logprobs or ()):
        if not math.isfinite(lp) or lp > 0.0:
            texts.append(f"log-prob {lp} at output position {i} is not a finite log-probability")
            break
        if lp <= PLACEHOLDER_LOGPROB:
            texts.append(f"placeholder log-prob {lp} at output position {i}")
            break
    return [Reason(text, ReasonKind.LOGPROBS) for text in texts]


def eligibility_reason(reasons: Sequence[str]) -> str | None:
    """The reasons as one text (the API's `eligibility_reason`); None when there is none."""
    return "; ".join(reasons) or None


def add_reason(statement: sa.Update, reasons: Any, reason: str) -> sa.Update:
    """`statement` (an UPDATE) adding `reason` to the `reasons` column of the rows that lack it:
    a fact learned after a record was written adds its reason, never replaces another. Rows that
    already hold it are left out (their ids are not RETURNed)."""
    lacks = sa.not_(sa.literal(reason, sa.Text) == sa.any_(reasons))
    return statement.where(lacks).values({reasons: sa.func.array_append(reasons, reason)})
