"""Why a recorded completion may not be trained on, reduced to a bounded kind for metric labels.

The kinds follow the reasons' wording (rlgw/eligibility.py, where every reason is decided, and
gateway/recording/lineage.py for orphans); a reason no rule knows is `other`,
so a new wording can never add a label value."""

from __future__ import annotations

import re

from rlgw.eligibility import CROSSED_SWAP, DOUBTFUL_COMMIT, ECHO_ONLY, NOT_FOLLOWING

# (pattern at the start of the reason, kind), tried in order.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r"status is ", "status"),
        (r"finish_reason ", "finish"),
        (r"served policy version unknown", "version"),
        (r"prompt token ids missing|no output tokens", "tokens"),
        (re.escape(ECHO_ONLY), "echo_only"),
        (r"\d+ log-probs for |log-prob |placeholder log-prob ", "logprobs"),
        (r"session was ", "session_closed"),
        (re.escape(CROSSED_SWAP), "crossed_swap"),
        (re.escape(NOT_FOLLOWING), "not_following"),
        (re.escape(DOUBTFUL_COMMIT), "doubtful_commit"),
        (r"retry superseded by |continues orphan ", "orphan"),
    )
)
KINDS = tuple(dict.fromkeys(kind for _, kind in _RULES)) + ("other",)


def reason_kind(reason: str) -> str:
    """The kind of one ineligibility reason (`other` when no rule matches)."""
    for pattern, kind in _RULES:
        if pattern.match(reason):
            return kind
    return "other"
