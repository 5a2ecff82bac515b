"""Fleet mode for decode: the launch-time lookup asks the tuning service (GET /v1/configs/best-decode,
a real uvicorn server of service.app) for the decode configs the local results DB lacks, under the
attention lookup's rules, and fa4.flash_attn_with_kvcache (kernels faked on CPU) runs what it serves."""

from __future__ import annotations

import dataclasses
import math
import time

import httpx
import pytest

import fa4
from fa4 import lookup
from fa4.arch import SM90
from fa4.decode_problem import DecodeProblem
from fa4.fingerprint import source_fingerprint
from fa4.knobs import config_to_dict
from fa4.sm90 import decode_config
from service.app import create_app
from store import ResultsStore
from tests.fa4.test_decode_host import fake  # noqa: F401 (fixture: the decode kernels' CPU model)
from tests.service.live import CountingApp, serve, silent_server
from tests.service.test_lookup import DEVICE_INFO, TOKEN, env, sources  # noqa: F401 (env: a fixture)

# Every test: the device named, a fresh lookup state, no service or local DB unless it sets one.
pytestmark = pytest.mark.usefixtures("env")

DP = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128, page_size=256)
PATH = "/v1/configs/best-decode"


def tuned(n: int, problem: DecodeProblem = DP) -> decode_config.DecodeConfigSm90:
    cfg = dataclasses.replace(decode_config.default_config(problem, SM90), num_splits=n)
    assert not decode_config.violations(cfg, problem, SM90)
    return cfg


def post_decode(base: str, problem: DecodeProblem, config, tbps: float, fp: str) -> None:
    body = {"device": DEVICE_INFO, "provider": "fa4-decode", "problem": problem.to_dict(),
            "config": config_to_dict(config), "status": "ok", "median_ms": 0.026, "tflops": tbps,
            "source_fingerprint": fp}
    r = httpx.post(base + "/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 201, r.text


@pytest.fixture
def fp() -> str:
    return source_fingerprint()


def test_service_serves_decode_misses_once_per_problem(tmp_path, fp, monkeypatch):
    app = CountingApp(create_app(f"sqlite:///{tmp_path / 'svc.db'}", token=TOKEN))
    with serve(app) as base:
        post_decode(base, DP, tuned(8), 1.29, fp)
        post_decode(base, dataclasses.replace(DP, batch=4), tuned(16), 2.0, "older-src")  # stale: not served
        monkeypatch.setenv(lookup.URL_ENV, base)

        assert lookup.resolve_decode_config(DP, SM90) == tuned(8)
        for _ in range(50):
            assert lookup.resolve_decode_config(DP, SM90) == tuned(8)
        assert app.calls[PATH] == 1 and "/v1/configs/best" not in app.calls
        res = fa4.explain_decode(problem=DP)
        assert res.provenance == "service:exact" and res.tflops == 1.29
        assert res.steps[0] == lookup.Step("cache", "used", "resolved earlier in this process from service:exact")
        service = [s for s in res.steps if s.source == "service"]
        assert [s.outcome for s in service] == ["used"] and f"exact eager-cold answer of {base}" in service[0].detail
        assert ("local-db", "skipped") in sources(res)  # no local results DB here

        # A stale row and an unmeasured shape: the service says default, the heuristic runs.
        for other in (dataclasses.replace(DP, batch=4), dataclasses.replace(DP, page_size=64)):
            res = fa4.explain_decode(problem=other)
            assert res.provenance == "default" and ("service", "miss") in sources(res), other
            assert res.config == decode_config.default_config(other, SM90)
        assert app.calls[PATH] == 3
        # Even with the cache dropped, a problem is never sent twice.
        lookup._state.cache.clear()
        res = fa4.explain_decode(problem=dataclasses.replace(DP, batch=4))
        assert "already asked" in [s.detail for s in res.steps if s.source == "service"][0]
        assert app.calls[PATH] == 3
        # A CUDA-graph caller asks for its own mode's rows: none here.
        res = fa4.explain_decode(problem=DP, timing="graph-warm")
        assert res.provenance == "default" and "graph-warm" in [s.detail for s in res.steps
                                                               if s.source == "service"][0]


def test_the_local_db_answers_first(tmp_path, fp, monkeypatch):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with ResultsStore.open(url) as store:
        dev, pid = store.upsert_device(DEVICE_INFO), store.upsert_problem(DP)
        cid = store.upsert_config("fa4-decode", config_to_dict(tuned(4)), decode_config.DecodeConfigSm90)
        store.add_measurement(dev, pid, cid, status="ok", samples_ms=[0.03], median_ms=0.03, tflops=1.1,
                              source_fingerprint=fp)
    monkeypatch.setenv("FA4_DB", url)
    app = CountingApp(create_app(f"sqlite:///{tmp_path / 'svc.db'}", token=TOKEN))
    with serve(app) as base:
        post_decode(base, DP, tuned(8), 1.29, fp)
        monkeypatch.setenv(lookup.URL_ENV, base)
        res = fa4.explain_decode(problem=DP)
        assert res.provenance == "local-db" and res.config == tuned(4) and PATH not in app.calls
        # A shape the local DB lacks goes on to the service.
        other = dataclasses.replace(DP, batch=2)
        post_decode(base, other, tuned(4, other), 1.5, fp)
        res = fa4.explain_decode(problem=other)
        assert res.provenance == "service:exact" and ("local-db", "miss") in sources(res)
        assert app.calls[PATH] == 1


def test_flash_attn_with_kvcache_runs_the_served_split_count(tmp_path, fp, fake, monkeypatch):  # noqa: F811
    """The decode plan of a call without config= resolves once through the service: the faked kernels
    launch the 8 splits it serves and the combined output matches the fp32 reference."""
    from fa4 import decode as fa4_decode
    from tests.fa4 import decode_ref

    app = CountingApp(create_app(f"sqlite:///{tmp_path / 'svc.db'}", token=TOKEN))
    with serve(app) as base:
        post_decode(base, DP, tuned(8), 1.29, fp)
        monkeypatch.setenv(lookup.URL_ENV, base)
        q, k, v, seqlens, table = decode_ref.make_case(1, 1, 32, 8, 128, [8192], 256, spare_pages=0)
        for _ in range(3):
            out, lse = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table,
                                                   return_lse=True)
        assert app.calls[PATH] == 1
    (plan,) = fa4_decode._plans.values()
    assert plan.num_splits == 8 and plan.config == tuned(8)
    assert [launch[1] for launch in fake.launches if launch[0] == "decode"] == [8, 8, 8]
    ok, info = decode_ref.errors(out, lse, q, k, v, [8192], table, False, 1 / math.sqrt(128))
    assert ok, info
    # fa4.explain_decode names the service (the plan's answer, cached in this process).
    why = fa4.explain_decode(problem=DP)
    assert why.config == tuned(8) and "service:exact" in str(why)


