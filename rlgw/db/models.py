"""SQLAlchemy tables of the learning record. Alembic migrations are the only way they change."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from rlgw.session_status import SessionStatus

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


SAMPLING_COMMENT = (
    "the sampling settings the backend applied (rlgw.sampling.effective_sampling of the body it "
    "got); null: recorded before they were kept"
)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB}


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class RegisteredModel(Base):
    """A policy served under one name; its backends all serve the same version lineage."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    path: Mapped[str | None] = mapped_column(Text, comment="base checkpoint directory")
    current_version: Mapped[int] = mapped_column(
        Integer,
        default=0,
        server_default="0",
        comment="the promoted version: what backends serve and the next version is built on",
    )
    candidate_version: Mapped[int | None] = mapped_column(
        Integer,
        comment="a recorded version under its promotion gate (evaluated or canaried); only "
        "sessions pinned to it reach the backends that serve it",
    )
    canary_share: Mapped[float | None] = mapped_column(
        Float, comment="while a canary runs: the share of new sessions pinned to the candidate"
    )
    canary_started_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="sessions created since may be pinned to the candidate"
    )
    lora: Mapped[dict[str, Any] | None] = mapped_column(
        JSONB,
        comment="LoRA training: {rank, alpha, targets}; versions are adapters served as name@vN. "
        "Null: full-weight training",
    )
    created_at: Mapped[datetime] = _now()


