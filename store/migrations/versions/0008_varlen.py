"""Packed variable-length sequences (issue 18's varlen): three columns on ``problems``.

``varlen`` (off), ``varlen_mean_q`` and ``varlen_mean_k`` (0: not varlen) with server defaults, so
every row written before this revision reads as the dense problem it was; the shape's unique
constraint widens to them (a packed batch is another problem than B padded sequences of the
longest one's length).

Revision ID: 0008_varlen
Revises: 0007_decode
Create Date: 2026-12-01
"""

from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision = "0008_varlen"
down_revision = "0007_decode"
branch_labels = None
depends_on = None

# Written out, not imported: a revision keeps meaning what it meant when it was written.
SHAPE = ["batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v",
         "dtype", "causal", "deterministic", "pass", "window_left", "window_right", "softcap", "sink",
         "kind", "page_size", "seqlen_k_mean"]
VARLEN = ["varlen", "varlen_mean_q", "varlen_mean_k"]
# The tables whose rows hang off problems (ON DELETE CASCADE), parents first.
DEPENDENTS = ("measurements", "verdicts")


@contextmanager
def _problems_rebuilt():
    """batch_alter_table on problems, keeping the rows that reference it (SQLite's table copy
    would delete them through ON DELETE CASCADE; see 0006_features)."""
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for t in DEPENDENTS:
            op.execute(f"CREATE TEMP TABLE _keep_{t} AS SELECT * FROM {t}")
    with op.batch_alter_table("problems") as batch:
        yield batch
    if sqlite:
        for t in DEPENDENTS:
            op.execute(f"DELETE FROM {t}")
            op.execute(f"INSERT INTO {t} SELECT * FROM _keep_{t}")
            op.execute(f"DROP TABLE _keep_{t}")


def upgrade() -> None:
    with _problems_rebuilt() as batch:
        batch.add_column(sa.Column("varlen", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("varlen_mean_q", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("varlen_mean_k", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE + VARLEN)


def downgrade() -> None:
    # Varlen rows have no dense twin: dropped with their measurements (ON DELETE CASCADE).
    problems = sa.table("problems", sa.column("varlen"))
    op.execute(sa.delete(problems).where(problems.c.varlen.is_(True)))
    with _problems_rebuilt() as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        for c in reversed(VARLEN):
            batch.drop_column(c)
