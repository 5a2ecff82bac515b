"""Timing modes: how each measurement (and verdict) was timed, eager or CUDA-graph, cold or warm L2.

Rows from before this revision were timed with eager launches and a flushed L2: they get
"eager-cold" (fa4.timing.DEFAULT_TIMING), and lookups in that mode keep serving them.

Revision ID: 0004_timing
Revises: 0003_verdicts
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_timing"
down_revision = "0003_verdicts"
branch_labels = None
depends_on = None

# Written out, not imported: a revision keeps meaning what it meant when it was written.
DEFAULT = "eager-cold"
WIDTH = 16


def upgrade() -> None:
    for table in ("measurements", "verdicts"):
        # NOT NULL with a server default: existing rows read as the default mode at once (SQLite
        # adds such a column without rebuilding the table).
        op.add_column(table, sa.Column("timing", sa.String(WIDTH), nullable=False, server_default=DEFAULT))


def downgrade() -> None:
    for table in ("verdicts", "measurements"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("timing")
