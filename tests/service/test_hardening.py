"""The service under hostile input and load: bounded bodies, token before body, targeted
invalidation, single-flight rebuilds, bounded caches, start-up work before the first request."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi.testclient import TestClient

from service import schemas as sch
from service.app import create_app
from service.settings import Settings
from tests.service import test_app
from tests.service.test_app import AUTH, DEVICE, TOKEN, assert_error, best, post, problem, result

# The REST tests' fixtures: the toy provider registered, a client of an app with a token.
toy = test_app.toy
client = test_app.client

LIMIT_MSG = f"request body too large: the limit is {sch.MAX_BODY_BYTES} bytes"


async def _call(app, method: str, path: str, headers: dict, body: bytes, root_path: str = ""
                ) -> tuple[int, dict, bool]:
    """One request straight through the ASGI app; also says whether the app ever read the body."""
    read = False

    async def receive():
        nonlocal read
        read = True
        return {"type": "http.request", "body": body, "more_body": False}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": root_path, "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 1),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    await app(scope, receive, send)
    status = sent[0]["status"]
    payload = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    return status, payload, read


def test_writes_without_a_valid_token_are_refused_before_the_body_is_read(client):
    app = client.app
    huge = b"[" * 100  # not even JSON: parsing it would be a 422
    for headers, status, msg in (
        ({}, 401, "missing bearer token (Authorization: Bearer <token>)"),
        ({"Authorization": "Basic abc"}, 401, "missing bearer token (Authorization: Bearer <token>)"),
        ({"Authorization": "Bearer nope"}, 401, "wrong bearer token"),
    ):
        got = asyncio.run(_call(app, "POST", "/v1/results", {**headers, "content-length": str(len(huge))}, huge))
        assert got == (status, {"error": msg}, False)
    # Under a mount or a proxy prefix too (scope path /fa4/v1/results, root_path /fa4).
    got = asyncio.run(_call(app, "POST", "/fa4/v1/results", {"content-length": "100"}, huge, root_path="/fa4"))
    assert got == (401, {"error": "missing bearer token (Authorization: Bearer <token>)"}, False)
    # The same rule as the route's own dependency: a valid token gets through to parsing.
    got = asyncio.run(_call(app, "POST", "/v1/results", {**AUTH, "content-length": "100",
                                                          "content-type": "application/json"}, huge))
    assert got[0] == 422 and got[1]["error"] == "invalid request: body.100: JSON decode error" and got[2]


def test_writes_are_refused_unread_when_no_token_is_configured(db_url, toy):
    with TestClient(create_app(db_url)) as c:
        got = asyncio.run(_call(c.app, "POST", "/v1/results", {**AUTH, "content-length": "5"}, b"{...}"))
    assert got == (403, {"error": "writes are disabled: the service has no API token configured "
                                  "(set FA4_API_TOKEN)"}, False)


def test_bodies_over_the_limit_get_413_unread_or_as_they_arrive(client):
    declared = {**AUTH, "content-length": str(sch.MAX_BODY_BYTES + 1)}
    assert asyncio.run(_call(client.app, "POST", "/v1/results", declared, b"")) == (413, {"error": LIMIT_MSG}, False)
    # Without a declared length (chunked), the body is counted as it comes and refused past the limit.
    chunks = (b"x" * 65536 for _ in range(sch.MAX_BODY_BYTES // 65536 + 1))
    r = client.post("/v1/results", content=chunks, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 413 and r.json() == {"error": LIMIT_MSG}
    # A body at the limit is read: a result with the most samples the schema allows fits well below it.
    body = result(samples_ms=[1.0] * sch.MAX_SAMPLES)
    assert len(json.dumps(body)) < sch.MAX_BODY_BYTES // 4
    post(client, body)


@pytest.mark.parametrize("field, value, loc, msg", [
    ("versions", {"blob": "x" * sch.MAX_JSON_FIELD_BYTES}, "body.versions",
     f"Value error, must be at most {sch.MAX_JSON_FIELD_BYTES} bytes as JSON"),
    ("samples_ms", [1.0] * (sch.MAX_SAMPLES + 1), "body.samples_ms", "List should have at most 10000 items"),
    ("reason", "r" * (sch.MAX_REASON_CHARS + 1), "body.reason", "String should have at most 10000 characters"),
    ("study_name", "s" * 256, "body.study_name", "String should have at most 255 characters"),
])
def test_free_text_fields_are_bounded(client, field, value, loc, msg):
    r = client.post("/v1/results", json=result(**{field: value}), headers=AUTH)
    assert_error(r, 422, f"{loc}: {msg}")


def test_device_provider_versions_are_bounded(client):
    device = {**DEVICE, "provider_versions": {"toy": "1" * sch.MAX_JSON_FIELD_BYTES}}
    r = client.post("/v1/results", json=result(device=device), headers=AUTH)
    assert_error(r, 422, f"body.device.provider_versions: Value error, must be at most "
                         f"{sch.MAX_JSON_FIELD_BYTES} bytes as JSON")


BEST = "/v1/configs/best"  # the fast path caches answers by (path, query string)


def test_a_write_drops_only_the_answers_of_its_family(client):
    post(client, result(tflops=500.0))
    post(client, result(prob=problem(4096, head_dim=64), tflops=300.0))
    url128 = "device=NVIDIA+H200&provider=toy&head_dim=128&heads_q=16&seqlen_q=4096&batch=4"
    url64 = "device=NVIDIA+H200&provider=toy&head_dim=64&heads_q=16&seqlen_q=4096&batch=4"
    assert client.get("/v1/configs/best?" + url128).json()["tflops"] == 500.0
    assert client.get("/v1/configs/best?" + url64).json()["tflops"] == 300.0
    state = client.app.state.fa4
    assert set(state._by_query) == {(BEST, url128.encode()), (BEST, url64.encode())}
    # A faster head_dim-64 row: that family's answer is rebuilt, the head_dim-128 one stays cached.
    post(client, result(prob=problem(4096, head_dim=64), tflops=350.0, config={"tile_n": 128}))
    assert set(state._by_query) == {(BEST, url128.encode())}
    assert client.get("/v1/configs/best?" + url64).json()["tflops"] == 350.0
    # A new software stack of the device (a new device row) drops every answer of that device.
    post(client, result(device={**DEVICE, "driver": "575.1"}, tflops=400.0, config={"tile_m": 64}))
    assert state._by_query == {}
    assert client.get("/v1/configs/best?" + url128).json()["tflops"] == 500.0


def test_concurrent_askers_share_one_rebuild(client):
    post(client, result(tflops=500.0))
    state = client.app.state.fa4
    store = state.store
    calls = []
    real = store.family_rows

    def counting(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    store.family_rows = counting

    async def many():
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            params = {"device": DEVICE["name"], "provider": "toy", "head_dim": 128, "heads_q": 16}
            rs = await asyncio.gather(*(c.get("/v1/configs/best", params={**params, "seqlen_q": s})
                                        for s in (1024, 2048, 4096, 8192) * 10))
        return [r.json()["provenance"] for r in rs]

    try:
        got = asyncio.run(many())
    finally:
        store.family_rows = real
    assert got == (["nearest", "nearest", "exact", "nearest"] * 10)
    assert len(calls) == 1  # 40 requests, 4 shapes of one family: one query


def test_caches_stay_bounded_by_their_caps(db_url, toy):
    settings = Settings(db_url=db_url, token=TOKEN, best_cache_size=50, family_cache_size=4)
    with TestClient(create_app(settings=settings)) as c:
        post(c, result(tflops=500.0))
        for i in range(200):
            b = best(c, device=f"gpu-{i}", seqlen_q=4096, batch=4, head_dim=64 if i % 2 else 128)
            assert b["provenance"] == "default" and b["device"] == f"gpu-{i}"
            b = best(c, seqlen_q=1000 + 64 * i, batch=4)
            assert b["provenance"] == "nearest"
        state = c.app.state.fa4
        assert len(state._best) == 50 and len(state._by_query) == 50 and len(state._family) <= 4
        # Device rows are those of the database, whatever device strings clients sent.
        assert list(state._devices_by_name) == [DEVICE["name"]]
        assert len(state._flights) == 0
        # Evicted answers are rebuilt, the same.
        assert best(c, seqlen_q=4096, batch=4)["tflops"] == 500.0


def test_omitted_sizes_follow_the_cli_shape_convention(client):
    def shape(**params):
        r = client.get("/v1/configs/best", params={"device": DEVICE["name"], "provider": "toy", **params})
        assert r.status_code == 200, r.text
        p = r.json()["problem"]
        return p["batch"], p["heads_q"], p["heads_kv"], p["seqlen_k"]

    # fa4-tune's default: batch = 16384 tokens / seqlen, heads = 2048 / head_dim.
    assert shape(seqlen_q=1024, head_dim=64) == (16, 32, 32, 1024)
    assert shape(seqlen_q=32768, head_dim=128) == (1, 16, 16, 32768)
    assert shape(seqlen_q=4096, head_dim=128, batch=2, heads_q=8, heads_kv=2) == (2, 8, 2, 4096)


def test_start_up_fingerprints_every_provider_before_serving(db_url, toy):
    from providers import list_providers

    with TestClient(create_app(db_url)) as c:
        state = c.app.state.fa4
        # Those that load here; a provider that cannot load answers 404 without a fingerprint.
        assert "toy" in state._fingerprints and state._fingerprints["toy"] == "toysrc-1"
        assert set(state._fingerprints) <= set(list_providers())
        assert state.schema_revision is not None
        assert c.get("/healthz").json()["schema_revision"] == state.schema_revision


def test_changes_since_names_the_families_of_new_rows_verdicts_and_devices(store):
    from fa4.problem import Problem

    dev = store.upsert_device({k: v for k, v in DEVICE.items()})
    p = Problem.standard(4096, 128)
    pid, cid = store.upsert_problem(p), store.upsert_config("toy", {"tile_n": 64})
    gen0 = store.generation()
    # The device, the provider, then the store's family fields of the problem (plain here).
    from store.store import FAMILY_FIELDS

    fam = (DEVICE["name"], "toy", *(getattr(p, f) for f in FAMILY_FIELDS))
    # A failed trial changes no answer: no family.
    store.add_measurement(dev, pid, cid, status="compile_error", reason="x")
    gen1, families, names = store.changes_since(gen0)
    assert (families, names) == (set(), set()) and gen1[0] > gen0[0]
    mid = store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=5.0)
    gen2, families, names = store.changes_since(gen1)
    assert (families, names) == ({fam}, set())
    store.add_verdict(dev, pid, "toy", measurement_id=mid, significant=True, gain=0.1, spread=0.01,
                      rounds={"configs": []})
    gen3, families, names = store.changes_since(gen2)
    assert (families, names) == ({fam}, set()) and gen3[2] > gen2[2]
    store.upsert_device({**DEVICE, "driver": "575.1"})
    gen4, families, names = store.changes_since(gen3)
    assert (families, names) == (set(), {DEVICE["name"]}) and store.changes_since(gen4)[1:] == (set(), set())
