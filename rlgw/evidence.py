"""The evidence check: may a recorded completion enter training? (DESIGN.md invariant 2)."""

from __future__ import annotations

import math
from collections.abc import Sequence

NORMAL_FINISH = frozenset({"stop", "length", "tool_calls"})
# vLLM writes this in place of a log-prob it could not compute.
PLACEHOLDER_LOGPROB = -9999.0


def evidence_problem(
    *,
    status: str,
    finish_reason: str | None,
    policy_version: int | None,
    prompt_token_ids: Sequence[int] | None,
    output_token_ids: Sequence[int] | None,
    output_logprobs: Sequence[float] | None,
) -> str | None:
    """None when the evidence is complete, else the first reason it is not."""
    if status != "complete":
        return f"status is {status}"
    if finish_reason not in NORMAL_FINISH:
        return f"finish_reason {finish_reason!r} is not a normal finish"
    if policy_version is None:
        return "served policy version unknown"
    if not prompt_token_ids:
        return "prompt token ids missing"
    if not output_token_ids:
        return "no output tokens"
    if output_logprobs is None or len(output_logprobs) != len(output_token_ids):
        got = 0 if output_logprobs is None else len(output_logprobs)
        return f"{got} log-probs for {len(output_token_ids)} output tokens"
    for i, lp in enumerate(output_logprobs):
        if not math.isfinite(lp) or lp > 0.0:
            return f"log-prob {lp} at output position {i} is not a finite log-probability"
        if lp <= PLACEHOLDER_LOGPROB:
            return f"placeholder log-prob {lp} at output position {i}"
    return None
