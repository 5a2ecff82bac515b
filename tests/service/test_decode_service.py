"""Issue 19's decode configs served by the tuning service: GET /v1/configs/best-decode (its query
generated from DecodeProblem, the answer built by the one rule and cache of GET /v1/configs/best)
and decode results posted to POST /v1/results."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from fa4.arch import SM90
from fa4.decode_problem import DecodeProblem
from fa4.knobs import config_to_dict
from fa4.sm90 import decode_config
from fa4.sm90.decode_config import DecodeConfigSm90
from providers import get_provider
from service.app import create_app
from store import ResultsStore
from tests.service.test_app import AUTH, DEVICE, TOKEN, assert_error, post

DP = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128, page_size=256)
# Pages of 64 keys take no 128-key tile (decode_config.violations).
DP64 = dataclasses.replace(DP, page_size=64)
PATH = "/v1/configs/best-decode"
FP = "decode-src-1"


def splits(n: int, problem: DecodeProblem = DP) -> dict:
    """A feasible config of ``problem`` with ``n`` KV splits (not the heuristic's 0: a hit is visible)."""
    cfg = dataclasses.replace(decode_config.default_config(problem, SM90), num_splits=n)
    assert not decode_config.violations(cfg, problem, SM90)
    return config_to_dict(cfg)


def decode_result(problem: DecodeProblem = DP, config=None, tbps: float = 1.2, fp: str = FP, **kw) -> dict:
    body = {"device": DEVICE, "provider": "fa4-decode", "problem": problem.to_dict(),
            "config": splits(8, problem) if config is None else config, "status": "ok",
            "samples_ms": [0.026, 0.027], "median_ms": 0.026, "iqr_ms": 0.001, "tflops": tbps,
            "error": 1e-3, "ref_error": 2e-3, "source_fingerprint": fp}
    body.update(kw)
    return body


def best_decode(client, problem: DecodeProblem = DP, expect: int = 200, **params) -> dict:
    query = {**dataclasses.asdict(problem), "device": DEVICE["name"], "source_fingerprint": FP, **params}
    r = client.get(PATH, params={k: v for k, v in query.items() if v is not None})
    assert r.status_code == expect, r.text
    return r.json()


@pytest.fixture
def client(db_url):
    with TestClient(create_app(db_url, token=TOKEN)) as c:
        yield c


# -- the contract ------------------------------------------------------------------------


def test_every_decode_problem_field_is_a_query_parameter_and_the_answer_is_best_config(client):
    spec = client.get("/openapi.json").json()
    op = spec["paths"][PATH]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    fields = dataclasses.fields(DecodeProblem)
    assert {f.name for f in fields} <= set(params)
    assert set(params) - {f.name for f in fields} == {"device", "provider", "source_fingerprint", "arch", "timing"}
    for f in fields:  # required exactly where the dataclass has no default
        assert params[f.name]["in"] == "query"
        assert params[f.name].get("required", False) is (f.default is dataclasses.MISSING), f.name
    assert params["provider"]["schema"]["default"] == "fa4-decode"
    ok = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/BestConfig"}
    # A posted result's problem is an attention problem or a decode one, as store rows are.
    assert "DecodeProblemIn" in spec["components"]["schemas"]
    decode_in = spec["components"]["schemas"]["DecodeProblemIn"]["properties"]
    assert set(decode_in) == {"kind"} | {f.name for f in fields}


def test_exact_hit_serves_the_fastest_current_row(client):
    assert post(client, decode_result(config=splits(8), tbps=1.29))["created"]
    post(client, decode_result(config=splits(16), tbps=1.25))
    post(client, decode_result(config=splits(32), tbps=3.0, fp="older-src"))  # faster, but other source
    b = best_decode(client)
    assert b["provenance"] == "exact" and b["stale"] is False and b["distance"] == 0.0
    assert b["config"] == splits(8) and b["tflops"] == 1.29 and b["provider"] == "fa4-decode"
    assert b["problem"] == b["measured_problem"] == DP.to_dict()
    assert b["source_fingerprint"] == b["running_fingerprint"] == FP
    assert b["timing"] == "eager-cold" and b["n_samples"] == 2 and b["device_versions"]["driver"] == DEVICE["driver"]
    # The same answer the local results DB gives a launch (store/config_source): one rule.
    from fa4.rules import Fa4DecodeRules
    from store.best import best_config

    with ResultsStore.open(client.app.state.fa4.settings.db_url) as store:
        local = best_config(store, Fa4DecodeRules(), DEVICE["name"], DP, running_fp=FP)
    assert {k: local[k] for k in ("provenance", "config", "measurement_id")} == \
        {k: b[k] for k in ("provenance", "config", "measurement_id")}


def test_without_a_caller_fingerprint_the_services_own_judges(client):
    own = get_provider("fa4-decode").source_fingerprint()
    post(client, decode_result(config=splits(4), tbps=1.1, fp=own))
    b = best_decode(client, source_fingerprint=None)
    assert b["provenance"] == "exact" and b["config"] == splits(4) and b["running_fingerprint"] == own


def test_a_stale_source_is_never_served_for_decode(client):
    mid = post(client, decode_result(config=splits(8), fp="older-src"))["id"]
    b = best_decode(client)
    assert b["provenance"] == "default" and b["stale"] is False and b["measurement_id"] is None
    assert b["config"] == config_to_dict(decode_config.default_config(DP, SM90))
    notes = " ".join(b["notes"])
    assert f"measurement {mid}" in notes and "'older-src'" in notes and "stale" in notes
    assert "exact shape only" in notes


def test_a_miss_is_the_default_with_notes(client):
    b = best_decode(client)
    assert b["provenance"] == "default" and b["config"] == config_to_dict(decode_config.default_config(DP, SM90))
    assert b["config"]["num_splits"] == 0 and b["tflops"] is None
    assert any("not in the database" in n for n in b["notes"])
    post(client, decode_result())
    # Another batch, another page size, the attention problem of the same shape: none answer.
    for other in (dataclasses.replace(DP, batch=2), dataclasses.replace(DP, page_size=128),
                  dataclasses.replace(DP, seqlen_k_mean=4096)):
        b = best_decode(client, other)
        assert b["provenance"] == "default" and b["problem"] == other.to_dict(), other
        assert any("heuristic default" in n for n in b["notes"])
    att = client.get("/v1/configs/best", params={"device": DEVICE["name"], "seqlen_q": 1, "seqlen_k": 8192,
                                                 "batch": 1, "heads_q": 32, "heads_kv": 8, "head_dim": 128})
    assert att.status_code == 200 and att.json()["provenance"] == "default"


def test_only_the_asked_timing_mode_answers(client):
    post(client, decode_result())
    b = best_decode(client, timing="graph-warm")
    assert b["provenance"] == "default" and b["timing"] == "graph-warm"
    assert any("eager-cold: 1" in n for n in b["notes"])
    post(client, decode_result(config=splits(16), tbps=1.4, timing="graph-warm"))
    b = best_decode(client, timing="graph-warm")
    assert b["provenance"] == "exact" and b["config"] == splits(16) and b["timing"] == "graph-warm"
    assert best_decode(client)["config"] == splits(8)  # eager-cold callers keep their own row


def test_an_infeasible_stored_config_is_skipped(client):
    bad = {**splits(8, DP64), "tile_n": 128}
    assert decode_config.violations(DecodeConfigSm90(**bad), DP64, SM90)
    mid = post(client, decode_result(DP64, config=bad, tbps=2.0))["id"]
    b = best_decode(client, DP64)
    assert b["provenance"] == "default" and b["config"]["tile_n"] == 64
    assert any(f"measurement {mid}'s config is infeasible" in n for n in b["notes"])


def test_a_verdict_picks_the_served_row(client):
    fast = post(client, decode_result(config=splits(8), tbps=1.3))["id"]
    default = post(client, decode_result(config=splits(0), tbps=1.29, is_default=True))["id"]
    with ResultsStore.open(client.app.state.fa4.settings.db_url) as store:
        dev, pid = store.upsert_device(DEVICE), store.upsert_problem(DP)
        store.add_verdict(dev, pid, "fa4-decode", measurement_id=default, significant=False, gain=0.004,
                          spread=0.01, rounds={"tflops": [[1.3, 1.29]] * 3}, source_fingerprint=FP)
    b = best_decode(client)  # the direct write is seen at the next freshness check
    if b["measurement_id"] == fast:
        client.app.state.fa4._checked_at = float("-inf")
        b = best_decode(client)
    assert b["measurement_id"] == default and b["config"] == splits(0)
    assert b["verdict"]["significant"] is False and b["verdict"]["rounds"] == 3


def test_impossible_problems_are_422_with_the_reason(client):
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "heads_kv": 5})
    assert_error(r, 422, "invalid problem", "heads_q (32) must be a multiple of heads_kv (5)")
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "batch": 0})
    assert_error(r, 422, "batch must be a positive integer")
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "head_dim": 80})
    assert_error(r, 422, "fa4-decode cannot run this problem", "head_dim 80")
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "provider": "fa4"})
    assert_error(r, 422, "fa4 cannot run this problem", "does not tune decode problems")
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "page": 64})  # misspelt
    assert_error(r, 422, "query.page")
    r = client.get(PATH, params={"device": DEVICE["name"], "batch": 1})
    assert_error(r, 422, "query.seqlen_q", "Field required")
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "dtype": "fp8"})
    assert_error(r, 422, "query.dtype")
    r = client.get(PATH, params={**dataclasses.asdict(DP), "device": DEVICE["name"], "provider": "nope"})
    assert_error(r, 404, "unknown provider 'nope'")
    # The attention endpoint does not serve the decode provider.
    r = client.get("/v1/configs/best", params={"device": DEVICE["name"], "provider": "fa4-decode",
                                               "seqlen_q": 1, "head_dim": 128})
    assert_error(r, 422, "fa4-decode cannot run this problem")


