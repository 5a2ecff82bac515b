"""Initial schema: devices, problems, configs, measurements.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

_STATUSES = ("ok", "infeasible", "compile_error", "runtime_error", "incorrect")


def _json():
    return sa.JSON(none_as_null=True)


def _when():
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("compute_capability", sa.String(16), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("l2_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("driver", sa.String(64), nullable=True),
        sa.Column("cuda", sa.String(64), nullable=True),
        sa.Column("torch", sa.String(64), nullable=True),
        sa.Column("cutlass_dsl", sa.String(64), nullable=True),
        sa.Column("provider_versions", _json(), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("fingerprint", name="uq_devices_fingerprint"),
    )
    op.create_index("ix_devices_name", "devices", ["name"])

    op.create_table(
        "problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("seqlen_q", sa.Integer(), nullable=False),
        sa.Column("seqlen_k", sa.Integer(), nullable=False),
        sa.Column("heads_q", sa.Integer(), nullable=False),
        sa.Column("heads_kv", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("head_dim_v", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("deterministic", sa.Boolean(), nullable=False),
        sa.Column("pass", sa.String(8), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_problems"),
        sa.UniqueConstraint(
            "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v",
            "dtype", "causal", "deterministic", "pass",
            name="uq_problems_shape",
        ),
    )
    op.create_index(
        "ix_problems_family", "problems", ["head_dim", "pass", "dtype", "causal", "deterministic"]
    )

    op.create_table(
        "configs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("config", _json(), nullable=True),
        sa.Column("knob_schema", _json(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_configs"),
        sa.UniqueConstraint("provider", "config_hash", name="uq_configs_provider_config_hash"),
    )
    op.create_index("ix_configs_provider", "configs", ["provider"])

    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("samples_ms", _json(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("iqr_ms", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("error", sa.Float(), nullable=True),
        sa.Column("ref_error", sa.Float(), nullable=True),
        sa.Column("source_fingerprint", sa.String(128), nullable=False),
        sa.Column("study_name", sa.String(255), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("versions", _json(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_measurements"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name="fk_measurements_device_id_devices", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problems.id"], name="fk_measurements_problem_id_problems", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["config_id"], ["configs.id"], name="fk_measurements_config_id_configs", ondelete="CASCADE"
        ),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in _STATUSES) + ")",
            name="ck_measurements_status",
        ),
    )
    op.create_index("ix_measurements_device_id", "measurements", ["device_id"])
    op.create_index("ix_measurements_config_id", "measurements", ["config_id"])
    op.create_index("ix_measurements_created_at", "measurements", ["created_at"])
    op.create_index(
        "ix_measurements_lookup", "measurements", ["problem_id", "device_id", "status", "tflops"]
    )
    op.create_index("ix_measurements_study", "measurements", ["study_name", "trial_number"])


def downgrade() -> None:
    op.drop_table("measurements")
    op.drop_table("configs")
    op.drop_table("problems")
    op.drop_table("devices")
