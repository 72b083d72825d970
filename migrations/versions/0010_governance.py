"""governance: promotion gates, version statuses, pinned sessions, training consent, provenance
that survives a purge, text retention, the audit log

The ledger's session and completion references become ON DELETE SET NULL (they were CASCADE):
purging a tenant or a retention sweep deletes the data, and the ledger keeps who it came from
(consumption.tenant, backfilled from the sessions), how many tokens, and which version consumed
it. `models.current_version` becomes the promoted version; a registry whose newest version row
is ahead of it (older code) is brought to that row, as that code continued from it.

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None

CURRENT_COMMENT = "the promoted version: what backends serve and the next version is built on"
STATUS_COMMENT = (
    "candidate|promoted|rejected|rolled_back: only a promoted version serves sessions that are "
    "not pinned to it"
)


def _now() -> sa.Column:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
    )


def _models_and_versions() -> None:
    op.alter_column(
        "models",
        "current_version",
        existing_type=sa.Integer(),
        comment=CURRENT_COMMENT,
        existing_nullable=False,
        existing_server_default=sa.text("0"),
    )
    op.execute(
        "UPDATE models m SET current_version = v.newest FROM (SELECT model_id, max(version) "
        "AS newest FROM policy_versions GROUP BY model_id) v "
        "WHERE v.model_id = m.id AND v.newest > m.current_version"
    )
    op.add_column(
        "models",
        sa.Column(
            "candidate_version",
            sa.Integer(),
            nullable=True,
            comment="a recorded version under its promotion gate (evaluated or canaried); only "
            "sessions pinned to it reach the backends that serve it",
        ),
    )
    op.add_column(
        "models",
        sa.Column(
            "canary_share",
            sa.Float(),
            nullable=True,
            comment="while a canary runs: the share of new sessions pinned to the candidate",
        ),
    )
    op.add_column(
        "models",
        sa.Column(
            "canary_started_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="sessions created since may be pinned to the candidate",
        ),
    )
    op.add_column(
        "policy_versions",
        sa.Column(
            "status",
            sa.String(length=16),
            server_default="promoted",
            nullable=False,
            comment=STATUS_COMMENT,
        ),
    )
    op.add_column(
        "policy_versions",
        sa.Column(
            "gate_report",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=True,
            comment="its promotion gate: evaluation scores, canary metrics, verdict and reason",
        ),
    )


def _sessions_and_completions() -> None:
    op.add_column(
        "sessions",
        sa.Column(
            "pinned_model",
            sa.String(length=128),
            nullable=True,
            comment="the model of pinned_version",
        ),
    )
    op.add_column(
        "sessions",
        sa.Column(
            "pinned_version",
            sa.Integer(),
            nullable=True,
            comment="a canary or a gate evaluation pinned it to this version of pinned_model: "
            "every completion of it comes from that version",
        ),
    )
    op.create_index(op.f("ix_sessions_tenant"), "sessions", ["tenant"], unique=False)
    op.add_column(
        "completions",
        sa.Column(
            "text_dropped_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="retention dropped its request and response bodies then; the tokens stay",
        ),
    )
    op.create_index(
        "ix_completions_text_kept",
        "completions",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("text_dropped_at IS NULL"),
    )


def _ledger_keeps_provenance() -> None:
    op.add_column(
        "consumption",
        sa.Column(
            "tenant",
            sa.String(length=64),
            nullable=True,
            comment="tenant of the consumed session (provenance; kept after a purge)",
        ),
    )
    op.execute(
        "UPDATE consumption c SET tenant = s.tenant FROM sessions s WHERE s.id = c.session_id"
    )
    op.create_index(op.f("ix_consumption_tenant"), "consumption", ["tenant"], unique=False)
    for column, table, comment in (
        ("session_id", "sessions", "null: the session was deleted"),
        ("completion_id", "completions", "null: the completion was deleted"),
    ):
        name = f"fk_consumption_{column}_{table}"
        op.drop_constraint(name, "consumption", type_="foreignkey")
        op.alter_column(
            "consumption",
            column,
            existing_type=sa.String(length=128 if column == "session_id" else 64),
            nullable=True,
            comment=comment,
        )
        op.create_foreign_key(name, "consumption", table, [column], ["id"], ondelete="SET NULL")


def _new_tables() -> None:
    op.create_table(
        "gates",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column(
            "eval_name", sa.Text(), nullable=False, comment="the evaluation file or built-in task"
        ),
        sa.Column(
            "eval_digest",
            sa.String(length=64),
            nullable=False,
            comment="sha256 of eval_items: scores are compared only within one digest",
        ),
        sa.Column(
            "eval_items",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="the held-out prompts: messages, target, scorer, max_tokens",
        ),
        sa.Column(
            "min_score",
            sa.Float(),
            nullable=True,
            comment="pass: the candidate's mean score is at least this",
        ),
        sa.Column(
            "max_drop",
            sa.Float(),
            nullable=True,
            comment="pass: the candidate scores at most this below the promoted version",
        ),
        sa.Column(
            "canary",
            sa.String(length=16),
            nullable=True,
            comment="backend|sessions: after the evaluation, serve a share of traffic",
        ),
        sa.Column(
            "canary_percent",
            sa.Float(),
            nullable=True,
            comment="sessions canary: the percentage of new sessions pinned to the candidate",
        ),
        sa.Column(
            "canary_sessions",
            sa.Integer(),
            server_default="20",
            nullable=False,
            comment="rewarded sessions needed on each side before the canary is judged",
        ),
        sa.Column(
            "canary_max_drop",
            sa.Float(),
            server_default="0",
            nullable=False,
            comment="pass: the canary sessions' mean reward is at most this below the promoted "
            "ones'",
        ),
        sa.Column(
            "canary_timeout_s",
            sa.Float(),
            server_default="3600",
            nullable=False,
            comment="a canary without enough rewarded sessions by then is rolled back",
        ),
        sa.Column("set_by", sa.String(length=128), nullable=False),
        _now(),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_gates_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_gates")),
    )
    op.create_table(
        "training_policies",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column(
            "all_models",
            sa.Boolean(),
            nullable=False,
            comment="true: every model; false: only those listed in models",
        ),
        sa.Column(
            "models",
            postgresql.ARRAY(sa.Text()),
            server_default="{}",
            nullable=False,
            comment="model names (empty: none)",
        ),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_training_policies")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "actor",
            sa.String(length=128),
            nullable=False,
            comment="the OS user of a command, or admin-api (and who it said it was)",
        ),
        sa.Column(
            "action",
            sa.String(length=32),
            nullable=False,
            comment="gate_set|gate_clear|promoted|rejected|rollback|training_policy|purge|"
            "retention",
        ),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default="{}",
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.String(length=16),
            nullable=True,
            comment="rollbacks: pending|running|done|failed; null for the other actions",
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(
        op.f("ix_audit_log_model_action_state"),
        "audit_log",
        ["model", "action", "state"],
        unique=False,
    )
    op.create_index(op.f("ix_audit_log_tenant"), "audit_log", ["tenant"], unique=False)


def upgrade() -> None:
    _models_and_versions()
    _sessions_and_completions()
    _ledger_keeps_provenance()
    _new_tables()


def downgrade() -> None:
    op.drop_index(op.f("ix_audit_log_tenant"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_model_action_state"), table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("training_policies")
    op.drop_table("gates")
    # Ledger rows whose data was purged cannot point at it again: they go, as CASCADE did.
    op.execute("DELETE FROM consumption WHERE session_id IS NULL OR completion_id IS NULL")
    for column, table in (("session_id", "sessions"), ("completion_id", "completions")):
        name = f"fk_consumption_{column}_{table}"
        op.drop_constraint(name, "consumption", type_="foreignkey")
        op.alter_column(
            "consumption",
            column,
            existing_type=sa.String(length=128 if column == "session_id" else 64),
            nullable=False,
            comment=None,
        )
        op.create_foreign_key(name, "consumption", table, [column], ["id"], ondelete="CASCADE")
    op.drop_index(op.f("ix_consumption_tenant"), table_name="consumption")
    op.drop_column("consumption", "tenant")
    op.drop_index(
        "ix_completions_text_kept",
        table_name="completions",
        postgresql_where=sa.text("text_dropped_at IS NULL"),
    )
    op.drop_column("completions", "text_dropped_at")
    op.drop_index(op.f("ix_sessions_tenant"), table_name="sessions")
    op.drop_column("sessions", "pinned_version")
    op.drop_column("sessions", "pinned_model")
    op.drop_column("policy_versions", "gate_report")
    op.drop_column("policy_versions", "status")
    op.drop_column("models", "canary_started_at")
    op.drop_column("models", "canary_share")
    op.drop_column("models", "candidate_version")
    op.alter_column(
        "models",
        "current_version",
        existing_type=sa.Integer(),
        comment=None,
        existing_comment=CURRENT_COMMENT,
        existing_nullable=False,
        existing_server_default=sa.text("0"),
    )
