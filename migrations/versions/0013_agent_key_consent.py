"""agent key consent: a key may narrow its tenant's training consent; sessions remember the key
that opened them, and the ledger the key of each consumed session (provenance)

`agent_keys.training_models` null (every existing key) keeps the tenant's consent unchanged.
`sessions.agent_key_id` is null for sessions opened before this revision (or with the admin
key, or with auth off): they follow their tenant's consent alone, as before.

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None

KEY_MODELS_COMMENT = (
    "null: the tenant's consent; otherwise the only models the key's sessions may train "
    "(empty: none), never more than the tenant's consent allows"
)


def upgrade() -> None:
    op.add_column(
        "agent_keys",
        sa.Column(
            "training_models",
            postgresql.ARRAY(sa.Text()),
            nullable=True,
            comment=KEY_MODELS_COMMENT,
        ),
    )
    op.add_column(
        "sessions",
        sa.Column(
            "agent_key_id",
            sa.String(length=32),
            nullable=True,
            comment="the agent key that opened it (its consent narrows the tenant's); null: "
            "opened with auth off, the admin key, or before keys were recorded",
        ),
    )
    op.create_foreign_key(
        op.f("fk_sessions_agent_key_id_agent_keys"),
        "sessions",
        "agent_keys",
        ["agent_key_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.add_column(
        "consumption",
        sa.Column(
            "agent_key_id",
            sa.String(length=32),
            nullable=True,
            comment="the agent key of the consumed session (provenance; kept after a purge)",
        ),
    )


def downgrade() -> None:
    op.drop_column("consumption", "agent_key_id")
    op.drop_constraint(op.f("fk_sessions_agent_key_id_agent_keys"), "sessions", type_="foreignkey")
    op.drop_column("sessions", "agent_key_id")
    op.drop_column("agent_keys", "training_models")
