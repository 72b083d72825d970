"""initial schema: models, backends, policy versions, sessions, completions, rewards

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("path", sa.Text(), nullable=True, comment="base checkpoint directory"),
        sa.Column("current_version", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("group_id", sa.String(length=128), nullable=True),
        sa.Column("task_id", sa.String(length=256), nullable=True),
        sa.Column(
            "metadata", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("train", sa.Boolean(), server_default="true", nullable=False),
        sa.Column(
            "implicit",
            sa.Boolean(),
            server_default="false",
            nullable=False,
            comment="created by the gateway for a call that named no session",
        ),
        sa.Column(
            "status",
            sa.String(length=16),
            server_default="open",
            nullable=False,
            comment="open|closed|consumed",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_group_id"), "sessions", ["group_id"], unique=False)
    op.create_index(
        op.f("ix_sessions_status_closed_at"), "sessions", ["status", "closed_at"], unique=False
    )
    op.create_table(
        "backends",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column(
            "state",
            sa.String(length=16),
            server_default="active",
            nullable=False,
            comment="active|draining|paused|failed|offline",
        ),
        sa.Column("state_reason", sa.Text(), nullable=True),
        sa.Column(
            "served_version",
            sa.Integer(),
            nullable=True,
            comment="policy version resident on the backend, verified by the last swap",
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_backends_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backends")),
        sa.UniqueConstraint("url", name=op.f("uq_backends_url")),
    )
    op.create_index(
        op.f("ix_backends_model_id_state"), "backends", ["model_id", "state"], unique=False
    )
    op.create_table(
        "policy_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_version", sa.Integer(), nullable=True),
        sa.Column(
            "kind",
            sa.String(length=16),
            server_default="base",
            nullable=False,
            comment="base|delta|full",
        ),
        sa.Column("weights_path", sa.Text(), nullable=True),
        sa.Column("checksum", sa.String(length=128), nullable=True),
        sa.Column(
            "metrics", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_policy_versions_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_versions")),
        sa.UniqueConstraint(
            "model_id", "version", name=op.f("uq_policy_versions_model_id_version")
        ),
    )
    op.create_table(
        "completions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column(
            "api", sa.String(length=32), nullable=False, comment="chat.completions|completions"
        ),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("backend_id", sa.Integer(), nullable=True),
        sa.Column("policy_version", sa.Integer(), nullable=True),
        sa.Column("prompt_token_ids", sa.LargeBinary(), nullable=True),
        sa.Column("output_token_ids", sa.LargeBinary(), nullable=True),
        sa.Column("output_logprobs", sa.LargeBinary(), nullable=True),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column(
            "status", sa.String(length=16), nullable=False, comment="complete|incomplete|error"
        ),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True, comment="time to first token"),
        sa.Column(
            "request",
            postgresql.JSON(astext_type=sa.Text()),
            nullable=False,
            comment="the client's request body",
        ),
        sa.Column(
            "response",
            postgresql.JSON(astext_type=sa.Text()),
            nullable=True,
            comment="the response the client received (streams: assembled)",
        ),
        sa.Column("retry_group", sa.String(length=64), nullable=True),
        sa.Column("is_orphan", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("eligible", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("eligibility_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["backend_id"],
            ["backends.id"],
            name=op.f("fk_completions_backend_id_backends"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_completions_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_completions")),
    )
    op.create_index(op.f("ix_completions_created_at"), "completions", ["created_at"], unique=False)
    op.create_index(
        op.f("ix_completions_retry_group"), "completions", ["retry_group"], unique=False
    )
    op.create_index(
        op.f("ix_completions_session_id_created_at"),
        "completions",
        ["session_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "rewards",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("completion_id", sa.String(length=64), nullable=True),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=256), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["completion_id"],
            ["completions.id"],
            name=op.f("fk_rewards_completion_id_completions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_rewards_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rewards")),
        sa.UniqueConstraint(
            "session_id", "idempotency_key", name=op.f("uq_rewards_session_id_idempotency_key")
        ),
    )
    op.create_index(op.f("ix_rewards_completion_id"), "rewards", ["completion_id"], unique=False)
    op.create_index(op.f("ix_rewards_session_id"), "rewards", ["session_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_rewards_session_id"), table_name="rewards")
    op.drop_index(op.f("ix_rewards_completion_id"), table_name="rewards")
    op.drop_table("rewards")
    op.drop_index(op.f("ix_completions_session_id_created_at"), table_name="completions")
    op.drop_index(op.f("ix_completions_retry_group"), table_name="completions")
    op.drop_index(op.f("ix_completions_created_at"), table_name="completions")
    op.drop_table("completions")
    op.drop_table("policy_versions")
    op.drop_index(op.f("ix_backends_model_id_state"), table_name="backends")
    op.drop_table("backends")
    op.drop_index(op.f("ix_sessions_status_closed_at"), table_name="sessions")
    op.drop_index(op.f("ix_sessions_group_id"), table_name="sessions")
    op.drop_table("sessions")
    op.drop_table("models")
