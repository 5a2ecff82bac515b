"""ORM models of the results database.

The schema is owned by the Alembic revisions in ``migrations/``; these classes
describe the same tables for queries. ``tests/service/test_db.py`` checks that
the two never drift apart.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.sql.expression import false as sa_false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.schema import conv

from fa4.timing import DEFAULT_TIMING, MAX_LEN as TIMING_LEN

STATUSES = ("ok", "infeasible", "compile_error", "runtime_error", "incorrect")

# Deterministic constraint names: Alembic needs them to alter or drop constraints
# later, and PostgreSQL and SQLite would otherwise name them differently.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Optuna keeps its own Alembic history in "alembic_version"; the tuner may put its
# study storage in the same file, so ours lives under another name.
VERSION_TABLE = "fa4_alembic_version"

# JSON columns: a Python None must become SQL NULL, not the JSON literal 'null'.
JSONValue = JSON(none_as_null=True)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Device(Base):
    """One GPU together with the software stack it was measured under.

    A driver or library upgrade can change timings, so it yields a new row; the
    fingerprint covers every descriptive column.
    """

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(255), index=True)
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int] = mapped_column(Integer)
    l2_bytes: Mapped[int] = mapped_column(BigInteger)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    driver: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(64))
    torch: Mapped[str | None] = mapped_column(String(64))
    cutlass_dsl: Mapped[str | None] = mapped_column(String(64))
    provider_versions: Mapped[dict] = mapped_column(JSONValue)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Problem(Base):
    """An attention shape (``fa4.problem.Problem`` field for field) or a decode shape (``kind``)."""

    __tablename__ = "problems"
    __table_args__ = (
        UniqueConstraint(
            "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v",
            "dtype", "causal", "deterministic", "pass", "window_left", "window_right", "softcap", "sink",
            "kind", "page_size", "seqlen_k_mean", "varlen", "varlen_mean_q", "varlen_mean_k",
            # Spelled out: the conventional name would exceed PostgreSQL's 63 characters.
            name=conv("uq_problems_shape"),
        ),
        # The service's nearest-shape lookup narrows on these before ranking by seqlen.
        Index("ix_problems_family", "head_dim", "pass", "dtype", "causal", "deterministic"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch: Mapped[int] = mapped_column(Integer)
    seqlen_q: Mapped[int] = mapped_column(Integer)
    seqlen_k: Mapped[int] = mapped_column(Integer)
    heads_q: Mapped[int] = mapped_column(Integer)
    heads_kv: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    head_dim_v: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(8))
    causal: Mapped[bool] = mapped_column(Boolean)
    deterministic: Mapped[bool] = mapped_column(Boolean)
    pass_: Mapped[str] = mapped_column("pass", String(8))
    # Issue 18's features (revision 0006_features): the server defaults make every older row the
    # plain problem it was.
    window_left: Mapped[int] = mapped_column(Integer, server_default="-1")
    window_right: Mapped[int] = mapped_column(Integer, server_default="-1")
    softcap: Mapped[float] = mapped_column(Float, server_default="0")
    sink: Mapped[bool] = mapped_column(Boolean, server_default=sa_false())
    # Issue 19's decode problems (revision 0007_decode): "attention" rows mirror fa4.problem.Problem,
    # "decode" rows fa4.decode_problem.DecodeProblem (its paging fields here, the attention-only
    # fields at their defaults).
    kind: Mapped[str] = mapped_column(String(16), server_default="attention")
    page_size: Mapped[int] = mapped_column(Integer, server_default="0")
    seqlen_k_mean: Mapped[int] = mapped_column(Integer, server_default="0")
    # Packed variable-length sequences (revision 0008_varlen), off for every older row.
    varlen: Mapped[bool] = mapped_column(Boolean, server_default=sa_false())
    varlen_mean_q: Mapped[int] = mapped_column(Integer, server_default="0")
    varlen_mean_k: Mapped[int] = mapped_column(Integer, server_default="0")


class Config(Base):
    """A knob setting of one provider, stored as canonical JSON (sorted keys).

    Uniqueness is on a hash of the canonical text so the constraint stays a short
    fixed-width key on every backend. ``config`` is NULL for providers without
    knobs; ``knob_schema`` is the JSON schema of the knob dataclass at the time,
    so old rows stay readable after the dataclass changes.
    """

    __tablename__ = "configs"
    __table_args__ = (UniqueConstraint("provider", "config_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    provider: Mapped[str] = mapped_column(String(64), index=True)
    config_hash: Mapped[str] = mapped_column(String(64))
    config_json: Mapped[str] = mapped_column(Text)
    config: Mapped[dict | None] = mapped_column(JSONValue, nullable=True)
    knob_schema: Mapped[dict | None] = mapped_column(JSONValue, nullable=True)


class Measurement(Base):
    """One benchmarked (or rejected) candidate: a config of a provider on a problem and device."""

    __tablename__ = "measurements"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name="status"
        ),
        # best()/default_result(): all rows of one (problem, device), filtered by status.
        Index("ix_measurements_lookup", "problem_id", "device_id", "status", "tflops"),
        Index("ix_measurements_study", "study_name", "trial_number"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"))
    config_id: Mapped[int] = mapped_column(ForeignKey("configs.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text)
    samples_ms: Mapped[list] = mapped_column(JSONValue)
    n_samples: Mapped[int] = mapped_column(Integer, default=0)
    median_ms: Mapped[float | None] = mapped_column(Float)
    iqr_ms: Mapped[float | None] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    # Relative error against the fp32 reference, and PyTorch's own same-dtype error
    # on the same inputs (the correctness gate compares the two).
    error: Mapped[float | None] = mapped_column(Float)
    ref_error: Mapped[float | None] = mapped_column(Float)
    source_fingerprint: Mapped[str] = mapped_column(String(128), default="")
    study_name: Mapped[str | None] = mapped_column(String(255))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    versions: Mapped[dict | None] = mapped_column(JSONValue, nullable=True)
    # Set by rows ingested over the REST API (revision 0002): a retried POST finds
    # its first copy here instead of inserting a duplicate.
    idempotency_key: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True, unique=True)
    # How it was timed (fa4.timing, revision 0004): "eager-cold" (rows from before the revision),
    # "graph-cold", ... A lookup for one mode is only ever answered from rows of that mode.
    timing: Mapped[str] = mapped_column(String(TIMING_LEN), default=DEFAULT_TIMING, server_default=DEFAULT_TIMING)

    device: Mapped[Device] = relationship(lazy="joined")
    problem: Mapped[Problem] = relationship(lazy="joined")
    config: Mapped[Config] = relationship(lazy="joined")


class Verdict(Base):
    """The outcome of re-measuring a study's top configs against the default, interleaved in one
    process over several rounds (tuner/verify.py): which config a lookup serves for the problem.

    A study's best trial can be a noise winner (the same config moves 3-5% run to run on the
    H200); a challenger is served only when its gain over the default beats the spread of the
    rounds. ``measurement_id`` is the study's row of the served config, which lookups return.
    """

    __tablename__ = "verdicts"
    __table_args__ = (Index("ix_verdicts_lookup", "problem_id", "device_id", "provider"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"))
    provider: Mapped[str] = mapped_column(String(64))
    study_name: Mapped[str | None] = mapped_column(String(255))
    measurement_id: Mapped[int] = mapped_column(ForeignKey("measurements.id", ondelete="CASCADE"))
    significant: Mapped[bool] = mapped_column(Boolean)  # False: the default stays
    gain: Mapped[float] = mapped_column(Float)  # median over rounds of challenger/default - 1
    spread: Mapped[float] = mapped_column(Float)  # half the range of those per-round ratios
    # {"configs": [config dicts; the default first], "tflops": [[per config] per round],
    #  "order": [[config indices in the order measured] per round]}
    rounds: Mapped[dict] = mapped_column(JSONValue)
    source_fingerprint: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    # The timing mode of the re-measurement, and of the row it serves (revision 0004).
    timing: Mapped[str] = mapped_column(String(TIMING_LEN), default=DEFAULT_TIMING, server_default=DEFAULT_TIMING)

    measurement: Mapped[Measurement] = relationship(lazy="joined")
