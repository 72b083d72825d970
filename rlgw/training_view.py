"""A session's training view: the sequences the trainer builds from it, built here by the same code.

Served by `GET /v1/sessions/{id}/trajectory?view=training` and `rlgw export --view training`. The
sequences come from `rlgw.sequences.build_sequences`, which the trainer's sample builder calls too
(trainer/loop/samples.py), with each model's promoted version, its lineage, and the limits its
promoted version recorded. Two things the trainer knows and the gateway does not:

- the vocabulary: the gateway holds no model weights, so no turn is left out here for a token id
  outside the model's vocabulary (the trainer leaves such a turn out, with that reason);
- the batch: a baseline other than the group's own normalization (`baseline` rloo, or a
  `singleton_baseline`) depends on the sessions the trainer claims together, so the advantages
  shown are the trajectory's (`advantage_source` says so).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from rlgw.db.models import PolicyVersion, RegisteredModel
from rlgw.sequences import (
    DEFAULT_LIMITS,
    SequenceLimits,
    TrainingSequence,
    build_sequences,
    left_out,
)
from rlgw.trajectory import load_trajectory
from rlgw.version_lineage import head_version, lineage

BATCH_NOTE = (
    "the trainer's advantages depend on the batch it claims (baseline {baseline}, "
    "singleton_baseline {singleton}): shown are the trajectory's (its group's normalization)"
)


class LimitsOut(BaseModel):
    """The settings that decide the sequences (rlgw/sequences.py, SequenceLimits)."""

    max_staleness: int = Field(description="versions a completion may lag behind current_version")
    max_tokens_per_sample: int = Field(description="a longer turn is left out with a reason")
    overlong: str = Field(description="a completion cut by max_tokens: keep | mask | penalize")
    overlong_penalty: float = Field(description="with overlong=penalize: taken off the advantage")
    join_turns: bool = Field(description="false: every turn is a sequence of its own")


class ModelView(BaseModel):
    """One model the session called, and what its sequences are built against."""

    model: str
    current_version: int = Field(
        description="the model's promoted version (0 when it has none, or is not registered): "
        "staleness is counted from it, along its lineage"
    )
    limits: LimitsOut
    limits_source: Literal["version", "default"] = Field(
        description="version: recorded in current_version's metrics.config by the trainer that "
        "made it (a field it did not record takes the default); default: no recorded config "
        "(the base version), the trainer's defaults"
    )
    advantage_source: Literal["trajectory", "batch"] = Field(
        description="trajectory: the advantages are the trainer's (the session's group-normalized "
        "return, or a sibling's normalized reward); batch: the recorded baseline depends on the "
        "batch the trainer claims, and the advantages shown are the trajectory's"
    )
    advantage_note: str | None = Field(
        default=None, description="why, when advantage_source is batch"
    )


class CutOut(BaseModel):
    at: str = Field(description="the completion that begins the sequence")
    reason: str = Field(description="branch | output_retokenized | history_edited")
    detail: str


class TurnOut(BaseModel):
    """One completion in a sequence: its output is token_ids[start:end]."""

    completion_id: str
    start: int
    end: int
    trained: bool = Field(description="its output carries loss (loss_mask 1)")
    reason: str | None = Field(description="why it is not trained (context only); null: trained")
    advantage: float | None = Field(description="the advantage it is trained with; null: not")
    policy_version: int | None = Field(description="the version that generated its first token")
    masked_reason: str | None = Field(
        default=None,
        description="why some of its output tokens carry no loss (loss_mask 0) though it is "
        "trained: tokens a weight swap continued under versions too stale; null: none",
    )


class SequenceOut(BaseModel):
    """One training sequence: a row of the update. Every per-token array has len(token_ids)."""

    model: str
    token_ids: list[int] = Field(description="the last turn's prompt and output")
    loss_mask: list[int] = Field(
        description="1 on the output tokens of trained turns, 0 elsewhere (and on a trained "
        "turn's tokens of a version too stale: per-token staleness)"
    )
    logprobs: list[float | None] = Field(
        description="the recorded behaviour log-prob on every output token (trained or not); "
        "null on context"
    )
    versions: list[int | None] = Field(
        description="each output token's generating version (a turn a weight swap continued "
        "holds several); null on context"
    )
    advantages: list[float] = Field(
        description="each trained output token's advantage; 0 where loss_mask is 0"
    )
    cuts: list[CutOut] = Field(description="why it begins a sequence rather than extend one")
    turns: list[TurnOut]
    trains: bool = Field(description="it has a trained turn (the update trains it)")
    update_length: int = Field(
        description="the update's row is token_ids[:update_length]: up to the end of the last "
        "trained output (the tokens after it carry no loss and, the attention being causal, "
        "change nothing before them); 0 when it trains nothing"
    )


class LeftOutOut(BaseModel):
    """A completion no sequence holds (longer than max_tokens_per_sample)."""

    completion_id: str
    model: str
    reason: str


class TrainingView(BaseModel):
    view: Literal["training"] = "training"
    session_id: str
    status: str
    train: bool = Field(description="false: a held-out session, never trained on")
    models: list[ModelView]
    sequences: list[SequenceOut]
    left_out: list[LeftOutOut]


def load_training_view(db: Session, session_id: str, now: datetime) -> TrainingView | None:
    """The session's training view as of `now`; None when there is no such session."""
    trajectory = load_trajectory(db, session_id, now)
    if trajectory is None:
        return None
    models = list(dict.fromkeys(s.model for s in trajectory.steps if s.model is not None))
    views, sequences, out = [], [], []
    for model in models:
        view, depths = _model_view(db, model)
        built = build_sequences(
            trajectory,
            current_version=view.current_version,
            limits=view.limits,
            lineage=depths,
            model=model,
            join_turns=view.limits.join_turns,
        )
        views.append(view)
        sequences += [_sequence(model, s) for s in built if s.token_ids]
        out += [
            LeftOutOut(completion_id=t.step.completion_id, model=model, reason=t.verdict.reason)
            for t in left_out(built)
        ]
    return TrainingView(
        session_id=trajectory.session_id,
        status=trajectory.status,
        train=trajectory.train,
        models=views,
        sequences=sequences,
        left_out=out,
    )


