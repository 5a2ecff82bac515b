"""Issue 18's problem features (window, softcap, sink): revision 0006, the store and the REST API."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, text

from fa4.problem import Problem
from store import ResultsStore
from store.migrate import alembic_config, current_revision, head_revision
from tests.service.test_app import AUTH, DEVICE, best, client, post, result, toy  # noqa: F401 (fixtures)

FEATURED = dict(window_left=1023, window_right=0, softcap=30.0, sink=True)


def test_old_database_upgrades_and_its_rows_read_as_plain_problems(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0005_retired_knobs")
        conn.execute(text(
            "INSERT INTO problems (id, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, "
            "causal, deterministic, pass) VALUES (1, 2, 8192, 8192, 16, 16, 128, 128, 'bf16', 1, 0, 'fwd')"))
    engine.dispose()
    plain = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True)
    with ResultsStore.open(url) as store:  # upgrades to head
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
        assert store.get_problem(1) == plain
        assert store.upsert_problem(plain) == 1  # the same row, not a new one
        # The same shape with a feature is another problem (the widened unique constraint).
        featured = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True, **FEATURED)
        pid = store.upsert_problem(featured)
        assert pid != 1
        assert store.get_problem(pid) == featured
        assert store.upsert_problem(featured) == pid


def _rows(conn) -> dict:
    return {t: conn.execute(text(f"SELECT * FROM {t} ORDER BY id")).all() for t in ("problems", "measurements",
                                                                                 "verdicts")}


def test_upgrade_keeps_every_measurement_and_verdict_and_downgrade_drops_only_featured_rows(tmp_path):
    """SQLite rebuilds problems to widen its unique constraint; the rows hanging off it (ON DELETE
    CASCADE) must come through untouched, ids and all."""
    from tests.service.test_migrate_retired import _insert_old_rows

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0003_verdicts")
        _insert_old_rows(conn)
        command.upgrade(alembic_config(conn), "0005_retired_knobs")
        before = _rows(conn)
    engine.dispose()
    assert len(before["measurements"]) > 0 and len(before["verdicts"]) == 1
    with ResultsStore.open(url) as store:  # foreign keys on, as the store always has them
        with store.engine.begin() as conn:
            after = _rows(conn)
            assert after["measurements"] == before["measurements"] and after["verdicts"] == before["verdicts"]
            assert [r[:12] for r in after["problems"]] == [tuple(r) for r in before["problems"]]
            assert all(r[12:16] == (-1, -1, 0.0, False) for r in after["problems"])
            assert all(r[16:19] == ("attention", 0, 0) for r in after["problems"])  # revision 0007's decode
            assert all(r[19:] == (False, 0, 0) for r in after["problems"])  # revision 0008's varlen columns
        pid = store.upsert_problem(Problem(2, 8192, 8192, 16, 16, 128, 128, pass_="bwd", **FEATURED))
        with store.engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0005_retired_knobs")
            down = _rows(conn)
    assert pid not in [r[0] for r in down["problems"]]
    assert down["problems"] == [tuple(r) for r in before["problems"]]
    assert down["measurements"] == before["measurements"] and down["verdicts"] == before["verdicts"]


def test_plain_problem_keys_are_unchanged_and_features_round_trip():
    plain = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True)
    assert plain.key() == "b2_sq8192_sk8192_hq16_hkv16_d128_dv128_bf16_causal_nondet_fwd"
    assert plain.features() == {}
    f = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True, **FEATURED)
    assert f.key() == plain.key() + "_win1023_0_cap30_sink"
    assert Problem.from_dict(f.to_dict()) == f
    assert Problem.from_dict(plain.to_dict()) == plain


def test_featured_problem_round_trips_through_the_rest_api(client, toy, monkeypatch):  # noqa: F811
    monkeypatch.setattr(toy, "features", True)  # the toy runs any problem
    prob = Problem.standard(4096, 128, heads_q=16, causal=True, **FEATURED).to_dict()
    post(client, result(prob=prob, tflops=400.0))
    plain = Problem.standard(4096, 128, heads_q=16, causal=True).to_dict()
    post(client, result(prob=plain, config={"tile_n": 128}, tflops=600.0))
    rows = client.get("/v1/results", params={"device": DEVICE["name"], "softcap": 30.0, "sink": True}).json()["items"]
    assert [r["problem"] for r in rows] == [prob]
    rows = client.get("/v1/results", params={"device": DEVICE["name"], "window_left": -1}).json()["items"]
    assert [r["problem"] for r in rows] == [plain]
    # The best config of the featured problem is its own row, not the plain problem's faster one.
    got = best(client, seqlen_q=4096, causal=True, **FEATURED)
    assert got["config"]["tile_n"] == 64 and got["provenance"] == "exact"
    assert best(client, seqlen_q=4096, causal=True)["config"]["tile_n"] == 128
    r = client.post("/v1/results", json=result(prob={**prob, "softcap": -1.0}), headers=AUTH)
    assert r.status_code == 422


def test_varlen_revision_keeps_rows_and_tells_packed_from_padded(tmp_path):
    # Revision 0008: older rows read as dense problems; a packed batch is its own problem.
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0006_features")
        conn.execute(text(
            "INSERT INTO problems (id, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, "
            "causal, deterministic, pass) VALUES (1, 8, 4096, 4096, 16, 16, 128, 128, 'bf16', 1, 0, 'fwd')"))
    engine.dispose()
    dense = Problem(8, 4096, 4096, 16, 16, 128, 128, causal=True)
    packed = Problem(8, 4096, 4096, 16, 16, 128, 128, causal=True, varlen=True, varlen_mean_q=2048,
                     varlen_mean_k=2048)
    with ResultsStore.open(url) as store:
        assert store.get_problem(1) == dense and store.upsert_problem(dense) == 1
        pid = store.upsert_problem(packed)
        assert pid != 1 and store.get_problem(pid) == packed
    assert dense.key() + "_varlen2048_2048" == packed.key()
    # FLOPs of the packed lengths (fa4.problem.varlen_lengths), each sequence counted dense: less
    # than the padded batch, more than 8 sequences of the mean (the lengths differ).
    lens = packed.varlen_seqlens()[0]
    assert packed.flops == sum(Problem(1, n, n, 16, 16, 128, 128, causal=True).flops for n in lens)
    assert Problem(8, 2048, 2048, 16, 16, 128, 128, causal=True).flops < packed.flops < dense.flops
    engine = create_engine(url)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0006_features")
        assert conn.execute(text("SELECT id FROM problems")).scalars().all() == [1]
    engine.dispose()
