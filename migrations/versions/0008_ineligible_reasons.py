"""every reason a completion is not trained on, in one list; orphans by their reason alone

Replaces completions.eligible, eligibility_reason (one reason, overwritten by the next) and
is_orphan (set exactly when orphan_reason is) with ineligible_reasons text[].

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ORPHAN_COMMENT = (
    "why lineage did not keep it (a superseded retry, or it continues an orphan); null: kept"
)


def upgrade() -> None:
    op.add_column(
        "completions",
        sa.Column(
            "ineligible_reasons",
            postgresql.ARRAY(sa.Text()),
            server_default="{}",
            nullable=False,
            comment="every reason training must not use it (rlgw/eligibility.py); empty: eligible",
        ),
    )
    op.execute(
        "UPDATE completions SET ineligible_reasons = "
        "ARRAY[coalesce(eligibility_reason, 'not eligible (no reason was recorded)')] "
        "WHERE NOT eligible"
    )
    op.execute(
        "UPDATE completions SET orphan_reason = CASE WHEN is_orphan "
        "THEN coalesce(orphan_reason, 'orphan') END "
        "WHERE is_orphan <> (orphan_reason IS NOT NULL)"
    )
    op.alter_column(
        "completions",
        "orphan_reason",
        existing_type=sa.Text(),
        comment=ORPHAN_COMMENT,
        existing_nullable=True,
    )
    op.drop_column("completions", "eligibility_reason")
    op.drop_column("completions", "eligible")
    op.drop_column("completions", "is_orphan")


def downgrade() -> None:
    op.add_column(
        "completions",
        sa.Column("is_orphan", sa.Boolean(), server_default="false", nullable=False),
    )
    op.add_column(
        "completions",
        sa.Column("eligible", sa.Boolean(), server_default="false", nullable=False),
    )
    op.add_column("completions", sa.Column("eligibility_reason", sa.Text(), nullable=True))
    op.execute(
        "UPDATE completions SET is_orphan = orphan_reason IS NOT NULL, "
        "eligible = cardinality(ineligible_reasons) = 0, "
        "eligibility_reason = NULLIF(array_to_string(ineligible_reasons, '; '), '')"
    )
    op.alter_column(
        "completions",
        "orphan_reason",
        existing_type=sa.Text(),
        comment=None,
        existing_comment=ORPHAN_COMMENT,
        existing_nullable=True,
    )
    op.drop_column("completions", "ineligible_reasons")
