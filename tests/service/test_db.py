"""The results database: migrations, round trips, validation, best-config lookup, concurrency."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fa4.knobs import config_to_dict, json_schema, knob
from fa4.problem import Problem
from store import ResultsStore, default_url, resolve_url
from store import models
from store.migrate import alembic_config, current_revision, head_revision

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ToyKnobs:
    tile_m: int = knob((64, 128, 192), 128, "rows of Q per CTA")
    tile_n: int = knob((64, 128), 128, "rows of K/V per inner step")
    overlap: bool = knob((False, True), True, "overlap softmax with the next GEMM")
    operand: str = knob(("rs", "ss"), "ss", "where the P operand of P@V comes from")


H200 = {
    "name": "NVIDIA H200",
    "compute_capability": "9.0",
    "sm_count": 132,
    "l2_bytes": 60 * 2**20,
    "memory_bytes": 150_754_820_096,
    "driver": "570.124.06",
    "cuda": "12.8",
    "torch": "2.13.0",
    "cutlass_dsl": "4.8.1",
    "provider_versions": {"flash-attn-4": "4.0.0b36", "cudnn": "9.10.2"},
}

PROBLEM = Problem.standard(8192, 128)


def _ok(store, dev, prob, cfg, tflops, **kw):
    """An 'ok' row whose timing is consistent with its TFLOP/s."""
    p = store.get_problem(prob)
    median = p.flops / (tflops * 1e12) * 1e3
    kw.setdefault("samples_ms", [median * 0.99, median, median * 1.01])
    return store.add_measurement(
        dev, prob, cfg, status="ok", median_ms=median, iqr_ms=median * 0.01, tflops=tflops, **kw
    )


# -- schema and migrations -----------------------------------------------------------


def test_fresh_database_migrates_to_head_and_matches_models(db_url):
    with ResultsStore.open(db_url) as store, store.engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        tables = set(inspect(conn).get_table_names())
        assert {"devices", "problems", "configs", "measurements", models.VERSION_TABLE} <= tables
        # Optuna owns "alembic_version" when it shares the file; we must not create it.
        assert "alembic_version" not in tables
        # The hand-written revision and the ORM models describe the same schema.
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": models.VERSION_TABLE})
        assert compare_metadata(ctx, models.Base.metadata) == []
        if conn.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000


def test_reopen_keeps_data_and_downgrade_upgrade_cycle(db_url):
    with ResultsStore.open(db_url) as store:
        pid = store.upsert_problem(PROBLEM)
    with ResultsStore.open(db_url) as store:
        assert store.get_problem(pid) == PROBLEM
        with store.engine.begin() as conn:
            command.downgrade(alembic_config(conn), "base")
        with store.engine.connect() as conn:
            assert not {"devices", "measurements"} & set(inspect(conn).get_table_names())
            assert current_revision(conn) is None
    with ResultsStore.open(db_url) as store:
        assert store.upsert_problem(PROBLEM) == 1


def test_default_url_and_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("FA4_DB", "postgresql+psycopg://tuner:hunter2@db.example:5432/fa4")
    assert default_url() == "postgresql+psycopg://tuner:hunter2@db.example:5432/fa4"
    assert "hunter2" not in resolve_url(None).render_as_string(hide_password=True)

    monkeypatch.delenv("FA4_DB")
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_data_dir", lambda app: str(tmp_path / "ud" / app))
    assert default_url() == f"sqlite:///{tmp_path / 'ud' / 'fa4-tune' / 'results.db'}"
    with ResultsStore.open() as store:
        assert store.url == default_url()
    assert (tmp_path / "ud" / "fa4-tune" / "results.db").is_file()

    # A bare path (what people type after --db) means a SQLite file.
    bare = tmp_path / "x" / "r.db"
    assert str(resolve_url(str(bare))) == f"sqlite:///{bare}"


def test_url_masks_password():
    from store.engine import make_engine

    # Never connects: building an engine is lazy, so no server is needed.
    engine = make_engine(resolve_url("postgresql+psycopg://tuner:hunter2@db.example/fa4"))
    store = ResultsStore(engine)
    assert store.url == "postgresql+psycopg://tuner:***@db.example/fa4"
    assert "hunter2" not in repr(store)
    store.close()


# -- round trips and uniqueness ------------------------------------------------------------


def test_round_trip_every_table(store):
    before = datetime.now(timezone.utc)
    dev = store.upsert_device(H200)
    prob = store.upsert_problem(Problem.standard(4096, 64, causal=True, dtype="fp16", pass_="bwd", heads_kv=8))
    knobs = ToyKnobs(tile_m=192, tile_n=64, overlap=False, operand="rs")
    cfg = store.upsert_config("flash-attn-4", config_to_dict(knobs), ToyKnobs)
    mid = store.add_measurement(
        dev, prob, cfg,
        status="ok", reason=None, samples_ms=[0.51, 0.5, 0.52, 0.49], median_ms=0.505, iqr_ms=0.015,
        tflops=612.5, error=1.2e-3, ref_error=0.9e-3, source_fingerprint="abc123",
        study_name="s1", trial_number=7, is_default=True, versions={"flash-attn-4": "4.0.0b36"},
    )
    after = datetime.now(timezone.utc)

    d = store.get_device(dev)
    assert {k: d[k] for k in H200} == H200
    assert len(d["fingerprint"]) == 64

    assert store.get_problem(prob) == Problem.standard(
        4096, 64, causal=True, dtype="fp16", pass_="bwd", heads_kv=8
    )

    c = store.get_config(cfg)
    assert c["provider"] == "flash-attn-4"
    assert c["config"] == {"tile_m": 192, "tile_n": 64, "overlap": False, "operand": "rs"}
    assert c["knob_schema"] == json_schema(ToyKnobs)

    [row] = store.measurements()
    assert row["id"] == mid
    assert row["device"] == "NVIDIA H200" and row["device_id"] == dev
    assert row["problem"] == store.get_problem(prob).to_dict() and row["problem"]["pass"] == "bwd"
    assert row["provider"] == "flash-attn-4" and row["config"] == c["config"]
    assert row["samples_ms"] == [0.51, 0.5, 0.52, 0.49] and row["n_samples"] == 4
    assert (row["median_ms"], row["iqr_ms"], row["tflops"]) == (0.505, 0.015, 612.5)
    assert (row["error"], row["ref_error"]) == (1.2e-3, 0.9e-3)
    assert (row["source_fingerprint"], row["study_name"], row["trial_number"]) == ("abc123", "s1", 7)
    assert row["is_default"] is True and row["reason"] is None
    assert row["versions"] == {"flash-attn-4": "4.0.0b36"}
    created = datetime.fromisoformat(row["created_at"])
    assert created.utcoffset().total_seconds() == 0
    assert before <= created <= after

    failed = store.add_measurement(
        dev, prob, cfg, status="compile_error", reason="ptxas: too many resources requested"
    )
    row = store.measurements(status="compile_error")[0]
    assert row["id"] == failed and row["reason"] == "ptxas: too many resources requested"
    assert row["samples_ms"] == [] and row["n_samples"] == 0 and row["tflops"] is None

    # Ingested rows keep the time they were measured, normalised to UTC.
    measured = datetime(2026, 3, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    store.add_measurement(dev, prob, cfg, status="infeasible", reason="smem", created_at=measured)
    assert store.measurements(status="infeasible")[0]["created_at"] == "2026-03-01T12:30:00+00:00"


def test_upserts_are_idempotent(store):
    dev = store.upsert_device(H200)
    assert store.upsert_device(dict(H200)) == dev
    assert store.upsert_device({**H200, "compute_capability": (9, 0)}) == dev
    # A driver upgrade can move timings: it is a different measurement context.
    newer = store.upsert_device({**H200, "driver": "575.51.03"})
    assert newer != dev
    assert [d["driver"] for d in store.devices()] == ["570.124.06", "575.51.03"]

    prob = store.upsert_problem(PROBLEM)
    assert store.upsert_problem(Problem.standard(8192, 128)) == prob
    assert store.upsert_problem(PROBLEM.to_dict()) == prob
    assert store.upsert_problem(Problem.standard(8192, 128, causal=True)) != prob

    cfg = store.upsert_config("flash-attn-4", {"tile_m": 64, "tile_n": 128}, ToyKnobs)
    # Key order and omitted defaults do not create new rows.
    assert store.upsert_config(
        "flash-attn-4", {"operand": "ss", "overlap": True, "tile_n": 128, "tile_m": 64}, ToyKnobs
    ) == cfg
    assert store.upsert_config("flash-attn-4", ToyKnobs(tile_m=64), ToyKnobs) == cfg
    assert store.upsert_config("flash-attn-4", {}, ToyKnobs) != cfg
    assert store.upsert_config("other", {"tile_m": 64}, ToyKnobs) != cfg
    plain = store.upsert_config("cudnn", None, None)
    assert store.upsert_config("cudnn", {}, None) == plain
    assert store.get_config(plain)["config"] is None

    with Session(store.engine) as s, s.begin():
        n_problems = s.scalar(text("SELECT count(*) FROM problems"))
        n_configs = s.scalar(text("SELECT count(*) FROM configs"))
    assert (n_problems, n_configs) == (2, 4)


def test_database_enforces_uniqueness_foreign_keys_and_status(store):
    dev = store.upsert_device(H200)
    prob = store.upsert_problem(PROBLEM)
    cfg = store.upsert_config("cudnn", None, None)
    dup = models.Problem(**{k: getattr(PROBLEM, k) for k in (
        "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v",
        "dtype", "causal", "deterministic", "pass_")})
    bad_rows = [
        dup,
        models.Measurement(device_id=dev, problem_id=prob, config_id=cfg + 99, status="ok",
                           samples_ms=[], n_samples=0, source_fingerprint="", is_default=False),
        models.Measurement(device_id=dev, problem_id=prob, config_id=cfg, status="great",
                           samples_ms=[], n_samples=0, source_fingerprint="", is_default=False),
    ]
    for row in bad_rows:
        with pytest.raises(IntegrityError), Session(store.engine) as s, s.begin():
            s.add(row)
    assert store.count() == 0


# -- validation ------------------------------------------------------------------------


def test_config_validation_rejects_bad_knobs_and_writes_nothing(store):
    with pytest.raises(ValueError, match="unknown knob.*tile_k"):
        store.upsert_config("flash-attn-4", {"tile_m": 128, "tile_k": 64}, ToyKnobs)
    with pytest.raises(ValueError, match="tile_m = 96"):
        store.upsert_config("flash-attn-4", {"tile_m": 96}, ToyKnobs)
    with pytest.raises(ValueError, match="operand"):
        store.upsert_config("flash-attn-4", {"operand": True}, ToyKnobs)
    with pytest.raises(ValueError, match="config is required"):
        store.upsert_config("flash-attn-4", None, ToyKnobs)
    with pytest.raises(ValueError, match="provider"):
        store.upsert_config("", {"tile_m": 128}, ToyKnobs)
    with Session(store.engine) as s, s.begin():
        assert s.scalar(text("SELECT count(*) FROM configs")) == 0


def test_measurement_validation_is_all_or_nothing(store):
    dev = store.upsert_device(H200)
    prob = store.upsert_problem(PROBLEM)
    cfg = store.upsert_config("cudnn", None, None)
    with pytest.raises(ValueError, match="status"):
        store.add_measurement(dev, prob, cfg, status="fast")
    with pytest.raises(ValueError, match="needs median_ms and tflops"):
        store.add_measurement(dev, prob, cfg, status="ok", samples_ms=[1.0])
    with pytest.raises(ValueError, match="samples_ms"):
        store.add_measurement(dev, prob, cfg, status="ok", samples_ms=[1.0, math.nan], median_ms=1.0, tflops=1.0)
    with pytest.raises(ValueError, match="no configs row"):
        store.add_measurement(dev, prob, cfg + 1, status="infeasible", reason="smem")
    with pytest.raises(ValueError, match="versions"):
        store.add_measurement(dev, prob, cfg, status="infeasible", versions={"x": object()})
    with pytest.raises(ValueError, match="device info lacks sm_count"):
        store.upsert_device({k: v for k, v in H200.items() if k != "sm_count"})
    with pytest.raises(ValueError, match="unknown device info key"):
        store.upsert_device({**H200, "sm_cuont": 132})
    assert store.count() == 0

    # An output full of NaN has no finite error; the row is kept with NULL error.
    store.add_measurement(dev, prob, cfg, status="incorrect", reason="NaN in output", error=math.nan, ref_error=2e-3)
    [row] = store.measurements()
    assert row["error"] is None and row["ref_error"] == 2e-3 and row["status"] == "incorrect"


# -- lookups ------------------------------------------------------------------------------


def test_best_picks_fastest_ok_row_of_that_device_provider_and_problem(store):
    dev = store.upsert_device(H200)
    other_dev = store.upsert_device({**H200, "name": "NVIDIA H100 80GB HBM3", "sm_count": 132})
    prob = store.upsert_problem(PROBLEM)
    causal = store.upsert_problem(Problem.standard(8192, 128, causal=True))
    configs = [store.upsert_config("flash-attn-4", {"tile_m": t}, ToyKnobs) for t in (64, 128, 192)]
    cudnn = store.upsert_config("cudnn", None, None)

    assert store.best("NVIDIA H200", "flash-attn-4", PROBLEM) is None

    default = _ok(store, dev, prob, configs[1], 410.0, is_default=True, source_fingerprint="v1")
    winner = _ok(store, dev, prob, configs[2], 455.5, source_fingerprint="v1")
    _ok(store, dev, prob, configs[0], 301.0, source_fingerprint="v1")
    # Faster on paper but not a valid result, or not this query's row: all must be ignored.
    store.add_measurement(dev, prob, configs[0], status="incorrect", tflops=990.0, median_ms=0.1, error=0.3)
    store.add_measurement(dev, prob, configs[0], status="runtime_error", reason="illegal address")
    store.add_measurement(dev, prob, configs[0], status="infeasible", reason="smem 240 KiB > 227 KiB")
    _ok(store, dev, prob, cudnn, 700.0)
    _ok(store, dev, causal, configs[0], 800.0)
    _ok(store, other_dev, prob, configs[0], 900.0)
    # Same speed as the winner, measured later: the earlier row stays the answer.
    _ok(store, dev, prob, configs[0], 455.5, source_fingerprint="v2")

    best = store.best("NVIDIA H200", "flash-attn-4", PROBLEM)
    assert best["id"] == winner
    assert best["tflops"] == 455.5 and best["config"] == {"tile_m": 192, "tile_n": 128, "overlap": True, "operand": "ss"}
    assert best["n_samples"] == 3 and best["error"] is None
    assert best["median_ms"] == pytest.approx(PROBLEM.flops / 455.5e12 * 1e3)
    assert best["source_fingerprint"] == "v1" and best["created_at"].endswith("+00:00")
    assert store.best("NVIDIA H200", "flash-attn-4", PROBLEM, source_fingerprint="v2")["tflops"] == 455.5
    assert store.best("NVIDIA H200", "flash-attn-4", PROBLEM, source_fingerprint="v3") is None
    assert store.best("NVIDIA H200", "cudnn", PROBLEM)["tflops"] == 700.0
    assert store.best("NVIDIA H100 80GB HBM3", "flash-attn-4", PROBLEM)["tflops"] == 900.0
    assert store.best("NVIDIA H200", "flash-attn-4", PROBLEM.to_dict())["id"] == winner
    assert store.best("NVIDIA B200", "flash-attn-4", PROBLEM) is None

    d = store.default_result("NVIDIA H200", "flash-attn-4", PROBLEM)
    assert d["id"] == default and d["is_default"] is True and d["config"]["tile_m"] == 128
    assert store.default_result("NVIDIA H200", "cudnn", PROBLEM) is None


def test_measurement_filters_and_paging(store):
    dev = store.upsert_device(H200)
    h100 = store.upsert_device({**H200, "name": "NVIDIA H100"})
    shapes = [Problem.standard(s, hd, causal=c, pass_=p)
              for s in (1024, 8192) for hd in (64, 128) for c in (False, True) for p in ("fwd", "bwd")]
    ids = [store.upsert_problem(p) for p in shapes]
    fa4 = store.upsert_config("flash-attn-4", {}, ToyKnobs)
    cudnn = store.upsert_config("cudnn", None, None)
    expected = []
    for i, (shape, pid) in enumerate(zip(shapes, ids)):
        for d, cfg in ((dev, fa4), (h100, cudnn)):
            status = "ok" if i % 3 else "infeasible"
            if status == "ok":
                _ok(store, d, pid, cfg, 100.0 + i, study_name=f"study{i % 2}", trial_number=i)
            else:
                store.add_measurement(d, pid, cfg, status=status, reason="x", study_name=f"study{i % 2}", trial_number=i)
            expected.append({"device": "NVIDIA H200" if d == dev else "NVIDIA H100",
                             "provider": "flash-attn-4" if cfg == fa4 else "cudnn", "status": status,
                             "study_name": f"study{i % 2}", **shape.to_dict()})

    def want(**f):
        return [i + 1 for i, e in enumerate(expected) if all(e[k] == v for k, v in f.items())]

    for f in ({"device": "NVIDIA H200"}, {"provider": "cudnn", "status": "ok"}, {"head_dim": 64, "causal": True},
              {"pass": "bwd", "study_name": "study1"}, {"status": "infeasible", "device": "NVIDIA H100"},
              {"seqlen_q": 8192, "head_dim": 128, "causal": False, "pass": "fwd"}):
        rows = store.measurements(**f)
        assert [r["id"] for r in rows] == want(**f), f
        assert store.count(**f) == len(rows)
    assert [r["id"] for r in store.measurements(pass_="bwd")] == want(**{"pass": "bwd"})
    assert len(store.measurements(status=["ok", "infeasible"])) == len(expected)
    assert [r["id"] for r in store.measurements(limit=5, offset=3)] == [4, 5, 6, 7, 8]
    assert [r["id"] for r in store.measurements(limit=3, newest_first=True)] == [32, 31, 30]
    with pytest.raises(TypeError, match="unknown measurement filter"):
        store.measurements(gpu="H200")
    with pytest.raises(ValueError, match="status"):
        store.measurements(status="fine")


# -- concurrency ----------------------------------------------------------------------------

_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fa4.problem import Problem
    from store import ResultsStore

    url, role, wid, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    device = {device!r}
    problem = Problem.standard(4096, 128)
    while not go.exists():
        time.sleep(0.002)
    store = ResultsStore.open(url)  # every process races the migration of a fresh file
    if role == "writer":
        dev = store.upsert_device(device)
        prob = store.upsert_problem(problem)
        for i in range(n):
            # Workers share these five configs, so their upserts collide too.
            cfg = store.upsert_config("toy", {{"slot": i % 5}}, None)
            store.add_measurement(dev, prob, cfg, status="ok", samples_ms=[1.0, 1.1], median_ms=1.05,
                                  tflops=1000.0 * wid + i, study_name=f"w{{wid}}", trial_number=i)
            if i % 10 == 0:
                store.best(device["name"], "toy", problem)
    else:
        for _ in range(n):
            store.measurements(study_name="w0", limit=20, newest_first=True)
            store.best(device["name"], "toy", problem)
    store.close()
    """
)


