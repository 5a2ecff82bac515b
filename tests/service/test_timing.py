"""Timing modes in the store, the best-config rule, the REST API and the launch-time lookup.

A config picked under eager launches must never be served to a caller under CUDA graphs: every
answer is for one mode and built from that mode's rows only (the nearest-shape rule applies within
the mode); rows from before modes existed read as eager-cold.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
import torch
from alembic import command

import fa4
from fa4 import lookup
from fa4.arch import SM90
from fa4.knobs import config_to_dict
from fa4.problem import Problem
from fa4.timing import DEFAULT_TIMING, TIMINGS
from service.app import create_app
from store import ResultsStore
from store.best import best_config
from store.engine import make_engine, resolve_url
from store.migrate import alembic_config, current_revision, head_revision
from tests.service.live import CountingApp, serve
from tests.service.test_app import AUTH, TOKEN, best, client, post, problem, result, toy  # noqa: F401
from tests.service.test_lookup import DEVICE, P, add_row, env, fp, sources, tuned  # noqa: F401
from tests.service.toy import ToyKnobs, ToyProvider

H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 60 * 2**20,
        "memory_bytes": 150_754_820_096}
PA = Problem.standard(4096, 128, heads_q=16, batch=4)
PB = Problem.standard(8192, 128, heads_q=16, batch=2)


def _row(store, problem, config, tflops, timing=DEFAULT_TIMING, source="toysrc-1"):
    dev = store.upsert_device(H200)
    pid = store.upsert_problem(problem)
    cid = store.upsert_config("toy", config, ToyKnobs)
    return store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=tflops,
                                 source_fingerprint=source, timing=timing)


# -- the migration -----------------------------------------------------------------------------


def test_revision_0004_gives_old_rows_the_default_mode(db_url):
    """A database at 0003 with measurements and a verdict upgrades in place; its rows read as
    eager-cold and answer eager-cold questions only; the downgrade drops the columns again."""
    engine = make_engine(resolve_url(db_url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0003_verdicts")
            t = {name: sa.table(name, *(sa.column(c, typ) for c, typ in cols)) for name, cols in {
                "devices": [("fingerprint", sa.String), ("name", sa.String), ("compute_capability", sa.String),
                            ("sm_count", sa.Integer), ("l2_bytes", sa.BigInteger), ("memory_bytes", sa.BigInteger),
                            ("provider_versions", sa.JSON), ("created_at", sa.DateTime(timezone=True))],
                "problems": [(f, sa.Integer) for f in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv",
                                                       "head_dim", "head_dim_v")]
                + [("dtype", sa.String), ("causal", sa.Boolean), ("deterministic", sa.Boolean), ("pass", sa.String)],
                "configs": [("provider", sa.String), ("config_hash", sa.String), ("config_json", sa.Text),
                            ("config", sa.JSON)],
                "measurements": [("device_id", sa.Integer), ("problem_id", sa.Integer), ("config_id", sa.Integer),
                                 ("status", sa.String), ("samples_ms", sa.JSON), ("n_samples", sa.Integer),
                                 ("median_ms", sa.Float), ("tflops", sa.Float), ("source_fingerprint", sa.String),
                                 ("is_default", sa.Boolean), ("created_at", sa.DateTime(timezone=True)),
                                 ("study_name", sa.String), ("trial_number", sa.Integer)],
                "verdicts": [("device_id", sa.Integer), ("problem_id", sa.Integer), ("provider", sa.String),
                             ("measurement_id", sa.Integer), ("significant", sa.Boolean), ("gain", sa.Float),
                             ("spread", sa.Float), ("rounds", sa.JSON), ("source_fingerprint", sa.String),
                             ("created_at", sa.DateTime(timezone=True)), ("study_name", sa.String)],
            }.items()}
            now = sa.func.now()
            dev = conn.execute(t["devices"].insert().values(
                fingerprint="f" * 64, name=H200["name"], compute_capability="9.0", sm_count=132,
                l2_bytes=H200["l2_bytes"], memory_bytes=H200["memory_bytes"], provider_versions={},
                created_at=now).returning(sa.literal_column("id"))).scalar_one()
            # The columns of revision 0003 (issue 18's feature columns came with 0006).
            old_cols = {c.name for c in t["problems"].columns}
            pid = conn.execute(t["problems"].insert().values(
                **{k: v for k, v in PA.to_dict().items() if k in old_cols}).returning(
                sa.literal_column("id"))).scalar_one()
            cids = [conn.execute(t["configs"].insert().values(
                provider="toy", config_hash=str(i) * 64, config_json="{}", config=cfg).returning(
                sa.literal_column("id"))).scalar_one()
                for i, cfg in enumerate(({"tile_m": 64, "tile_n": 64, "overlap": True},
                                         {"tile_m": 128, "tile_n": 128, "overlap": False}))]
            mids = [conn.execute(t["measurements"].insert().values(
                device_id=dev, problem_id=pid, config_id=cid, status="ok", samples_ms=[1.0], n_samples=1,
                median_ms=1.0, tflops=tf, source_fingerprint="toysrc-1", is_default=False, created_at=now,
                study_name="old", trial_number=i).returning(sa.literal_column("id"))).scalar_one()
                for i, (cid, tf) in enumerate(zip(cids, (500.0, 600.0)))]
            conn.execute(t["verdicts"].insert().values(
                device_id=dev, problem_id=pid, provider="toy", measurement_id=mids[0], significant=False,
                gain=0.01, spread=0.02, rounds={"configs": [], "tflops": [[1.0]]}, source_fingerprint="toysrc-1",
                created_at=now, study_name="old"))
    finally:
        engine.dispose()
    with ResultsStore.open(db_url) as store:  # migrates 0003 -> head
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
        rows = store.measurements()
        assert [r["id"] for r in rows] == mids and {r["timing"] for r in rows} == {"eager-cold"}
        assert store.count(timing="eager-cold") == 2 and store.count(timing="graph-cold") == 0
        v = store.verdict(H200["name"], "toy", PA)
        assert v is not None and v["timing"] == "eager-cold" and v["measurement"]["id"] == mids[0]
        assert store.best(H200["name"], "toy", PA)["id"] == mids[0]  # the verdict's row, as before
        assert store.best(H200["name"], "toy", PA, timing="graph-cold") is None
        ans = best_config(store, ToyProvider(), H200["name"], PA, running_fp="toysrc-1")
        assert ans["provenance"] == "exact" and ans["measurement_id"] == mids[0] and ans["timing"] == "eager-cold"
        ans = best_config(store, ToyProvider(), H200["name"], PA, running_fp="toysrc-1", timing="graph-cold")
        assert ans["provenance"] == "default" and ans["measurement_id"] is None
        with store.engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0003_verdicts")
        with store.engine.connect() as conn:
            assert "timing" not in {c["name"] for c in sa.inspect(conn).get_columns("measurements")}
            assert "timing" not in {c["name"] for c in sa.inspect(conn).get_columns("verdicts")}
            assert conn.execute(sa.text("SELECT count(*) FROM measurements")).scalar() == 2


# -- the best-config rule ------------------------------------------------------------------------


def test_answers_never_cross_modes_and_nearest_stays_within_the_mode(store):
    eager = _row(store, PA, {"tile_m": 64}, 900.0)  # the fastest row of all, but eager
    graph = _row(store, PB, {"tile_m": 128, "tile_n": 128}, 500.0, timing="graph-cold")
    prov = ToyProvider()

    def ask(problem, timing=DEFAULT_TIMING):
        return best_config(store, prov, H200["name"], problem, running_fp="toysrc-1", timing=timing)

    a = ask(PA)
    assert (a["provenance"], a["measurement_id"], a["timing"]) == ("exact", eager, "eager-cold")
    # Graph mode at PA: PA's eager row is not an answer; the nearest graph row (PB) is.
    a = ask(PA, "graph-cold")
    assert (a["provenance"], a["measurement_id"], a["timing"]) == ("nearest", graph, "graph-cold")
    a = ask(PB, "graph-cold")
    assert (a["provenance"], a["measurement_id"]) == ("exact", graph)
    a = ask(PB)  # and the other way round
    assert (a["provenance"], a["measurement_id"]) == ("nearest", eager)
    # A mode nobody measured: the heuristic, and the notes say what was measured instead.
    a = ask(PA, "graph-warm")
    assert a["provenance"] == "default" and a["config"] == config_to_dict(prov.default_config(PA, SM90))
    assert a["measurement_id"] is None and a["timing"] == "graph-warm"
    assert any("no measurements under graph-warm" in n and "eager-cold: 1, graph-cold: 1" in n for n in a["notes"])
    # Store-level reads match too, and a verdict serves a row of its own mode only.
    assert store.best(H200["name"], "toy", PA)["id"] == eager
    assert store.best(H200["name"], "toy", PA, timing="graph-cold") is None
    assert store.default_result(H200["name"], "toy", PB, timing="graph-cold") is None
    dev, pid = store.upsert_device(H200), store.upsert_problem(PB)
    with pytest.raises(ValueError, match="timed graph-cold, not eager-cold"):
        store.add_verdict(dev, pid, "toy", measurement_id=graph, significant=True, gain=0.1, spread=0.01,
                          rounds={}, source_fingerprint="toysrc-1")
    store.add_verdict(dev, pid, "toy", measurement_id=graph, significant=True, gain=0.1, spread=0.01,
                      rounds={"tflops": [[1.0]]}, source_fingerprint="toysrc-1", timing="graph-cold")
    assert store.verdict(H200["name"], "toy", PB) is None
    assert store.verdict(H200["name"], "toy", PB, timing="graph-cold")["measurement"]["id"] == graph
    fam = store.family_rows(H200["name"], "toy", PB)
    assert [r.get("verdict") is not None for r in fam] == [False, True]
    with pytest.raises(ValueError, match="timing must be one of"):
        _row(store, PA, {"tile_m": 64}, 1.0, timing="graph-hot")


# -- the REST API --------------------------------------------------------------------------------


def test_rest_api_ingests_filters_and_answers_by_mode(client):  # noqa: F811
    eager = post(client, result(problem(4096), {"tile_n": 128}, tflops=900.0))["id"]
    body = result(problem(4096), {"tile_m": 64}, tflops=500.0, timing="graph-cold")
    graph = post(client, body)["id"]
    assert post(client, body, expect=200)["created"] is False  # a retry, mode included
    # Without a timing, best answers for the default mode, as before modes existed.
    a = best(client, seqlen_q=4096)
    assert (a["provenance"], a["measurement_id"], a["timing"]) == ("exact", eager, "eager-cold")
    a = best(client, seqlen_q=4096, timing="graph-cold")
    assert (a["provenance"], a["measurement_id"], a["config"]["tile_m"]) == ("exact", graph, 64)
    a = best(client, seqlen_q=4096, timing="graph-warm")
    assert a["provenance"] == "default" and a["measurement_id"] is None
    assert any("no measurements under graph-warm" in n for n in a["notes"]), a["notes"]
    assert best(client, seqlen_q=4096, timing="graph-cold")["measurement_id"] == graph  # the cached answer
    r = client.get("/v1/configs/best", params={"device": "NVIDIA H200", "provider": "toy", "head_dim": 128,
                                               "seqlen_q": 4096, "timing": "graph"})
    assert r.status_code == 422 and "timing" in r.json()["error"]
    page = client.get("/v1/results", params={"timing": "graph-cold"}).json()
    assert page["total"] == 1 and [(i["id"], i["timing"]) for i in page["items"]] == [(graph, "graph-cold")]
    assert {i["timing"] for i in client.get("/v1/results").json()["items"]} == {"eager-cold", "graph-cold"}
    assert client.get("/v1/results", params={"timing": "eager-warm"}).json()["total"] == 0
    # The modes, from the one declaration: the catalogue route and the schema's enums.
    modes = client.get("/v1/timings").json()
    assert [m["name"] for m in modes] == list(TIMINGS) and [m["default"] for m in modes] == [True, False, False, False]
    assert all(m["doc"] and m["launch"] in m["name"] and m["l2"] in m["name"] for m in modes)
    spec = client.get("/openapi.json").json()
    for path in ("/v1/configs/best", "/v1/results"):
        (param,) = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == "timing"]
        schema = param["schema"]
        enum = schema.get("enum") or next(s["enum"] for s in schema["anyOf"] if "enum" in s)
        assert enum == list(TIMINGS), (path, schema)
    assert spec["components"]["schemas"]["ResultIn"]["properties"]["timing"]["default"] == DEFAULT_TIMING


def test_a_study_says_its_mode(client):  # noqa: F811
    post(client, result(problem(4096), study_name="s-graph", trial_number=0, timing="graph-warm"))
    assert client.get("/v1/studies/s-graph").json()["timing"] == "graph-warm"


# -- the launch-time lookup ----------------------------------------------------------------------


def test_a_launch_under_stream_capture_asks_for_graph_mode(env, fp, monkeypatch):  # noqa: F811
    url = f"sqlite:///{env / 'r.db'}"
    with ResultsStore.open(url) as store:
        add_row(store, P, tuned(P, 0), fp, 900.0)  # eager-cold (add_row's default)
        dev, pid = store.upsert_device({"name": DEVICE, "compute_capability": "9.0", "sm_count": 132,
                                        "l2_bytes": 60 * 2**20, "memory_bytes": 150_754_820_096}), store.upsert_problem(P)
        from fa4.sm90.fwd_config import FwdConfigSm90

        cid = store.upsert_config("fa4", config_to_dict(tuned(P, 1)), FwdConfigSm90)
        store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=500.0,
                              source_fingerprint=fp, timing="graph-cold")
    monkeypatch.setenv("FA4_DB", url)
    capturing = {"now": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["now"])

    assert lookup.launch_timing() == "eager-cold"
    assert lookup.resolve_fwd_config(P, SM90) == tuned(P, 0)
    capturing["now"] = True
    assert lookup.launch_timing() == "graph-cold"
    assert lookup.resolve_fwd_config(P, SM90) == tuned(P, 1)  # not the eager answer cached before
    res = fa4.explain(problem=P)
    assert res.timing == "graph-cold" and res.provenance == "local-db" and res.tflops == 500.0
    assert res.steps[0].source == "cache" and "timing: graph-cold" in str(res)
    capturing["now"] = False
    assert lookup.resolve_fwd_config(P, SM90) == tuned(P, 0)  # both answers cached, each under its mode
    assert {k[2] for k in lookup._state.cache} == {"eager-cold", "graph-cold"}
    # FA4_TUNING_TIMING names the mode; under capture its L2 state is kept, the launch becomes graph.
    monkeypatch.setenv(lookup.TIMING_ENV, "eager-warm")
    assert lookup.launch_timing() == "eager-warm"
    capturing["now"] = True
    assert lookup.launch_timing() == "graph-warm"
    res = fa4.explain(problem=P)
    assert res.timing == "graph-warm" and res.provenance == "default" and res.config == lookup.entry_for(
        P, SM90).default_config(P, SM90)
    assert ("local-db", "miss") in sources(res)
    assert "no usable graph-warm measurement" in dict((s.source, s.detail) for s in res.steps)["local-db"]
    # explain() can be asked about any mode, whatever the launch would ask.
    assert fa4.explain(problem=P, timing="eager-cold").config == tuned(P, 0)
    # A value that names no mode: the default mode, and the chain says why.
    monkeypatch.setenv(lookup.TIMING_ENV, "cuda-graphs")
    capturing["now"] = False
    res = fa4.explain(problem=P)
    assert res.timing == "eager-cold" and res.config == tuned(P, 0)
    assert ("timing", "error") in sources(res) and "FA4_TUNING_TIMING='cuda-graphs'" in res.steps[1].detail


def test_a_cpu_torch_never_captures(env, monkeypatch):  # noqa: F811
    # This CPU build raises from is_current_stream_capturing: asked once, then never again.
    calls = []

    def raising():
        calls.append(1)
        raise RuntimeError("Tried to instantiate dummy base class _cuda_isCurrentStreamCapturing")

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", raising)
    assert [lookup.launch_timing() for _ in range(3)] == ["eager-cold"] * 3 and len(calls) == 1


def test_the_service_is_asked_for_the_launch_mode(env, monkeypatch, fp):  # noqa: F811
    app = CountingApp(create_app(f"sqlite:///{env / 'svc.db'}", token=TOKEN))
    capturing = {"now": True}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["now"])
    with serve(app) as base:
        import httpx

        body = {"device": {"name": DEVICE, "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 60 * 2**20,
                           "memory_bytes": 150_754_820_096},
                "provider": "fa4", "problem": P.to_dict(), "config": config_to_dict(tuned(P)), "status": "ok",
                "median_ms": 1.0, "tflops": 640.0, "source_fingerprint": fp, "timing": "graph-cold"}
        r = httpx.post(base + "/v1/results", json=body, headers=AUTH)
        assert r.status_code == 201, r.text
        monkeypatch.setenv("FA4_TUNING_URL", base)
        assert lookup.resolve_fwd_config(P, SM90) == tuned(P)
        res = fa4.explain(problem=P)
        assert res.provenance == "service:exact" and res.timing == "graph-cold"
        capturing["now"] = False  # an eager launch of the same problem: its own question, no eager row
        res = fa4.explain(problem=P)
        assert res.provenance == "default" and res.timing == "eager-cold"
        assert "no eager-cold measurement" in dict((s.source, s.detail) for s in res.steps)["service"]
        assert app.calls["/v1/configs/best"] == 2
