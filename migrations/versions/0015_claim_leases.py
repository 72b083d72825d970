"""claim leases and per-model drops: a claim expires unless its trainer's heartbeat extends it;
a session that calls several models may be spent for one of them while the others still train it

`sessions.lease_expires_at` is null on every existing row (no claim held, or one taken before
this revision: such a claim is released by the dead-instance check or never expires by lease).
`session_model_drops` starts empty.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column(
            "lease_expires_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="the claim's lease (database clock): its trainer's heartbeat extends it; "
            "once past, the claim is lost and any trainer returns the session to closed",
        ),
    )
    op.create_table(
        "session_model_drops",
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_session_model_drops_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_session_model_drops_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "model_id", name=op.f("pk_session_model_drops")),
    )


def downgrade() -> None:
    op.drop_table("session_model_drops")
    op.drop_column("sessions", "lease_expires_at")
