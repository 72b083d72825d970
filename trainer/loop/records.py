"""Recorded trajectories read from their exported JSON (`rlgw export`, `GET .../trajectory`).

The fields `build_samples` reads, as frozen dataclasses with no pydantic or database behind them:
a machine without the web stack (the GPU proof, `bench/gpu_check.py`) builds samples exactly as
the service does, from the same wire format. Unknown fields are ignored; missing ones are errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# rlgw.trajectory.DEFAULT_SIBLING_NORMALIZATION (not imported: that module needs the database stack)
DEFAULT_SIBLING_NORMALIZATION = "mean_std"


@dataclass(frozen=True)
class RecordedStep:
    completion_id: str
    policy_version: int | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    eligible: bool
    eligibility_reason: str | None = None
    model: str | None = None  # absent from exports made before steps named their model
    finish_reason: str | None = None  # "length": cut by max_tokens (TrainerConfig.overlong)
    sampling: dict[str, Any] | None = None
    # Each output token's version; absent from exports made before it (all at policy_version).
    output_versions: list[int] | None = None


@dataclass(frozen=True)
class RecordedSiblingGroup:
    id: str
    completion_ids: list[str]
    status: str
    normalized: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedTrajectory:
    session_id: str
    return_raw: float | None
    return_normalized: float | None
    steps: list[RecordedStep]
    sibling_normalization: str = DEFAULT_SIBLING_NORMALIZATION
    sibling_groups: list[RecordedSiblingGroup] = field(default_factory=list)


def _step(d: Mapping[str, Any]) -> RecordedStep:
    return RecordedStep(
        completion_id=d["completion_id"],
        policy_version=d["policy_version"],
        prompt_token_ids=[int(i) for i in d["prompt_token_ids"]],
        output_token_ids=[int(i) for i in d["output_token_ids"]],
        output_logprobs=[float(x) for x in d["output_logprobs"]],
        eligible=bool(d["eligible"]),
        eligibility_reason=d.get("eligibility_reason"),
        model=d.get("model"),
        finish_reason=d.get("finish_reason"),
        sampling=d.get("sampling"),
        output_versions=_versions(d.get("output_versions")),
    )


def _versions(versions: list[Any] | None) -> list[int] | None:
    return None if versions is None else [int(v) for v in versions]


def trajectory_from_export(d: Mapping[str, Any]) -> RecordedTrajectory:
    """One exported trajectory (the `Trajectory` wire schema as JSON) as a RecordedTrajectory."""
    return RecordedTrajectory(
        session_id=d["session_id"],
        return_raw=d["return_raw"],
        return_normalized=d["return_normalized"],
        steps=[_step(s) for s in d["steps"]],
        sibling_normalization=d.get("sibling_normalization", DEFAULT_SIBLING_NORMALIZATION),
        sibling_groups=[
            RecordedSiblingGroup(
                id=g["id"],
                completion_ids=list(g["completion_ids"]),
                status=g["status"],
                normalized={k: float(v) for k, v in g.get("normalized", {}).items()},
            )
            for g in d.get("sibling_groups", [])
        ],
    )
