"""Verdicts: a study's top configs re-measured against the default, the config lookups serve.

Revision ID: 0003_verdicts
Revises: 0002_idempotency_key
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_verdicts"
down_revision = "0002_idempotency_key"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows measured before this revision have no verdict: lookups keep serving their fastest row.
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("study_name", sa.String(255), nullable=True),
        sa.Column("measurement_id", sa.Integer(), nullable=False),
        sa.Column("significant", sa.Boolean(), nullable=False),
        sa.Column("gain", sa.Float(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=False),
        sa.Column("rounds", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("source_fingerprint", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_verdicts"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_verdicts_device_id_devices",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_verdicts_problem_id_problems",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["measurement_id"], ["measurements.id"],
                                name="fk_verdicts_measurement_id_measurements", ondelete="CASCADE"),
    )
    op.create_index("ix_verdicts_lookup", "verdicts", ["problem_id", "device_id", "provider"])
    op.create_index("ix_verdicts_created_at", "verdicts", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_verdicts_created_at", table_name="verdicts")
    op.drop_index("ix_verdicts_lookup", table_name="verdicts")
    op.drop_table("verdicts")
