"""completion sampling settings: the sampling parameters the backend applied to each completion

`completions.sampling` (JSONB, nullable) holds rlgw.sampling.effective_sampling of the body the
backend got: temperature, top_p, top_k, min_p, the penalties, min_tokens, seed, n, and whether
logit_bias, bad_words, allowed_token_ids, structured outputs, beam search or a thinking budget
were on. Null for every completion recorded before this revision: those were recorded with vLLM's
raw log-probs and train as before (at temperature 1).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The model's comment at this revision (rlgw.db.models.SAMPLING_COMMENT), frozen here.
COMMENT = (
    "the sampling settings the backend applied (rlgw.sampling.effective_sampling of the body it "
    "got); null: recorded before they were kept"
)


def upgrade() -> None:
    op.add_column(
        "completions",
        sa.Column("sampling", postgresql.JSONB(), nullable=True, comment=COMMENT),
    )


def downgrade() -> None:
    op.drop_column("completions", "sampling")
