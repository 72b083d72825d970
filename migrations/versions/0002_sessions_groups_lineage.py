"""sessions, groups, rewards and retry lineage

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column(
            "normalization", sa.String(length=16), nullable=False, comment="none|mean|mean_std"
        ),
        sa.Column(
            "expected_size",
            sa.Integer(),
            nullable=True,
            comment="sessions the group waits for before it can be trained on",
        ),
        sa.Column(
            "deadline_at",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="after this, a group still missing rewards is dropped",
        ),
        sa.Column(
            "status",
            sa.String(length=16),
            server_default="open",
            nullable=False,
            comment="open|dropped",
        ),
        sa.Column("dropped_reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_groups")),
    )
    op.add_column("completions", sa.Column("orphan_reason", sa.Text(), nullable=True))
    op.add_column(
        "completions",
        sa.Column(
            "continuation_hash",
            sa.String(length=64),
            nullable=True,
            comment="sha256 of the request's sequence followed by this output",
        ),
    )
    op.add_column(
        "completions",
        sa.Column(
            "continuation_len",
            sa.Integer(),
            nullable=True,
            comment="length of that sequence (messages, tokens or characters)",
        ),
    )
    op.add_column(
        "rewards",
        sa.Column(
            "scope",
            sa.String(length=16),
            server_default="completion",
            nullable=False,
            comment="session: posted on the session (attached to its final completion) "
            "| completion",
        ),
    )
    op.add_column(
        "rewards",
        sa.Column(
            "body_digest",
            sa.String(length=64),
            nullable=True,
            comment="digest of the posted body, to refuse a reused key with another body",
        ),
    )
    op.add_column("sessions", sa.Column("consumed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_foreign_key(
        op.f("fk_sessions_group_id_groups"),
        "sessions",
        "groups",
        ["group_id"],
        ["id"],
        ondelete="SET NULL",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("fk_sessions_group_id_groups"), "sessions", type_="foreignkey")
    op.drop_column("sessions", "consumed_at")
    op.drop_column("rewards", "body_digest")
    op.drop_column("rewards", "scope")
    op.drop_column("completions", "continuation_len")
    op.drop_column("completions", "continuation_hash")
    op.drop_column("completions", "orphan_reason")
    op.drop_table("groups")
