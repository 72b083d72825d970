"""Sibling advantages as a pure function over a trajectory's shape: no database, no pydantic.

Split out of `rlgw.trajectory` (which re-exports it) so that the trainer's sample builder imports
without the web and database stack (a GPU box runs the update path with torch alone).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol


class SiblingGroupLike(Protocol):
    status: str  # ready | pending
    completion_ids: list[str]
    normalized: Mapping[str, float]


class TrajectoryLike(Protocol):
    sibling_normalization: str  # none | mean | mean_std
    sibling_groups: Iterable[SiblingGroupLike]


def sibling_advantages(t: TrajectoryLike) -> dict[str, float | None]:
    """Each sibling step's advantage when the session normalizes its siblings (GRPO over the
    choices of one prompt): its reward normalized within its sibling group, or None while the
    group is pending. Empty when sibling_normalization is `none` (siblings are ordinary steps)."""
    if t.sibling_normalization == "none":
        return {}
    advantages: dict[str, float | None] = {}
    for group in t.sibling_groups:
        for completion_id in group.completion_ids:
            advantages[completion_id] = (
                group.normalized.get(completion_id) if group.status == "ready" else None
            )
    return advantages
