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

    Computed on the returns divided by their largest magnitude s (every one then in [-1, 1]), so
    that no intermediate overflows: mean_std is (x_i - mean(x)) / (std(x) + 1e-6 / s), the same
    number, finite for any finite returns ({1e308, 1e308, 0} included); mean is s * (x_i -
    mean(x)), which overflows only where the true difference exceeds the float range. A
    non-finite return makes the whole group NaN: nothing meaningful can be said of it, and the
    trainer drops NaN advantages with a reason.
    """
    if how not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, not {how!r}")
    if len(returns) <= 1 or how == "none":
        return dict(returns)
    if not all(math.isfinite(r) for r in returns.values()):
        return {k: math.nan for k in returns}
    scale = max(abs(r) for r in returns.values())
    if scale == 0.0:
        return {k: 0.0 for k in returns}
    scaled = {k: r / scale for k, r in returns.items()}
    mean = math.fsum(scaled.values()) / len(scaled)
    if how == "mean":
        return {k: (x - mean) * scale for k, x in scaled.items()}
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in scaled.values()) / len(scaled))
    return {k: (x - mean) / (std + STD_EPSILON / scale) for k, x in scaled.items()}


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
