"""The REST API: every route, its error cases, provenance rules and idempotent ingestion."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from fa4.knobs import knob_specs
from fa4.problem import Problem
from service.app import create_app
from store import ResultsStore
from store.migrate import head_revision
from tests.service.toy import ToyKnobs, ToyProvider

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEVICE = {
    "name": "NVIDIA H200",
    "compute_capability": "9.0",
    "sm_count": 132,
    "l2_bytes": 60 * 2**20,
    "memory_bytes": 150_754_820_096,
    "driver": "570.124.06",
    "cuda": "12.8",
    "torch": "2.13.0",
    "cutlass_dsl": "4.8.1",
    "provider_versions": {"toy": "1.0"},
}


@pytest.fixture
def toy(monkeypatch):
    import providers as providers

    monkeypatch.setitem(providers._REGISTRY, "toy", ToyProvider)
    monkeypatch.delitem(providers._CACHE, "toy", raising=False)
    monkeypatch.setattr(ToyProvider, "fingerprint", "toysrc-1")
    yield ToyProvider
    providers._CACHE.pop("toy", None)


@pytest.fixture
def client(db_url, toy):
    app = create_app(db_url, token=TOKEN)
    with TestClient(app) as c:
        yield c


def problem(seqlen=4096, head_dim=128, **kw) -> dict:
    kw.setdefault("batch", max(1, 16384 // seqlen))
    kw.setdefault("heads_q", 16)
    return Problem.standard(seqlen, head_dim, **kw).to_dict()


def result(prob=None, config=None, tflops=500.0, fp="toysrc-1", **kw) -> dict:
    body = {
        "device": DEVICE,
        "provider": "toy",
        "problem": prob or problem(),
        "config": {"tile_n": 64} if config is None else config,
        "status": "ok",
        "samples_ms": [1.0, 1.01, 0.99],
        "median_ms": 1.0,
        "iqr_ms": 0.01,
        "tflops": tflops,
        "error": 1e-3,
        "ref_error": 2e-3,
        "source_fingerprint": fp,
        "versions": {"torch": "2.13.0", "cutlass_dsl": "4.8.1"},
    }
    body.update(kw)
    return body


def post(client, body, headers=AUTH, expect=201) -> dict:
    r = client.post("/v1/results", json=body, headers=headers)
    assert r.status_code == expect, r.text
    return r.json()


def best(client, expect=200, **params) -> dict:
    params.setdefault("device", DEVICE["name"])
    params.setdefault("provider", "toy")
    params.setdefault("head_dim", 128)
    params.setdefault("heads_q", 16)
    r = client.get("/v1/configs/best", params=params)
    assert r.status_code == expect, r.text
    return r.json()


def assert_error(r, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body["error"], str) and body["error"]
    for w in words:
        assert w in body["error"], (w, body["error"])
    return body


# -- health and catalogue ---------------------------------------------------------------


def test_healthz_reports_schema_head(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["schema_revision"] == head_revision()


def test_openapi_lists_the_v1_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/configs/best", "/v1/devices", "/v1/providers", "/v1/providers/{name}/knobs", "/v1/results",
              "/v1/studies/{study_name}", "/healthz"):
        assert p in paths, p
    assert "post" in paths["/v1/results"] and "get" in paths["/v1/results"]


def test_devices_and_providers_count_results(client):
    assert client.get("/v1/devices").json() == []
    post(client, result())
    post(client, result(prob=problem(2048)))
    (dev,) = client.get("/v1/devices").json()
    assert dev["name"] == DEVICE["name"] and dev["sm_count"] == 132 and dev["n_results"] == 2
    assert dev["provider_versions"] == {"toy": "1.0"}
    provs = {p["name"]: p for p in client.get("/v1/providers").json()}
    assert provs["toy"]["n_results"] == 2
    assert provs["toy"]["source_fingerprint"] == "toysrc-1"
    assert provs["toy"]["knob_classes"] == {"fwd": "ToyKnobs"}
    assert provs["toy"]["available"] is True
    # The kernel of this repository is listed with its knob class per pass.
    assert provs["fa4"]["knob_classes"] == {"fwd": "FwdConfigSm90", "bwd": "BwdConfigSm90"}
    assert provs["fa4"]["passes"] == ["fwd", "bwd"]


def test_knobs_come_from_the_dataclass(client):
    r = client.get("/v1/providers/toy/knobs")
    assert r.status_code == 200
    fwd = r.json()["passes"]["fwd"]
    assert fwd["knob_class"] == "ToyKnobs"
    assert fwd["knobs"] == [s.to_json() for s in knob_specs(ToyKnobs)]
    props = fwd["json_schema"]["properties"]
    assert list(props) == [s.name for s in knob_specs(ToyKnobs)]
    assert props["tile_m"]["enum"] == [64, 128, 192] and props["tile_m"]["default"] == 128
    assert props["overlap"]["description"] == "overlap softmax with the next GEMM"
    assert fwd["json_schema"]["additionalProperties"] is False

    from fa4.sm90.fwd_config import FwdConfigSm90

    from fa4.sm90.bwd_config import BwdConfigSm90

    fa4 = client.get("/v1/providers/fa4/knobs").json()["passes"]
    assert [k["name"] for k in fa4["fwd"]["knobs"]] == [s.name for s in knob_specs(FwdConfigSm90)]
    assert fa4["bwd"]["knob_class"] == "BwdConfigSm90"
    assert fa4["bwd"]["knobs"] == [s.to_json() for s in knob_specs(BwdConfigSm90)]
    assert list(fa4["bwd"]["json_schema"]["properties"]) == [s.name for s in knob_specs(BwdConfigSm90)]
    assert_error(client.get("/v1/providers/nope/knobs"), 404, "unknown provider", "nope")


def test_fa4_bwd_results_are_validated_and_served_with_the_bwd_knobs(client):
    from fa4.knobs import config_to_dict
    from fa4.sm90.bwd_config import BwdConfigSm90
    from providers import get_provider

    fp = get_provider("fa4").source_fingerprint()
    prob = problem(pass_="bwd", deterministic=True)
    base = dict(provider="fa4", prob=prob, fp=fp, versions={})
    assert_error(client.post("/v1/results", json=result(config={"tau": 4}, **base), headers=AUTH), 422,
                 "invalid config for fa4 (bwd)", "unknown knob", "tau")
    assert_error(client.post("/v1/results", json=result(config={"tile_m": 96}, **base), headers=AUTH), 422,
                 "BwdConfigSm90.tile_m")
    # An older client still naming the retired "deterministic" knob: stored without it.
    post(client, result(config={"deterministic": True, "stages": 1}, **base))
    want = config_to_dict(BwdConfigSm90(stages=1))
    assert client.get("/v1/results", params={"provider": "fa4"}).json()["items"][0]["config"] == want
    ans = best(client, provider="fa4", seqlen_q=4096, batch=4, **{"pass": "bwd"}, deterministic=True)
    assert ans["provenance"] == "exact" and ans["config"] == want
    # The non-deterministic backward is another problem: nothing measured for it.
    assert best(client, provider="fa4", seqlen_q=4096, batch=4, **{"pass": "bwd"})["provenance"] == "default"


# -- writes: auth, validation, idempotency ---------------------------------------------


def test_writes_refused_without_a_configured_token(db_url, toy, monkeypatch):
    monkeypatch.delenv("FA4_API_TOKEN", raising=False)
    with TestClient(create_app(db_url)) as c:
        assert_error(c.post("/v1/results", json=result(), headers=AUTH), 403, "FA4_API_TOKEN")
        assert c.get("/v1/results").json()["total"] == 0


def test_token_from_environment(db_url, toy, monkeypatch):
    monkeypatch.setenv("FA4_API_TOKEN", "from-env")
    with TestClient(create_app(db_url)) as c:
        assert_error(c.post("/v1/results", json=result(), headers=AUTH), 401)
        post(c, result(), headers={"Authorization": "Bearer from-env"})


def test_missing_or_wrong_token_is_401(client):
    r = client.post("/v1/results", json=result())
    assert_error(r, 401, "missing bearer token")
    assert r.headers["www-authenticate"] == "Bearer"
    assert_error(client.post("/v1/results", json=result(), headers={"Authorization": "Bearer nope"}), 401, "wrong")
    assert_error(client.post("/v1/results", json=result(), headers={"Authorization": f"Basic {TOKEN}"}), 401)
    assert client.get("/v1/results").json()["total"] == 0


def test_post_round_trip_and_idempotent_retry(client):
    body = result(trial_number=3, study_name="s1")
    first = post(client, body)
    assert first["created"] is True
    again = post(client, body, expect=200)
    assert again == {**first, "created": False}
    page = client.get("/v1/results").json()
    assert page["total"] == 1
    row = page["items"][0]
    assert row["id"] == first["id"]
    assert row["config"] == {"tile_m": 128, "tile_n": 64, "overlap": True}  # defaults filled in
    assert row["samples_ms"] == [1.0, 1.01, 0.99] and row["n_samples"] == 3
    assert row["problem"] == body["problem"] and row["source_fingerprint"] == "toysrc-1"
    assert row["versions"] == body["versions"] and row["trial_number"] == 3

    # An explicit key wins over the payload: a retry whose timing fields were re-serialised
    # differently is still the same result.
    k = post(client, result(tflops=400.0), headers={**AUTH, "Idempotency-Key": "trial-7"})
    assert k["idempotency_key"] == "trial-7" and k["created"]
    k2 = post(client, result(tflops=400.5), headers={**AUTH, "Idempotency-Key": "trial-7"}, expect=200)
    assert k2["id"] == k["id"]
    k3 = post(client, result(tflops=1.0, idempotency_key="trial-8"))
    assert k3["created"] and k3["id"] != k["id"]
    assert client.get("/v1/results").json()["total"] == 3


@pytest.mark.parametrize(
    "change, words",
    [
        ({"provider": "nope"}, ["unknown provider", "nope"]),
        ({"provider": "tuner.study:Tuner"}, ["unknown provider"]),  # never imports a path for a client
        ({"config": {"tile_m": 100}}, ["ToyKnobs.tile_m", "100", "[64, 128, 192]"]),
        ({"config": {"tile_x": 64}}, ["unknown knob", "tile_x"]),
        ({"config": {"overlap": "yes"}}, ["ToyKnobs.overlap"]),
        ({"problem": {**problem(), "batch": -2}}, ["problem.batch", "greater than 0"]),
        ({"problem": {**problem(), "seqlen_q": 0}}, ["seqlen_q"]),
        ({"problem": {**problem(), "heads_q": 12, "heads_kv": 5}}, ["heads_q (12) must be a multiple of heads_kv (5)"]),
        ({"problem": {**problem(), "pass": "bwd"}}, ["toy does not implement the bwd pass"]),
        ({"problem": problem(head_dim=96)}, ["head_dim 96 is not supported"]),
        ({"problem": {**problem(), "dtype": "fp8"}}, ["problem.dtype"]),
        ({"problem": {**problem(), "batch": 2**40}}, ["problem.batch"]),
        ({"status": "great"}, ["status"]),
        ({"tflops": None}, ["needs median_ms and tflops"]),
        ({"median_ms": -1.0}, ["median_ms"]),
        ({"samples_ms": [1.0, -3.0]}, ["samples_ms"]),
        ({"device": {**DEVICE, "sm_count": -1}}, ["device.sm_count"]),
        ({"device": {**DEVICE, "name": "bad\x00name"}}, ["NUL"]),
        ({"device": {**DEVICE, "compute_capability": "nine"}}, ["compute_capability"]),
        ({"surprise": 1}, ["surprise"]),
    ],
)
def test_invalid_results_are_422_with_a_clear_message(client, change, words):
    assert_error(client.post("/v1/results", json=result(**change), headers=AUTH), 422, *words)
    assert client.get("/v1/results").json()["total"] == 0


def test_malformed_bodies_are_422(client):
    for raw in (b"{not json", b"[]", b"null", b'{"tflops": NaN}'):
        assert_error(client.post("/v1/results", content=raw, headers={**AUTH, "content-type": "application/json"}),
                     422, "invalid request")
    nan = json.dumps(result()).replace('"tflops": 500.0', '"tflops": NaN')
    assert_error(client.post("/v1/results", content=nan, headers={**AUTH, "content-type": "application/json"}),
                 422, "tflops")


# -- best config: provenance ---------------------------------------------------------


def test_best_exact_serves_the_fastest_current_row(client):
    post(client, result(config={"tile_n": 64}, tflops=500.0))
    post(client, result(config={"tile_n": 128}, tflops=620.0))
    post(client, result(config={"tile_n": 128, "overlap": False}, tflops=610.0))
    post(client, result(prob=problem(4096, causal=True), config={"tile_m": 64}, tflops=900.0))  # other family
    b = best(client, seqlen_q=4096, batch=4)
    assert b["provenance"] == "exact" and b["stale"] is False
    assert b["config"] == {"tile_m": 128, "tile_n": 128, "overlap": True}
    assert b["tflops"] == 620.0 and b["n_samples"] == 3 and b["error"] == 1e-3 and b["ref_error"] == 2e-3
    assert b["versions"] == {"torch": "2.13.0", "cutlass_dsl": "4.8.1"}
    assert b["device_versions"] == {k: DEVICE[k] for k in ("driver", "cuda", "torch", "cutlass_dsl",
                                                            "provider_versions")}
    assert b["measured_problem"] == b["problem"] == problem(4096)
    assert b["source_fingerprint"] == b["running_fingerprint"] == "toysrc-1"
    assert b["measured_at"] and b["distance"] == 0.0


def test_best_nearest_seqlen_in_log_space_then_batch_heads(client):
    post(client, result(prob=problem(1024), config={"tile_n": 64}))
    post(client, result(prob=problem(8192), config={"tile_n": 128}))
    # 4000 is nearer 1024 on a linear scale but nearer 8192 in log space.
    b = best(client, seqlen_q=4000, batch=4)
    assert b["provenance"] == "nearest" and not b["stale"]
    assert b["measured_problem"]["seqlen_q"] == 8192 and b["config"]["tile_n"] == 128
    assert b["distance"] > 0 and any("nearest measured shape" in n for n in b["notes"])
    b = best(client, seqlen_q=1500, batch=4)
    assert b["measured_problem"]["seqlen_q"] == 1024

    # Equal seqlen distance: batch and heads decide.
    post(client, result(prob=problem(2048, batch=2), config={"tile_m": 64}))
    post(client, result(prob=problem(2048, batch=8), config={"tile_m": 192, "tile_n": 64, "overlap": False}))
    b = best(client, seqlen_q=2048, batch=7, head_dim=64, expect=200)  # other family (head_dim 64): default
    assert b["provenance"] == "default"
    b = best(client, seqlen_q=2048, batch=7)
    # batch 8 is nearer, but its tile_m=192 is infeasible at head_dim 128 (toy violation): skipped, said so.
    assert b["measured_problem"]["batch"] == 2 and b["config"]["tile_m"] == 64
    assert any("infeasible" in n for n in b["notes"])


def test_stale_rows_are_never_exact(client, toy):
    post(client, result(config={"tile_n": 128}, tflops=700.0, fp="toysrc-0"))
    b = best(client, seqlen_q=4096, batch=4)
    assert b["provenance"] == "nearest" and b["stale"] is True
    assert b["config"]["tile_n"] == 128 and b["source_fingerprint"] == "toysrc-0"
    assert any("stale" in n and "never served as exact" in n for n in b["notes"])

    # A current measurement of a neighbouring shape beats the stale exact one...
    post(client, result(prob=problem(8192), config={"tile_n": 64}, tflops=300.0))
    b = best(client, seqlen_q=4096, batch=4)
    assert b["provenance"] == "nearest" and not b["stale"] and b["measured_problem"]["seqlen_q"] == 8192
    # ...and a caller running the old source gets the old row as exact.
    b = best(client, seqlen_q=4096, batch=4, source_fingerprint="toysrc-0")
    assert b["provenance"] == "exact" and b["running_fingerprint"] == "toysrc-0" and b["tflops"] == 700.0


def test_default_when_nothing_measured(client):
    b = best(client, seqlen_q=4096, batch=4)
    assert b["provenance"] == "default" and not b["stale"]
    assert b["config"] == {"tile_m": 128, "tile_n": 64, "overlap": True}  # ToyProvider.default_config
    assert b["tflops"] is None and b["measurement_id"] is None
    # A failed trial is no evidence.
    post(client, result(status="runtime_error", tflops=None, median_ms=None, reason="boom"))
    assert best(client, seqlen_q=4096, batch=4)["provenance"] == "default"


def test_measured_default_config_is_evidence_like_any_row(client):
    post(client, result(prob=problem(4096, head_dim=64), config={"tile_n": 64}, tflops=300.0, is_default=True))
    b = best(client, seqlen_q=4096, batch=4, head_dim=64)
    assert b["provenance"] == "exact" and b["tflops"] == 300.0 and b["config"]["tile_n"] == 64
    b = best(client, seqlen_q=2048, batch=8, head_dim=64)
    assert b["provenance"] == "nearest" and b["measured_problem"]["seqlen_q"] == 4096


def test_answer_cache_is_cleared_by_writes(client):
    assert best(client, seqlen_q=4096, batch=4)["provenance"] == "default"
    post(client, result())
    assert best(client, seqlen_q=4096, batch=4)["provenance"] == "exact"


def test_best_rejects_bad_queries(client):
    assert_error(client.get("/v1/configs/best", params={"provider": "toy", "head_dim": 128, "seqlen_q": 1}),
                 422, "device")
    for bad in ({"head_dim": -1}, {"seqlen_q": 0}, {"seqlen_q": 2**40}, {"pass": "sideways"}, {"dtype": "fp64"},
                {"causal": "maybe"}, {"arch": "sm70"}, {"device": "a\x00b"}):
        params = {"device": "NVIDIA H200", "provider": "toy", "head_dim": 128, "seqlen_q": 1024, **bad}
        assert_error(client.get("/v1/configs/best", params=params), 422, "invalid request")
    assert_error(client.get("/v1/configs/best", params={"device": "x", "provider": "toy", "head_dim": 128,
                                                        "seqlen_q": 64, "heads_q": 6, "heads_kv": 4}),
                 422, "multiple of heads_kv")
    assert_error(client.get("/v1/configs/best", params={"device": "x", "provider": "toy", "head_dim": 96,
                                                        "seqlen_q": 64}), 422, "head_dim 96")
    assert_error(client.get("/v1/configs/best", params={"device": "x", "provider": "zzz", "head_dim": 128,
                                                        "seqlen_q": 64}), 404, "unknown provider")


# -- results listing and studies ---------------------------------------------------------


def test_results_filters_pagination_sorting(client):
    ids = []
    for i, sl in enumerate((1024, 2048, 4096, 8192)):
        ids.append(post(client, result(prob=problem(sl), tflops=100.0 * (i + 1), config={"tile_n": 64}))["id"])
    ids.append(post(client, result(prob=problem(2048, causal=True), status="infeasible", tflops=None,
                                   median_ms=None, reason="too big"))["id"])
    page = client.get("/v1/results", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5 and [r["id"] for r in page["items"]] == ids[1:3]
    assert client.get("/v1/results", params={"causal": True}).json()["total"] == 1
    assert client.get("/v1/results", params={"status": "ok", "seqlen_q": 2048}).json()["total"] == 1
    assert client.get("/v1/results", params={"device": "other"}).json()["total"] == 0
    assert client.get("/v1/results", params={"pass": "bwd"}).json()["total"] == 0
    by_tflops = [r["tflops"] for r in client.get("/v1/results", params={"sort": "-tflops"}).json()["items"]]
    assert by_tflops == [400.0, 300.0, 200.0, 100.0, None]  # failed rows last either way
    asc = [r["tflops"] for r in client.get("/v1/results", params={"sort": "tflops"}).json()["items"]]
    assert asc == [100.0, 200.0, 300.0, 400.0, None]
    newest = client.get("/v1/results", params={"sort": "-id", "limit": 1}).json()["items"][0]
    assert newest["id"] == ids[-1]
    for bad in ({"limit": 0}, {"limit": 10**6}, {"offset": -1}, {"sort": "name"}, {"status": "weird"},
                {"head_dim": "x"}):
        assert_error(client.get("/v1/results", params=bad), 422)


def test_study_history(client):
    name = "fa4-tune|NVIDIA_H200|toy|b4_sq4096"
    for n, (cfg, tf, st) in enumerate([({"tile_n": 64}, 400.0, "ok"), ({"tile_m": 192}, None, "infeasible"),
                                       ({"tile_n": 128}, 550.0, "ok")]):
        extra = {"tflops": tf, "median_ms": None if tf is None else 1.0}
        post(client, result(config=cfg, status=st, study_name=name, trial_number=n, **extra))
    post(client, result(config={"overlap": False}, study_name="other", trial_number=0))
    r = client.get(f"/v1/studies/{name}")
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["study_name"] == name and s["provider"] == "toy" and s["device"] == "NVIDIA H200"
    assert [t["trial_number"] for t in s["trials"]] == [0, 1, 2]
    assert s["n_trials"] == 3 and s["n_ok"] == 2
    assert s["best"]["trial_number"] == 2 and s["best"]["tflops"] == 550.0
    assert s["trials"][1]["status"] == "infeasible" and s["trials"][1]["config"]["tile_m"] == 192
    assert_error(client.get("/v1/studies/nothing-here"), 404, "nothing-here")


def test_odd_inputs_never_5xx(client):
    """Odd requests get the client error that names what is wrong with them, never a 5xx."""
    post(client, result())
    for url, status, words in (
        ("/v1/studies/%00", 422, "path.study_name: String should match pattern"),
        ("/v1/studies/" + "x" * 5000, 422, "path.study_name: String should have at most 255 characters"),
        ("/v1/results?limit=abc", 422, "query.limit: Input should be a valid integer"),
        ("/v1/providers/%00/knobs", 422, "path.name: String should match pattern"),
        ("/v1/configs/best?device=&head_dim=1&seqlen_q=1", 422, "query.device: String should have at least 1"),
        ("/v1/nope", 404, "Not Found"),
        ("/v1/results?offset=99999999999999", 422, "query.offset: Input should be less than or equal to 2147483647"),
        ("/v1/configs/best?device=x&head_dim=128&seqlen_q=1&provider=toy&heads_q=0", 422,
         "query.heads_q: Input should be greater than 0"),
    ):
        assert_error(client.get(url), status, words)
    r = client.post("/v1/results", json=result(versions={"k": "v\x00"}), headers=AUTH)
    assert_error(r, 422, "NUL")


def _direct_row(db_url, tflops):
    """A row written by a tuner process straight into the database (not through the API)."""
    with ResultsStore.open(db_url) as store:
        dev = store.upsert_device(DEVICE)
        pid = store.upsert_problem(Problem.from_dict(problem()))
        cid = store.upsert_config("toy", {"tile_n": 128}, ToyKnobs)
        store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=tflops,
                              source_fingerprint="toysrc-1")


@pytest.mark.parametrize("ttl", [0.0, 3600.0])
def test_rows_written_straight_into_the_db_are_noticed(db_url, toy, ttl):
    from service.settings import Settings

    with TestClient(create_app(settings=Settings(db_url=db_url, token=TOKEN, best_cache_ttl_s=ttl))) as c:
        assert best(c, seqlen_q=4096, batch=4)["provenance"] == "default"
        _direct_row(db_url, 321.0)
        b = best(c, seqlen_q=4096, batch=4)
        if ttl == 0.0:
            assert b["provenance"] == "exact" and b["tflops"] == 321.0
        else:
            # Within the check interval the cached answer stands; a write through the API refreshes it.
            assert b["provenance"] == "default"
            post(c, result(prob=problem(8192)))
            assert best(c, seqlen_q=4096, batch=4)["tflops"] == 321.0


def test_repeat_queries_skip_validation_but_not_freshness(client):
    post(client, result(tflops=500.0))
    url = "/v1/configs/best?device=NVIDIA%20H200&provider=toy&head_dim=128&heads_q=16&seqlen_q=4096&batch=4"
    first = client.get(url)
    state = client.app.state.fa4
    assert list(state._by_query) == [("/v1/configs/best", url.partition("?")[2].encode())]
    again = client.get(url)
    assert again.status_code == 200 and again.content == first.content
    assert again.headers["content-type"] == "application/json"
    # Errors are never cached: the route answers them every time.
    bad = url.replace("provider=toy", "provider=nope")
    assert client.get(bad).status_code == 404 and client.get(bad).status_code == 404
    assert len(state._by_query) == 1
    # A write empties the cache: the next answer is fresh.
    post(client, result(tflops=800.0, config={"overlap": False}))
    assert state._by_query == {}
    assert client.get(url).json()["tflops"] == 800.0
