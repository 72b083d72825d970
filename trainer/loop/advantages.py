"""The trainer's advantage of each claimed session: its baseline, and the sessions dropped before
the update (a non-finite advantage; a group with no variance when that filter is on).

Pure: trajectories in, numbers and reasons out (the per-task means come from Postgres through
`trainer/loop/task_baseline.py`). The export's fields keep their meaning: `return_normalized` is
the group's own normalization, which the default baseline uses as it is.

Baselines (docs/training.md, "Advantages and baselines"):
- in a group, `group` (default): the group's normalization (none | mean | mean_std, GRPO);
  `rloo`: A_i = R_i - mean_{j != i} R_j over the group's members (Ahmadian et al. 2024);
- without a group, `none` (default): the raw return; `task_mean`: R - the mean return of the
  latest consumed sessions of the same task_id on this model; `batch_mean`: R - the mean raw
  return of the batch's sessions without a group.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rlgw.sequences import NON_FINITE  # one wording for both checks

from ..config import TrainerConfig

ZERO_VARIANCE = "zero-variance group"


class _Group(Protocol):
    status: str


class _Trajectory(Protocol):
    session_id: str
    group_id: str | None
    task_id: str | None
    group: _Group | None
    return_raw: float | None
    return_normalized: float | None


@dataclass
class Advantages:
    """Each session's advantage (None: it has none, e.g. a pending group), and the sessions the
    update must drop whole, with why."""

    of: dict[str, float | None] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)


def _mean(values: Sequence[float]) -> float:
    """A mean that does not overflow for finite values (divide by the largest magnitude first)."""
    scale = max((abs(v) for v in values), default=0.0)
    if not values or scale == 0.0 or not math.isfinite(scale):
        # inf or NaN among them: their plain mean (NaN for inf - inf), which the caller drops
        return sum(values) / len(values) if values else 0.0
    return math.fsum(v / scale for v in values) / len(values) * scale


def session_advantages(
    trajectories: Sequence[_Trajectory],
    config: TrainerConfig,
    task_means: Mapping[str, float] | None = None,
) -> Advantages:
    """Each session's advantage under the config's baselines; `task_means` (task_id -> mean
    return) is needed for `singleton_baseline = "task_mean"` only."""
    out = Advantages()
    groups: dict[str, list[_Trajectory]] = defaultdict(list)
    for t in trajectories:
        if t.group_id is not None:
            groups[t.group_id].append(t)
    singles = [
        t.return_raw for t in trajectories if t.group_id is None and t.return_raw is not None
    ]
    batch_mean = _mean(singles) if singles else 0.0
    for t in trajectories:
        if t.group_id is not None:
            value = _group_advantage(t, groups[t.group_id], config, out)
        elif t.return_raw is None:
            value = None
        elif config.singleton_baseline == "task_mean":
            baseline = (task_means or {}).get(t.task_id) if t.task_id is not None else None
            value = t.return_raw - (baseline or 0.0)
        elif config.singleton_baseline == "batch_mean":
            value = t.return_raw - batch_mean
        else:
            value = t.return_normalized
        if value is not None and not math.isfinite(value) and t.session_id not in out.dropped:
            baseline = _baseline_name(t, config)
            out.dropped[t.session_id] = (
                f"{NON_FINITE}: {value} (return {t.return_raw}; baseline {baseline})"
            )
            value = None
        out.of[t.session_id] = value
    return out


def _baseline_name(t: _Trajectory, config: TrainerConfig) -> str:
    return config.baseline if t.group_id is not None else config.singleton_baseline


def _group_advantage(
    t: _Trajectory, members: list[_Trajectory], config: TrainerConfig, out: Advantages
) -> float | None:
    if t.return_normalized is None:  # pending or dropped: the group's verdict stands
        return None
    returns = [m.return_raw for m in members if m.return_raw is not None]
    if config.filter_zero_variance and len(returns) > 1 and len(set(returns)) == 1:
        out.dropped[t.session_id] = (
            f"{ZERO_VARIANCE}: all {len(returns)} members returned {returns[0]} "
            "(filter_zero_variance, DAPO's dynamic sampling)"
        )
        return None
    if config.baseline == "group" or len(returns) < 2 or t.return_raw is None:
        return t.return_normalized
    others = [m.return_raw for m in members if m is not t and m.return_raw is not None]
    return t.return_raw - _mean(others)
