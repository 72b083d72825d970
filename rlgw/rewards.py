"""Session returns and their per-group normalization, as pure functions (docs/architecture.md,
"Evidence, retries and rewards": rewards and groups)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

NORMALIZATIONS = ("none", "mean", "mean_std")
STD_EPSILON = 1e-6


def normalize_returns(returns: Mapping[str, float], how: str) -> dict[str, float]:
    """Group-normalized returns. A group of one keeps its raw return whatever `how` says.

    mean:      A_i = R_i - mean(R)
    mean_std:  A_i = (R_i - mean(R)) / (std(R) + 1e-6), population std (GRPO, Shao et al. 2024)
    """
    if how not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, not {how!r}")
    if len(returns) <= 1 or how == "none":
        return dict(returns)
    mean = sum(returns.values()) / len(returns)
    if how == "mean":
        return {k: r - mean for k, r in returns.items()}
    std = math.sqrt(sum((r - mean) ** 2 for r in returns.values()) / len(returns))
    return {k: (r - mean) / (std + STD_EPSILON) for k, r in returns.items()}


@dataclass(frozen=True)
class Member:
    """One session of a group, as far as its group's readiness is concerned."""

    session_id: str
    finished: bool  # closed (or already consumed)
    reward_values: Sequence[float]  # rewards that count: none on orphans


@dataclass
class GroupVerdict:
    status: str  # ready | pending | dropped
    reason: str | None
    returns: dict[str, float] = field(default_factory=dict)
    normalized: dict[str, float] = field(default_factory=dict)


def judge_group(
    members: Sequence[Member],
    how: str,
    *,
    expected_size: int | None,
    deadline_at: datetime | None,
    now: datetime,
    dropped_reason: str | None = None,
) -> GroupVerdict:
    """Ready when every expected member is finished and rewarded; held back until the deadline,
    then dropped whole (dropping only the slow members would bias the group toward fast ones)."""
    returns = {m.session_id: float(sum(m.reward_values)) for m in members if m.reward_values}
    if dropped_reason:
        return GroupVerdict("dropped", dropped_reason, returns)
    size = max(expected_size or 0, len(members))
    missing = size - sum(1 for m in members if m.finished and m.reward_values)
    if missing > 0:
        if deadline_at is not None and now >= deadline_at:
            return GroupVerdict(
                "dropped",
                f"deadline passed with {missing} of {size} sessions not finished and rewarded",
                returns,
            )
        return GroupVerdict("pending", f"waiting for {missing} of {size} sessions", returns)
    return GroupVerdict("ready", None, returns, normalize_returns(returns, how))
