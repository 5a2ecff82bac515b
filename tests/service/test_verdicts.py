"""GET /v1/verdicts: the newest verdict of each (device, problem, provider, timing mode), with filters."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from fa4.problem import Problem
from service.app import create_app
from store import ResultsStore
from tests.service.test_app import DEVICE, assert_error

ROUNDS = {"configs": [{"tile_n": 64}, {"tile_n": 128}], "tflops": [[500.0, 530.0]] * 5,
          "order": [[0, 1]] * 5}


def _study(store: ResultsStore, dev: int, problem: Problem, name: str, default: float, best: float,
           timing: str = "eager-cold") -> tuple[int, int, int]:
    """A study's rows (default first, then a challenger): (problem id, default row, challenger row)."""
    pid = store.upsert_problem(problem)
    rows = []
    for i, (cfg, tflops) in enumerate((({"tile_n": 64}, default), ({"tile_n": 128}, best))):
        cid = store.upsert_config("toy", cfg)
        rows.append(store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0,
                                          tflops=tflops, study_name=name, trial_number=i, is_default=i == 0,
                                          source_fingerprint="toysrc-1", timing=timing))
    return pid, rows[0], rows[1]


@pytest.fixture
def db(db_url):
    """Two studies on one device: fwd S4096 judged significant (+6.1%), fwd S8192 not (-6.8% +- 15%,
    re-measured twice: the newest verdict counts); and one graph-cold study on another GPU."""
    with ResultsStore.open(db_url) as store:
        dev = store.upsert_device(DEVICE)
        p1, _, win = _study(store, dev, Problem.standard(4096, 128), "s4096", 500.0, 531.0)
        store.add_verdict(dev, p1, "toy", measurement_id=win, significant=True, gain=0.061, spread=0.001,
                          rounds=ROUNDS, study_name="s4096", source_fingerprint="toysrc-1")
        p2, default, _ = _study(store, dev, Problem.standard(8192, 128), "s8192", 400.0, 468.0)
        old = store.add_verdict(dev, p2, "toy", measurement_id=default, significant=False, gain=0.02, spread=0.3,
                                rounds={"tflops": [[1, 2]] * 3}, study_name="s8192-first")
        with store.engine.begin() as conn:  # the first verdict an hour older
            from sqlalchemy import update

            from store import models as m
            conn.execute(update(m.Verdict).where(m.Verdict.id == old).values(
                created_at=datetime.now(timezone.utc) - timedelta(hours=1)))
        store.add_verdict(dev, p2, "toy", measurement_id=default, significant=False, gain=-0.068, spread=0.15,
                          rounds=ROUNDS, study_name="s8192", source_fingerprint="toysrc-1")
        other = store.upsert_device({**DEVICE, "name": "NVIDIA B200", "compute_capability": "10.0"})
        p3, _, win3 = _study(store, other, Problem.standard(4096, 64), "b200", 600.0, 700.0, timing="graph-cold")
        store.add_verdict(other, p3, "toy", measurement_id=win3, significant=True, gain=0.16, spread=0.02,
                          rounds=ROUNDS, study_name="b200", timing="graph-cold")
        ids = {"win": win, "default": default, "win3": win3}
    yield db_url, ids


@pytest.fixture
def client(db):
    with TestClient(create_app(db[0])) as c:
        yield c


def verdicts(client, expect=200, **params):
    r = client.get("/v1/verdicts", params=params)
    assert r.status_code == expect, r.text
    return r.json()


def test_lists_the_newest_verdict_of_each_problem_with_its_served_row(client, db):
    ids = db[1]
    got = verdicts(client, device=DEVICE["name"])
    assert [v["study_name"] for v in got] == ["s4096", "s8192"]  # the older s8192 verdict is replaced
    sig, kept = got
    assert sig["significant"] is True and sig["gain"] == pytest.approx(0.061) and sig["spread"] == pytest.approx(0.001)
    assert sig["rounds"] == 5 and sig["measurement_id"] == ids["win"] and sig["provider"] == "toy"
    assert sig["problem"] == Problem.standard(4096, 128).to_dict() and sig["timing"] == "eager-cold"
    assert sig["device"] == DEVICE["name"] and sig["source_fingerprint"] == "toysrc-1" and sig["created_at"]
    assert kept["significant"] is False and kept["gain"] == pytest.approx(-0.068)
    assert kept["spread"] == pytest.approx(0.15) and kept["measurement_id"] == ids["default"]
    assert kept["problem"]["seqlen_q"] == 8192 and kept["rounds"] == 5


def test_filters_by_device_provider_timing_and_study(client, db):
    assert [v["study_name"] for v in verdicts(client)] == ["b200", "s4096", "s8192"]  # any device, any mode
    assert [v["study_name"] for v in verdicts(client, timing="graph-cold")] == ["b200"]
    assert [v["study_name"] for v in verdicts(client, timing="eager-cold")] == ["s4096", "s8192"]
    assert verdicts(client, device=DEVICE["name"], timing="graph-cold") == []
    assert [v["study_name"] for v in verdicts(client, device="NVIDIA B200")] == ["b200"]
    assert verdicts(client, provider="fa4") == []
    assert len(verdicts(client, provider="toy")) == 3
    assert [v["gain"] for v in verdicts(client, study_name="s8192")] == [pytest.approx(-0.068)]
    assert verdicts(client, device="no such GPU") == []


def test_bad_filters_are_422(client):
    assert_error(client.get("/v1/verdicts", params={"timing": "graph-hot"}), 422, "timing")
    assert_error(client.get("/v1/verdicts", params={"device": "x" * 300}), 422, "device")
    assert_error(client.get("/v1/verdicts", params={"provider": "a\x00b"}), 422, "provider")


def test_the_schema_documents_the_route(client):
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/verdicts"]["get"]
    assert op["tags"] == ["results"] and "newest verdict" in op["description"]
    assert {p["name"] for p in op["parameters"]} == {"device", "provider", "timing", "study_name"}
    item = op["responses"]["200"]["content"]["application/json"]["schema"]["items"]["$ref"].rsplit("/", 1)[-1]
    props = doc["components"]["schemas"][item]["properties"]
    for field in ("study_name", "problem", "provider", "timing", "significant", "gain", "spread", "rounds",
                  "created_at", "measurement_id"):
        assert field in props, field
    for field in ("study_name", "problem", "timing", "significant", "gain", "spread", "rounds", "measurement_id"):
        assert props[field].get("description"), field
    # Every answer validates against the schema.
    from service.schemas import VerdictListed

    for v in verdicts(client):
        VerdictListed.model_validate(v)
