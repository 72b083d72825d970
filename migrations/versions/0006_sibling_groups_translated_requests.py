"""sibling groups (n > 1) and translated requests (Responses and Messages APIs)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "completions",
        sa.Column(
            "backend_request",
            postgresql.JSON(astext_type=sa.Text()),
            nullable=True,
            comment="responses|messages: the chat completion body the gateway sent to the "
            "backend in its place",
        ),
    )
    op.add_column(
        "completions",
        sa.Column(
            "sibling_group",
            sa.String(length=64),
            nullable=True,
            comment="the choices of one request with n > 1 share it (the record id of choice 0); "
            "null for n = 1",
        ),
    )
    op.alter_column(
        "completions",
        "api",
        existing_type=sa.VARCHAR(length=32),
        comment="chat.completions|completions|responses|messages",
        existing_comment="chat.completions|completions",
        existing_nullable=False,
    )
    op.create_index(
        op.f("ix_completions_sibling_group"), "completions", ["sibling_group"], unique=False
    )
    op.add_column(
        "sessions",
        sa.Column(
            "sibling_normalization",
            sa.String(length=16),
            nullable=True,
            comment="none|mean|mean_std: how the rewards of sibling choices (n > 1) are "
            "normalized within their sibling group; null: mean_std",
        ),
    )


def downgrade() -> None:
    op.drop_column("sessions", "sibling_normalization")
    op.drop_index(op.f("ix_completions_sibling_group"), table_name="completions")
    op.alter_column(
        "completions",
        "api",
        existing_type=sa.VARCHAR(length=32),
        comment="chat.completions|completions",
        existing_comment="chat.completions|completions|responses|messages",
        existing_nullable=False,
    )
    op.drop_column("completions", "sibling_group")
    op.drop_column("completions", "backend_request")