def test_posted_decode_results_are_validated(client):
    assert_error(client.post("/v1/results", json=decode_result(provider="fa4"), headers=AUTH), 422,
                 "does not tune decode problems")
    assert_error(client.post("/v1/results", json=decode_result(config={"num_splits": 7}), headers=AUTH), 422,
                 "invalid config for fa4-decode (decode)")
    bad = decode_result()
    bad["problem"] = {**bad["problem"], "heads_kv": 5}
    assert_error(client.post("/v1/results", json=bad, headers=AUTH), 422, "heads_q (32) must be a multiple")
    bad["problem"] = {**DP.to_dict(), "page_size": -1}
    # The location is the JSON path sent: no union tag in it.
    assert_error(client.post("/v1/results", json=bad, headers=AUTH), 422, "body.problem.page_size")
    bad["problem"] = {**DP.to_dict(), "window_left": 4}
    assert_error(client.post("/v1/results", json=bad, headers=AUTH), 422, "body.problem.window_left")
    bad["problem"] = {**DP.to_dict(), "kind": "other"}
    assert_error(client.post("/v1/results", json=bad, headers=AUTH), 422, "body.problem")
    # A retry stores nothing new; the stored row reads back as the decode problem it was.
    first = post(client, decode_result())
    again = post(client, decode_result(), expect=200)
    assert again["id"] == first["id"] and not again["created"]
    (row,) = client.get("/v1/results", params={"provider": "fa4-decode"}).json()["items"]
    assert row["problem"] == DP.to_dict() and row["config"] == splits(8)