def test_concurrent_writers_and_readers_never_hit_locked_database(db_url, tmp_path):
    writers, per_writer = 4, 50
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(device=H200))
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    roles = [("writer", w) for w in range(writers)] + [("reader", 0)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), db_url, role, str(w), str(per_writer), str(go)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for role, w in roles
    ]
    time.sleep(1.0)  # let every interpreter finish importing before the start signal
    go.touch()
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for (role, w), (rc, err) in zip(roles, results):
        assert "locked" not in err, err
        assert rc == 0, f"{role} {w} failed:\n{err}"

    with ResultsStore.open(db_url) as store:
        assert store.count() == writers * per_writer
        assert len(store.devices()) == 1
        rows = store.measurements()
        assert len({r["config_id"] for r in rows}) == 5
        for w in range(writers):
            trials = sorted(r["trial_number"] for r in rows if r["study_name"] == f"w{w}")
            assert trials == list(range(per_writer))
        best = store.best(H200["name"], "toy", Problem.standard(4096, 128))
        assert best["tflops"] == 1000.0 * (writers - 1) + per_writer - 1


def test_wal_switch_is_retried_while_sqlite_answers_locked():
    """SQLite refuses the switch of a fresh file to WAL at once (no busy wait) while another
    process opening the same new file holds a lock: the connection hook retries it."""
    import sqlite3

    from store.engine import retry_locked

    calls = []

    def statement():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "wal"

    assert retry_locked(statement, timeout_s=5.0, first_delay_s=0.001) == "wal"
    assert len(calls) == 3 and calls[2] - calls[0] >= 0.003  # waited 1 ms, then 2 ms

    def other_error():
        calls.append(0)
        raise sqlite3.OperationalError("no such table: x")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_locked(other_error, timeout_s=5.0)
    assert calls == [0]  # only "locked" is retried

    def always_locked():
        calls.append(time.monotonic())
        raise sqlite3.OperationalError("database is locked")

    calls.clear()
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        retry_locked(always_locked, timeout_s=0.2, first_delay_s=0.01)
    assert 0.1 <= time.monotonic() - t0 <= 1.0 and len(calls) > 2  # gave up at the deadline
