"""Issue 18's problem features: sliding window bounds, softcap, learnable sinks.

Four columns on ``problems`` with server defaults (window bounds -1 = unbounded, softcap 0 = off,
no sink), so every row written before this revision reads as the plain problem it was, and the
shape's unique constraint widens to include them (a window problem is another problem than the
same shape without one).

Revision ID: 0006_features
Revises: 0005_retired_knobs
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_features"
down_revision = "0005_retired_knobs"
branch_labels = None
depends_on = None

# Written out, not imported: a revision keeps meaning what it meant when it was written.
SHAPE = ["batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v",
         "dtype", "causal", "deterministic", "pass"]
FEATURES = ["window_left", "window_right", "softcap", "sink"]


def upgrade() -> None:
    # batch_alter_table: SQLite rebuilds the table to change a constraint, PostgreSQL alters in place.
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("window_left", sa.Integer(), nullable=False, server_default="-1"))
        batch.add_column(sa.Column("window_right", sa.Integer(), nullable=False, server_default="-1"))
        batch.add_column(sa.Column("softcap", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("sink", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE + FEATURES)


def downgrade() -> None:
    # Rows with a feature have no plain twin to fold into: they are dropped with their measurements
    # (ON DELETE CASCADE) rather than turned into wrong plain problems.
    problems = sa.table("problems", *(sa.column(c) for c in FEATURES))
    op.execute(sa.delete(problems).where(sa.or_(
        problems.c.window_left != -1, problems.c.window_right != -1, problems.c.softcap != 0,
        problems.c.sink.is_(True))))
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        for c in reversed(FEATURES):
            batch.drop_column(c)