def test_posting_a_decode_result_drops_the_cached_answer(client):
    state = client.app.state.fa4
    assert best_decode(client)["provenance"] == "default"
    assert best_decode(client)["provenance"] == "default"  # the fast path's copy
    assert [k[0] for k in state._by_query] == [PATH]
    # The same query string on the attention path is another answer (the fast path keys by path too).
    qs = urlencode({**dataclasses.asdict(DP), "device": DEVICE["name"], "source_fingerprint": FP})
    assert client.get(f"{PATH}?{qs}").json()["problem"] == DP.to_dict()
    attention = client.get(f"/v1/configs/best?{qs}").json()
    assert attention["provider"] == "fa4" and "page_size" not in attention["problem"]
    assert best_decode(client)["problem"] == DP.to_dict()
    post(client, decode_result(config=splits(8), tbps=1.29))
    assert state._by_query == {} and state._best == {}
    b = best_decode(client)
    assert b["provenance"] == "exact" and b["config"] == splits(8)
    # A write to another decode family (head_dim 64) keeps this answer cached.
    small = dataclasses.replace(DP, head_dim=64)
    post(client, decode_result(small, config=splits(8, small)))
    assert [k[0] for k in state._by_query] == [PATH]
    # A faster row of this problem replaces it at once.
    post(client, decode_result(config=splits(16), tbps=1.4))
    assert best_decode(client)["config"] == splits(16)


def test_providers_list_the_decode_knob_class(client):
    provs = {p["name"]: p for p in client.get("/v1/providers").json()}
    assert provs["fa4-decode"]["passes"] == ["decode"]
    assert provs["fa4-decode"]["knob_classes"] == {"decode": "DecodeConfigSm90"}
    knobs = client.get("/v1/providers/fa4-decode/knobs").json()["passes"]["decode"]
    assert knobs["knob_class"] == "DecodeConfigSm90"
    assert {k["name"] for k in knobs["knobs"]} == {f.name for f in dataclasses.fields(DecodeConfigSm90)}


def test_listings_tell_decode_rows_apart(client):
    """What the dashboard reads: GET /v1/results?kind= keeps attention views free of decode rows (whose
    attention-only columns sit at their defaults), and a decode verdict lists its decode problem."""
    from tests.service.test_app import problem, result

    post(client, result(prob=problem(1024), provider="fa4", config={}, tflops=400.0))
    mid = post(client, decode_result())["id"]
    rows = client.get("/v1/results", params={"pass": "fwd", "head_dim": 128}).json()["items"]
    assert len(rows) == 2  # both match the attention filters alone
    (att,) = client.get("/v1/results", params={"pass": "fwd", "head_dim": 128, "kind": "attention"}).json()["items"]
    assert att["provider"] == "fa4" and "kind" not in att["problem"]
    (dec,) = client.get("/v1/results", params={"kind": "decode"}).json()["items"]
    assert dec["id"] == mid and dec["problem"] == DP.to_dict()
    assert_error(client.get("/v1/results", params={"kind": "other"}), 422, "query.kind")
    with ResultsStore.open(client.app.state.fa4.settings.db_url) as store:
        store.add_verdict(store.upsert_device(DEVICE), store.upsert_problem(DP), "fa4-decode", measurement_id=mid,
                          significant=True, gain=0.03, spread=0.01, rounds={"tflops": [[1.2, 1.16]]},
                          source_fingerprint=FP)
    (v,) = client.get("/v1/verdicts", params={"provider": "fa4-decode"}).json()
    assert v["problem"] == DP.to_dict() and v["measurement_id"] == mid
