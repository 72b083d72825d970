"""per-token versions: a completion that a weight swap paused and continued keeps the version of
each output token, and every swap that pauses a backend in place records where it cut each request

`completions.output_versions` and `crossed_epochs` are null on every existing row (every token at
`policy_version`).
`swap_boundaries` starts empty.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "completions",
        sa.Column(
            "output_versions",
            postgresql.ARRAY(sa.Integer()),
            nullable=True,
            comment="the policy version of each output token, where a swap continued the "
            "request on new weights; null: every token at policy_version",
        ),
    )
    op.add_column(
        "completions",
        sa.Column(
            "crossed_epochs",
            postgresql.ARRAY(sa.Integer()),
            nullable=True,
            comment="the epochs of its backend's pauses that output_versions was resolved "
            "through (a pause whose new weights later fail verification marks it); null: none",
        ),
    )
    op.create_index(
        "ix_completions_crossed",
        "completions",
        ["backend_id"],
        postgresql_where=sa.text("crossed_epochs IS NOT NULL"),
    )
    op.create_table(
        "swap_boundaries",
        sa.Column("backend_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False, comment="the backend's epoch it began"),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=True),
        sa.Column(
            "outcome",
            sa.String(length=16),
            nullable=False,
            comment="pausing|pending|served|failed (rlgw/swap_boundaries.py)",
        ),
        sa.Column(
            "running",
            postgresql.JSONB(),
            nullable=True,
            comment="request key -> output tokens sampled before the pause; null until read",
        ),
        sa.Column(
            "finished",
            postgresql.JSONB(),
            nullable=True,
            comment="request keys the backend had finished before the pause",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["backend_id"],
            ["backends.id"],
            name=op.f("fk_swap_boundaries_backend_id_backends"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("backend_id", "epoch", name=op.f("pk_swap_boundaries")),
    )


def downgrade() -> None:
    op.drop_table("swap_boundaries")
    op.drop_index("ix_completions_crossed", table_name="completions")
    op.drop_column("completions", "crossed_epochs")
    op.drop_column("completions", "output_versions")
