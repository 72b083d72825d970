"""index sessions by creation time (`rlgw export --since`)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_sessions_created_at"), "sessions", ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_created_at"), table_name="sessions")