def _model_view(db: Session, model: str) -> tuple[ModelView, dict[int, int]]:
    model_id = db.scalar(select(RegisteredModel.id).where(RegisteredModel.name == model))
    version = 0 if model_id is None else head_version(db, model_id)
    # An unregistered model has no versions: only version 0 is on its lineage.
    depths = {0: 0} if model_id is None else lineage(db, model_id, version)
    config = None
    if model_id is not None:
        metrics = db.scalar(
            select(PolicyVersion.metrics).where(
                PolicyVersion.model_id == model_id, PolicyVersion.version == version
            )
        )
        if isinstance(metrics, dict) and isinstance(metrics.get("config"), dict):
            config = metrics["config"]
    baseline = (config or {}).get("baseline", "group")
    singleton = (config or {}).get("singleton_baseline", "none")
    batch = baseline != "group" or singleton != "none"
    view = ModelView(
        model=model,
        current_version=version,
        limits=LimitsOut(**dataclasses.asdict(_limits(config))),
        limits_source="default" if config is None else "version",
        advantage_source="batch" if batch else "trajectory",
        advantage_note=BATCH_NOTE.format(baseline=baseline, singleton=singleton) if batch else None,
    )
    return view, depths


def _limits(config: dict[str, Any] | None) -> SequenceLimits:
    """The recorded config's limits; a field it lacks or holds with another type, the default."""
    if config is None:
        return DEFAULT_LIMITS
    chosen = {}
    for f in dataclasses.fields(SequenceLimits):
        default, value = getattr(DEFAULT_LIMITS, f.name), config.get(f.name)
        kind = (int, float) if isinstance(default, float) else type(default)
        fits = isinstance(value, kind) and (
            isinstance(default, bool) or not isinstance(value, bool)
        )
        chosen[f.name] = value if fits else default
    return SequenceLimits(**chosen)


def _sequence(model: str, sequence: TrainingSequence) -> SequenceOut:
    return SequenceOut(
        model=model,
        token_ids=sequence.token_ids,
        **sequence.per_token(),
        cuts=[CutOut(at=c.at, reason=c.reason, detail=c.detail) for c in sequence.cuts],
        turns=[
            TurnOut(
                completion_id=t.step.completion_id,
                start=t.start,
                end=t.end,
                trained=t.trained,
                reason=t.verdict.reason,
                advantage=t.verdict.advantage if t.trained else None,
                policy_version=t.step.policy_version,
                masked_reason=t.verdict.masked_reason,
            )
            for t in sequence.turns
        ],
        trains=bool(sequence.trained),
        update_length=max((t.end for t in sequence.trained), default=0),
    )
