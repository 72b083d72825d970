"""trainer claims and consumption ledger

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumption",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column(
            "version", sa.Integer(), nullable=False, comment="the version this update produced"
        ),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("completion_id", sa.String(length=64), nullable=False),
        sa.Column("used", sa.Boolean(), nullable=False, comment="false: skipped, see reason"),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("advantage", sa.Float(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["completion_id"],
            ["completions.id"],
            name=op.f("fk_consumption_completion_id_completions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_consumption_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_consumption_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_consumption")),
        sa.UniqueConstraint(
            "model_id",
            "session_id",
            "completion_id",
            name=op.f("uq_consumption_model_id_session_id_completion_id"),
        ),
    )
    op.create_index(
        op.f("ix_consumption_model_id_version"),
        "consumption",
        ["model_id", "version"],
        unique=False,
    )
    op.add_column(
        "sessions",
        sa.Column(
            "claimed_by",
            sa.BigInteger(),
            nullable=True,
            comment="trainer instance holding the claim (its advisory lock id)",
        ),
    )
    op.add_column("sessions", sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "sessions",
        sa.Column(
            "dropped_reason",
            sa.Text(),
            nullable=True,
            comment="why training will never use this session",
        ),
    )
    op.alter_column(
        "sessions",
        "status",
        existing_type=sa.VARCHAR(length=16),
        comment="open|closed|claimed|consumed|dropped",
        existing_comment="open|closed|consumed",
        existing_nullable=False,
        existing_server_default=sa.text("'open'::character varying"),
    )


def downgrade() -> None:
    op.alter_column(
        "sessions",
        "status",
        existing_type=sa.VARCHAR(length=16),
        comment="open|closed|consumed",
        existing_comment="open|closed|claimed|consumed|dropped",
        existing_nullable=False,
        existing_server_default=sa.text("'open'::character varying"),
    )
    op.drop_column("sessions", "dropped_reason")
    op.drop_column("sessions", "claimed_at")
    op.drop_column("sessions", "claimed_by")
    op.drop_index(op.f("ix_consumption_model_id_version"), table_name="consumption")
    op.drop_table("consumption")
