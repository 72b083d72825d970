"""agent keys and tenants

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column(
            "key_hash",
            sa.String(length=64),
            nullable=False,
            comment="hex SHA-256 of the key; the key itself is never stored",
        ),
        sa.Column(
            "hint",
            sa.String(length=16),
            nullable=False,
            comment="the key's first characters, to tell keys apart",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_agent_keys_key_hash")),
    )
    op.create_index(op.f("ix_agent_keys_tenant"), "agent_keys", ["tenant"], unique=False)
    op.add_column(
        "groups",
        sa.Column(
            "tenant",
            sa.String(length=64),
            nullable=True,
            comment="tenant of the key that created it; only its sessions may join",
        ),
    )
    op.add_column(
        "sessions",
        sa.Column(
            "tenant",
            sa.String(length=64),
            nullable=True,
            comment="tenant of the agent key that created it; null: created with auth off",
        ),
    )


def downgrade() -> None:
    op.drop_column("sessions", "tenant")
    op.drop_column("groups", "tenant")
    op.drop_index(op.f("ix_agent_keys_tenant"), table_name="agent_keys")
    op.drop_table("agent_keys")
