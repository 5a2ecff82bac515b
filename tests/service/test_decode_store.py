"""Issue 19's decode problems in the store: revision 0007, rows kept, decode and attention apart."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, text

from fa4.decode_problem import DecodeProblem
from fa4.problem import Problem
from store import ResultsStore
from store.migrate import alembic_config, current_revision, head_revision

DECODE = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128, page_size=256)
DEVICE = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 50 << 20,
          "memory_bytes": 141 << 30}


def _rows(conn) -> dict:
    return {t: conn.execute(text(f"SELECT * FROM {t} ORDER BY id")).all()
            for t in ("problems", "measurements", "verdicts")}


def test_old_database_with_rows_upgrades_and_keeps_every_row(tmp_path):
    from tests.service.test_migrate_retired import _insert_old_rows

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0003_verdicts")
        _insert_old_rows(conn)
        command.upgrade(alembic_config(conn), "0006_features")
        before = _rows(conn)
    engine.dispose()
    assert len(before["measurements"]) > 0 and len(before["verdicts"]) == 1
    with ResultsStore.open(url) as store:  # upgrades to head, foreign keys on
        with store.engine.begin() as conn:
            assert current_revision(conn) == head_revision()
            after = _rows(conn)
        assert after["measurements"] == before["measurements"] and after["verdicts"] == before["verdicts"]
        assert [r[:16] for r in after["problems"]] == [tuple(r) for r in before["problems"]]
        assert all(r[16:19] == ("attention", 0, 0) for r in after["problems"])  # 0007_decode's columns
        assert all(r[19:] == (False, 0, 0) for r in after["problems"])  # then 0008_varlen's
        old = store.get_problem(before["problems"][0][0])
        assert isinstance(old, Problem)
        assert store.upsert_problem(old) == before["problems"][0][0]  # the same row, not a new one
        pid = store.upsert_problem(DECODE)
        assert pid not in [r[0] for r in before["problems"]]
        with store.engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0006_features")
            down = _rows(conn)
    assert pid not in [r[0] for r in down["problems"]]
    assert down["problems"] == [tuple(r) for r in before["problems"]]
    assert down["measurements"] == before["measurements"] and down["verdicts"] == before["verdicts"]


def test_decode_problems_round_trip_and_never_join_an_attention_family(tmp_path):
    with ResultsStore.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        dev = store.upsert_device(DEVICE)
        pid = store.upsert_problem(DECODE)
        assert store.upsert_problem(DECODE) == pid
        assert store.upsert_problem(DECODE.to_dict()) == pid
        assert store.get_problem(pid) == DECODE
        # The attention problem with the same shape columns is another row.
        twin = Problem(1, 1, 8192, 32, 8, 128, 128)
        tid = store.upsert_problem(twin)
        assert tid != pid and store.get_problem(tid) == twin
        other = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128, page_size=64)
        assert store.upsert_problem(other) not in (pid, tid)
        cid = store.upsert_config("fa4-decode", {"num_splits": 8})
        store.add_measurement(dev, pid, cid, status="ok", samples_ms=[0.01], median_ms=0.01, tflops=1.29)
        cid2 = store.upsert_config("fa4-decode", {"num_splits": 16})
        store.add_measurement(dev, pid, cid2, status="ok", samples_ms=[0.011], median_ms=0.011, tflops=1.25)
        best = store.best(DEVICE["name"], "fa4-decode", DECODE)
        assert best["config"] == {"num_splits": 8}
        assert best["problem"] == DECODE.to_dict()
        assert store.best(DEVICE["name"], "fa4-decode", other) is None
        assert store.best(DEVICE["name"], "fa4-decode", twin) is None
        assert store.family_rows(DEVICE["name"], "fa4-decode", twin) == []
        assert [r["id"] for r in store.measurements(kind="decode")] == [best["id"], best["id"] + 1]
