"""Issue 19's decode problems in the same problems table as attention's.

Three columns on ``problems`` with server defaults: ``kind`` ("attention" | "decode"),
``page_size`` (0: not paged) and ``seqlen_k_mean`` (0: unknown), so every row written before
this revision reads as the attention problem it was. A decode problem (fa4.decode_problem)
fills the shared shape columns (batch, seqlen_q, seqlen_k, heads, head_dim, dtype, causal) and
the attention-only ones at their defaults; the unique constraint widens to the new columns.

Revision ID: 0007_decode
Revises: 0006_features
Create Date: 2026-12-01
"""

from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision = "0007_decode"
down_revision = "0006_features"
branch_labels = None
depends_on = None

# Written out, not imported: a revision keeps meaning what it meant when it was written.
SHAPE = ["batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v",
         "dtype", "causal", "deterministic", "pass", "window_left", "window_right", "softcap", "sink"]
DECODE = ["kind", "page_size", "seqlen_k_mean"]
# The tables whose rows hang off problems (ON DELETE CASCADE), parents first.
DEPENDENTS = ("measurements", "verdicts")


@contextmanager
def _problems_rebuilt():
    """batch_alter_table on problems, keeping the rows that reference it (as in 0006: SQLite's
    table copy drops the old table, and with foreign keys on that DROP cascades into every
    measurement and verdict; they are set aside and put back, ids and all, in the same
    transaction). PostgreSQL alters in place and needs none of it."""
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
    with _problems_rebuilt() as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="attention"))
        batch.add_column(sa.Column("page_size", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("seqlen_k_mean", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE + DECODE)


def downgrade() -> None:
    # Decode rows have no attention twin: dropped with their measurements (ON DELETE CASCADE).
    problems = sa.table("problems", sa.column("kind", sa.String))
    op.execute(sa.delete(problems).where(problems.c.kind != "attention"))
    with _problems_rebuilt() as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        for c in reversed(DECODE):
            batch.drop_column(c)