def test_service_down_pauses_and_a_hung_service_times_out(monkeypatch):
    monkeypatch.setenv(lookup.TIMEOUT_ENV, "0.3")
    with silent_server() as base:
        monkeypatch.setenv(lookup.URL_ENV, base)
        t0 = time.perf_counter()
        res = fa4.explain_decode(problem=DP)
        assert time.perf_counter() - t0 < 2.0
        assert res.provenance == "default" and ("service", "error") in sources(res)
        assert "Timeout" in [s.detail for s in res.steps if s.source == "service"][0]
        # Within the pause another decode problem does not try.
        res = fa4.explain_decode(problem=dataclasses.replace(DP, batch=2))
        assert ("service", "skipped") in sources(res)
        assert "retried after 60 s" in [s.detail for s in res.steps if s.source == "service"][0]


def test_an_unusable_answer_is_refused(monkeypatch):
    """A service of another version may serve what the running knob rules reject: the client checks
    DecodeConfigSm90 and its violations itself, and the heuristic runs instead."""
    from fastapi import FastAPI

    p64 = dataclasses.replace(DP, page_size=64)
    answers = {64: {**config_to_dict(tuned(8, p64)), "tile_n": 128}, 256: {"num_splits": 8, "no_such_knob": 1}}
    stub = FastAPI()

    @stub.get(PATH)
    def best(page_size: int):
        return {"provenance": "exact", "stale": False, "config": answers[page_size], "tflops": 9.9,
                "measurement_id": 1, "measured_problem": None}

    with serve(stub) as base:
        monkeypatch.setenv(lookup.URL_ENV, base)
        res = fa4.explain_decode(problem=p64)
        assert res.provenance == "default" and res.config == decode_config.default_config(p64, SM90)
        detail = [s.detail for s in res.steps if s.source == "service"][0]
        assert ("service", "error") in sources(res) and "tile_n" in detail
        res = fa4.explain_decode(problem=DP)
        assert res.provenance == "default" and "no_such_knob" in [s.detail for s in res.steps
                                                                   if s.source == "service"][0]


def test_a_pushed_decode_study_reaches_another_hosts_launches(tmp_path, monkeypatch):
    """Fleet mode end to end: a decode study tuned on one host (the split sweep recorded on the H200,
    replayed) is pushed to the service (fa4-tune --decode --push), and a launch on another host, with
    no local results DB, gets its 8 splits from the service."""
    from tests.tuner.test_decode_tuning import SPEC
    from tuner.push import push_results
    from tuner.study import Tuner
    from tuner.worker import InProcessRunner

    prob = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128, page_size=256)
    with ResultsStore.open(f"sqlite:///{tmp_path / 'tuner.db'}") as store:
        res = Tuner(SPEC, prob, store=store, trials=12, runner=InProcessRunner(), verify_rounds=3).run()
        assert res.best["config"]["num_splits"] == 8
        device = store.devices()[0]["name"]
        app = CountingApp(create_app(f"sqlite:///{tmp_path / 'central.db'}", token=TOKEN))
        with serve(app) as base:
            report = push_results(store, [res.study_name], base, TOKEN)
            assert report["failed"] == 0 and report["created"] == res.measured, report
            monkeypatch.setenv(lookup.DEVICE_ENV, device)
            monkeypatch.setenv(lookup.URL_ENV, base)
            why = fa4.explain_decode(problem=prob)
    assert why.provenance == "service:exact", str(why)
    assert why.config.num_splits == 8 and why.tflops == 1.291
    assert app.calls[PATH] == 1
