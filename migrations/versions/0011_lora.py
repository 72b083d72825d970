"""lora: the adapter settings a model is trained with (null: full weights)

A model trained with LoRA keeps its base weights on every backend and serves version N as the
adapter `name@vN` (rlgw/adapters.py); the gateway reads this column to send the model's
traffic to that adapter, `rlgw up` to start its backend with the LoRA flags, and the trainer to
train the same adapter after a restart.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COMMENT = (
    "LoRA training: {rank, alpha, targets}; versions are adapters served as name@vN. "
    "Null: full-weight training"
)


def upgrade() -> None:
    op.add_column("models", sa.Column("lora", postgresql.JSONB(), nullable=True, comment=COMMENT))
    op.alter_column(
        "policy_versions",
        "kind",
        existing_type=sa.String(16),
        comment="base|delta|full|lora",
        existing_comment="base|delta|full",
    )


def downgrade() -> None:
    op.alter_column(
        "policy_versions",
        "kind",
        existing_type=sa.String(16),
        comment="base|delta|full",
        existing_comment="base|delta|full|lora",
    )
    op.drop_column("models", "lora")
