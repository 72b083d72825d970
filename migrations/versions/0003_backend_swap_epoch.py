"""backend swap epoch

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "backends",
        sa.Column(
            "swap_epoch",
            sa.Integer(),
            server_default="0",
            nullable=False,
            comment="incremented when a swap pauses the backend: a request leased in an older "
            "epoch and finished in a newer one crossed a swap",
        ),
    )


def downgrade() -> None:
    op.drop_column("backends", "swap_epoch")
