"""Issue 18's problem features: sliding window bounds, softcap, learnable sinks.

Four columns on ``problems`` with server defaults (window bounds -1 = unbounded, softcap 0 = off,
no sink), so every row written before this revision reads as the plain problem it was, and the
shape's unique constraint widens to include them (a window problem is another problem than the
same shape without one).

Revision ID: 0006_features
Revises: 0005_retired_knobs
Create Date: 2026-12-01
"""

from contextlib import contextmanager

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


# The tables whose rows hang off problems (ON DELETE CASCADE), parents first.
DEPENDENTS = ("measurements", "verdicts")


@contextmanager
def _problems_rebuilt():
    """batch_alter_table on problems, keeping the rows that reference it.

    SQLite changes a constraint by copying the table and dropping the old one, and with foreign
    keys on (the store's connections) that DROP deletes every measurement and verdict through
    ON DELETE CASCADE; the pragma cannot be turned off inside the upgrade's one transaction. So
    their rows are set aside in temporary tables and put back, ids and all, in the same
    transaction. PostgreSQL alters the table in place and needs none of it.
    """
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for t in DEPENDENTS:
            op.execute(f"CREATE TEMP TABLE _keep_{t} AS SELECT * FROM {t}")
    with op.batch_alter_table("problems") as batch:
        yield batch
    if sqlite:
        for t in DEPENDENTS:
            op.execute(f"DELETE FROM {t}")  # none left after the cascade; stated, not assumed
            op.execute(f"INSERT INTO {t} SELECT * FROM _keep_{t}")
            op.execute(f"DROP TABLE _keep_{t}")


def upgrade() -> None:
    # batch_alter_table: SQLite rebuilds the table to change a constraint, PostgreSQL alters in place.
    with _problems_rebuilt() as batch:
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
    with _problems_rebuilt() as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        for c in reversed(FEATURES):
            batch.drop_column(c)
