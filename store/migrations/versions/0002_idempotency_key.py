"""Idempotency key on measurements, so a remote tuner can retry a POST safely.

Revision ID: 0002_idempotency_key
Revises: 0001_initial
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_idempotency_key"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: rows written locally by the tuner carry no key. A unique index
    # still allows any number of NULLs on both SQLite and PostgreSQL.
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(64), nullable=True))
    op.create_index(
        "ix_measurements_idempotency_key", "measurements", ["idempotency_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_measurements_idempotency_key", table_name="measurements")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("idempotency_key")