class Backend(Base):
    """One vLLM server of a model, with the routing state every gateway replica agrees on."""

    __tablename__ = "backends"
    __table_args__ = (Index(None, "model_id", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text, unique=True)
    state: Mapped[str] = mapped_column(
        String(16),
        default="active",
        server_default="active",
        comment="active|draining|paused|failed|offline",
    )
    state_reason: Mapped[str | None] = mapped_column(Text)
    served_version: Mapped[int | None] = mapped_column(
        Integer, comment="policy version resident on the backend, verified by the last swap"
    )
    swap_epoch: Mapped[int] = mapped_column(
        Integer,
        default=0,
        server_default="0",
        comment="incremented when a swap pauses the backend: a request leased in an older "
        "epoch and finished in a newer one crossed a swap",
    )
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class SwapBoundary(Base):
    """Where a swap that paused a backend in place cut each request it held
    (rlgw/swap_boundaries.py): the tokens before were sampled under `from_version`."""

    __tablename__ = "swap_boundaries"

    backend_id: Mapped[int] = mapped_column(
        ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(
        Integer, primary_key=True, comment="the backend's epoch it began"
    )
    from_version: Mapped[int | None] = mapped_column(Integer)
    to_version: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(
        String(16), comment="pausing|pending|served|failed (rlgw/swap_boundaries.py)"
    )
    running: Mapped[dict[str, Any] | None] = mapped_column(
        JSONB, comment="request key -> output tokens sampled before the pause; null until read"
    )
    finished: Mapped[list[str] | None] = mapped_column(
        JSONB, comment="request keys the backend had finished before the pause"
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class PolicyVersion(Base):
    """A policy version of a model: the base checkpoint (0) or the result of a training update."""

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    parent_version: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(
        String(16), default="base", server_default="base", comment="base|delta|full|lora"
    )
    weights_path: Mapped[str | None] = mapped_column(Text)
    checksum: Mapped[str | None] = mapped_column(String(128))
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    status: Mapped[str] = mapped_column(
        String(16),
        default="promoted",
        server_default="promoted",
        comment="candidate|promoted|rejected|rolled_back: only a promoted version serves "
        "sessions that are not pinned to it",
    )
    gate_report: Mapped[dict[str, Any] | None] = mapped_column(
        JSONB, comment="its promotion gate: evaluation scores, canary metrics, verdict and reason"
    )
    created_at: Mapped[datetime] = _now()


class SessionGroup(Base):
    """Sessions that share a group id (GRPO-style): their rewards are normalized together."""

    __tablename__ = "groups"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(
        String(64), comment="tenant of the key that created it; only its sessions may join"
    )
    normalization: Mapped[str] = mapped_column(String(16), comment="none|mean|mean_std")
    expected_size: Mapped[int | None] = mapped_column(
        Integer, comment="sessions the group waits for before it can be trained on"
    )
    deadline_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), comment="after this, a group still missing rewards is dropped"
    )
    status: Mapped[str] = mapped_column(
        String(16), default="open", server_default="open", comment="open|dropped"
    )
    dropped_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class AgentSession(Base):
    """One agent episode: the completions it made and the rewards it earned."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index(None, "status", "closed_at"),
        Index(None, "created_at"),
        Index(None, "tenant"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    group_id: Mapped[str | None] = mapped_column(
        ForeignKey("groups.id", ondelete="SET NULL"), index=True
    )
    task_id: Mapped[str | None] = mapped_column(String(256))
    tenant: Mapped[str | None] = mapped_column(
        String(64), comment="tenant of the agent key that created it; null: created with auth off"
    )
    agent_key_id: Mapped[str | None] = mapped_column(
        ForeignKey("agent_keys.id", ondelete="SET NULL"),
        comment="the agent key that opened it (its consent narrows the tenant's); null: "
        "opened with auth off, the admin key, or before keys were recorded",
    )
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict, server_default="{}")
    train: Mapped[bool] = mapped_column(Boolean, default=True, server_default="true")
    implicit: Mapped[bool] = mapped_column(
        Boolean,
        default=False,
        server_default="false",
        comment="created by the gateway for a call that named no session",
    )
    status: Mapped[str] = mapped_column(
        String(16),
        default=SessionStatus.OPEN,
        server_default=SessionStatus.OPEN,
        comment="|".join(SessionStatus),
    )
    created_at: Mapped[datetime] = _now()
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claimed_by: Mapped[int | None] = mapped_column(
        BigInteger, comment="trainer instance holding the claim (its advisory lock id)"
    )
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="the claim's lease (database clock): its trainer's heartbeat extends it; once "
        "past, the claim is lost and any trainer returns the session to closed",
    )
    consumed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dropped_reason: Mapped[str | None] = mapped_column(
        Text, comment="why training will never use this session"
    )
    sibling_normalization: Mapped[str | None] = mapped_column(
        String(16),
        comment="none|mean|mean_std: how the rewards of sibling choices (n > 1) are normalized "
        "within their sibling group; null: mean_std",
    )
    pinned_model: Mapped[str | None] = mapped_column(
        String(128), comment="the model of pinned_version"
    )
    pinned_version: Mapped[int | None] = mapped_column(
        Integer,
        comment="a canary or a gate evaluation pinned it to this version of pinned_model: every "
        "completion of it comes from that version",
    )


class Completion(Base):
    """One generated answer, token-exact: what the backend produced and what the client saw."""

    __tablename__ = "completions"
    __table_args__ = (
        Index(None, "session_id", "created_at"),
        Index(None, "retry_group"),
        Index(None, "created_at"),
        Index(None, "sibling_group"),
        Index(
            "ix_completions_crossed",
            "backend_id",
            postgresql_where=text("crossed_epochs IS NOT NULL"),
        ),
        # The retention sweep's path: old completions whose text is still kept.
        Index(
            "ix_completions_text_kept",
            "created_at",
            postgresql_where=text("text_dropped_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    api: Mapped[str] = mapped_column(
        String(32), comment="chat.completions|completions|responses|messages"
    )
    model: Mapped[str] = mapped_column(String(128))
    backend_id: Mapped[int | None] = mapped_column(ForeignKey("backends.id", ondelete="SET NULL"))
    policy_version: Mapped[int | None] = mapped_column(Integer)
    output_versions: Mapped[list[int] | None] = mapped_column(
        ARRAY(Integer),
        comment="the policy version of each output token, where a swap continued the request "
        "on new weights; null: every token at policy_version",
    )
    crossed_epochs: Mapped[list[int] | None] = mapped_column(
        ARRAY(Integer),
        comment="the epochs of its backend's pauses that output_versions was resolved through "
        "(a pause whose new weights later fail verification marks it); null: none",
    )
    # Token arrays are packed little-endian (int32 ids, float32 log-probs): 4 bytes a value.
    prompt_token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    output_token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    output_logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), comment="complete|incomplete|error")
    status_reason: Mapped[str | None] = mapped_column(Text)
    stream: Mapped[bool] = mapped_column(Boolean)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float, comment="time to first token")
    # JSON, not JSONB: kept verbatim, and JSONB cannot hold the \u0000 a model may generate.
    request: Mapped[dict[str, Any]] = mapped_column(JSON, comment="the client's request body")
    response: Mapped[dict[str, Any] | None] = mapped_column(
        JSON, comment="the response the client received (streams: assembled)"
    )
    backend_request: Mapped[dict[str, Any] | None] = mapped_column(
        JSON,
        comment="responses|messages: the chat completion body the gateway sent to the backend "
        "in its place",
    )
    sampling: Mapped[dict[str, Any] | None] = mapped_column(
        JSONB,
        comment=SAMPLING_COMMENT,
    )
    retry_group: Mapped[str | None] = mapped_column(String(64))
    sibling_group: Mapped[str | None] = mapped_column(
        String(64),
        comment="the choices of one request with n > 1 share it (the record id of choice 0); "
        "null for n = 1",
    )
    orphan_reason: Mapped[str | None] = mapped_column(
        Text,
        comment="why lineage did not keep it (a superseded retry, or it continues an orphan); "
        "null: kept",
    )
    parent_id: Mapped[str | None] = mapped_column(String(64))
    continuation_hash: Mapped[str | None] = mapped_column(
        String(64), comment="sha256 of the request's sequence followed by this output"
    )
    continuation_len: Mapped[int | None] = mapped_column(
        Integer, comment="length of that sequence (messages, tokens or characters)"
    )
    ineligible_reasons: Mapped[list[str]] = mapped_column(
        ARRAY(Text),
        default=list,
        server_default="{}",
        comment="every reason training must not use it (rlgw/eligibility.py); empty: eligible",
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    text_dropped_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="retention dropped its request and response bodies then; the tokens stay",
    )


class Consumption(Base):
    """The ledger: which completions of which sessions each policy version's update used."""

    __tablename__ = "consumption"
    __table_args__ = (
        UniqueConstraint("model_id", "session_id", "completion_id"),
        Index(None, "model_id", "version"),
        Index(None, "tenant"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer, comment="the version this update produced")
    # Provenance outlives the data: a purge or retention deletes the session and its
    # completions, and the ledger row stays with its tenant, tokens and version.
    session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.id", ondelete="SET NULL"), comment="null: the session was deleted"
    )
    completion_id: Mapped[str | None] = mapped_column(
        ForeignKey("completions.id", ondelete="SET NULL"),
        comment="null: the completion was deleted",
    )
    tenant: Mapped[str | None] = mapped_column(
        String(64), comment="tenant of the consumed session (provenance; kept after a purge)"
    )
    agent_key_id: Mapped[str | None] = mapped_column(
        String(32),
        comment="the agent key of the consumed session (provenance; kept after a purge)",
    )
    used: Mapped[bool] = mapped_column(Boolean, comment="false: skipped, see reason")
    reason: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    advantage: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = _now()


class SessionModelDrop(Base):
    """A session one model will never train on, while other models still may (its completions
    of this model were all skipped): the session stays closed for them (docs/training.md)."""

    __tablename__ = "session_model_drops"

    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Reward(Base):
    """A scalar reward on a session or one of its completions; stored once per idempotency key."""

    __tablename__ = "rewards"
    __table_args__ = (UniqueConstraint("session_id", "idempotency_key"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    completion_id: Mapped[str | None] = mapped_column(
        ForeignKey("completions.id", ondelete="CASCADE"), index=True
    )
    value: Mapped[float] = mapped_column(Float)
    scope: Mapped[str] = mapped_column(
        String(16),
        default="completion",
        server_default="completion",
        comment="session: posted on the session (attached to its final completion) | completion",
    )
    idempotency_key: Mapped[str | None] = mapped_column(String(256))
    body_digest: Mapped[str | None] = mapped_column(
        String(64), comment="digest of the posted body, to refuse a reused key with another body"
    )
    created_at: Mapped[datetime] = _now()


class AgentKey(Base):
    """A credential for the agent surfaces, bound to one tenant. Only its SHA-256 is stored."""

    __tablename__ = "agent_keys"
    __table_args__ = (Index(None, "tenant"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    key_hash: Mapped[str] = mapped_column(
        String(64), unique=True, comment="hex SHA-256 of the key; the key itself is never stored"
    )
    hint: Mapped[str] = mapped_column(
        String(16), comment="the key's first characters, to tell keys apart"
    )
    created_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    training_models: Mapped[list[str] | None] = mapped_column(
        ARRAY(Text),
        comment="null: the tenant's consent; otherwise the only models the key's sessions may "
        "train (empty: none), never more than the tenant's consent allows",
    )


class PromotionGate(Base):
    """What a new version of a model must pass before it serves all traffic (docs/governance.md)."""

    __tablename__ = "gates"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    eval_name: Mapped[str] = mapped_column(Text, comment="the evaluation file or built-in task")
    eval_digest: Mapped[str] = mapped_column(
        String(64), comment="sha256 of eval_items: scores are compared only within one digest"
    )
    eval_items: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, comment="the held-out prompts: messages, target, scorer, max_tokens"
    )
    min_score: Mapped[float | None] = mapped_column(
        Float, comment="pass: the candidate's mean score is at least this"
    )
    max_drop: Mapped[float | None] = mapped_column(
        Float, comment="pass: the candidate scores at most this below the promoted version"
    )
    canary: Mapped[str | None] = mapped_column(
        String(16), comment="backend|sessions: after the evaluation, serve a share of traffic"
    )
    canary_percent: Mapped[float | None] = mapped_column(
        Float, comment="sessions canary: the percentage of new sessions pinned to the candidate"
    )
    canary_sessions: Mapped[int] = mapped_column(
        Integer,
        default=20,
        server_default="20",
        comment="rewarded sessions needed on each side before the canary is judged",
    )
    canary_max_drop: Mapped[float] = mapped_column(
        Float,
        default=0.0,
        server_default="0",
        comment="pass: the canary sessions' mean reward is at most this below the promoted ones'",
    )
    canary_timeout_s: Mapped[float] = mapped_column(
        Float,
        default=3600.0,
        server_default="3600",
        comment="a canary without enough rewarded sessions by then is rolled back",
    )
    set_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = _now()


class TrainingPolicy(Base):
    """Which models a tenant's traffic may train (without a row: RLGW_TRAINING_CONSENT)."""

    __tablename__ = "training_policies"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    all_models: Mapped[bool] = mapped_column(
        Boolean, comment="true: every model; false: only those listed in models"
    )
    models: Mapped[list[str]] = mapped_column(
        ARRAY(Text), default=list, server_default="{}", comment="model names (empty: none)"
    )
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime] = _now()


class AuditEvent(Base):
    """Who changed what may change a model, when and why: gates, verdicts, rollbacks, training
    policies, purges. A rollback asked for over the API waits here (`state` pending) until the
    model's trainer carries it out."""

    __tablename__ = "audit_log"
    __table_args__ = (Index(None, "model", "action", "state"), Index(None, "tenant"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = _now()
    actor: Mapped[str] = mapped_column(
        String(128), comment="the OS user of a command, or admin-api (and who it said it was)"
    )
    action: Mapped[str] = mapped_column(
        String(32),
        comment="gate_set|gate_clear|promoted|rejected|rollback|training_policy|purge|retention",
    )
    model: Mapped[str | None] = mapped_column(String(128))
    tenant: Mapped[str | None] = mapped_column(String(64))
    from_version: Mapped[int | None] = mapped_column(Integer)
    to_version: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    state: Mapped[str | None] = mapped_column(
        String(16), comment="rollbacks: pending|running|done|failed; null for the other actions"
    )
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
