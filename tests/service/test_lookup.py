"""Launch-time lookup: cache, local results DB, the service over real HTTP, the default, and explain()."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

import fa4
from fa4 import lookup
from fa4.arch import SM90
from fa4.knobs import config_to_dict, iter_configs
from fa4.problem import Problem
from fa4.timing import DEFAULT_TIMING
from fa4.sm90.fwd_config import FwdConfigSm90, default_config, violations
from service.app import create_app
from store import ResultsStore
from tests.service.live import CountingApp, serve, silent_server
from providers import get_provider

DEVICE = "NVIDIA H200"
DEVICE_INFO = {"name": DEVICE, "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 60 * 2**20,
               "memory_bytes": 150_754_820_096}
P = Problem.standard(4096, 128)
P2 = Problem.standard(2048, 128)
TOKEN = "tok"


def tuned(problem: Problem, n: int = 0) -> FwdConfigSm90:
    """A feasible config that is not the heuristic default (so a hit is visible)."""
    d = default_config(problem, SM90)
    # The n-th, found lazily: the space is ~10^6 points, and some tests ask for it in a loop.
    found = (c for c in iter_configs(FwdConfigSm90) if c != d and not violations(c, problem, SM90))
    return next(itertools.islice(found, n, None))


def add_row(store: ResultsStore, problem: Problem, config, fp: str, tflops: float = 600.0) -> int:
    dev = store.upsert_device(DEVICE_INFO)
    pid = store.upsert_problem(problem)
    cid = store.upsert_config("fa4", config_to_dict(config), FwdConfigSm90)
    return store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=tflops,
                                 source_fingerprint=fp)


@pytest.fixture
def fp() -> str:
    return get_provider("fa4").source_fingerprint()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """No GPU here: name the device; a fresh lookup state; no service unless a test sets one."""
    import platformdirs

    monkeypatch.setenv("FA4_DEVICE_NAME", DEVICE)
    monkeypatch.delenv("FA4_TUNING_URL", raising=False)
    monkeypatch.delenv("FA4_DB", raising=False)
    monkeypatch.delenv("FA4_LOOKUP_LOCAL_DB", raising=False)
    # Tests that expect the service to answer give it time: CI runs them beside compile-heavy
    # workers, where a 0.5 s answer is not guaranteed. The timeout tests set their own.
    monkeypatch.setenv(lookup.TIMEOUT_ENV, "30")
    monkeypatch.setattr(platformdirs, "user_data_dir", lambda app: str(tmp_path / "ud" / app))
    lookup.reset()
    yield tmp_path
    lookup.reset()


def sources(res) -> list[tuple[str, str]]:
    return [(s.source, s.outcome) for s in res.steps]


def test_default_without_any_source_and_no_db_created(env):
    res = fa4.explain(problem=P)
    assert res.provenance == "default" and res.config == default_config(P, SM90)
    assert sources(res) == [("cache", "miss"), ("local-db", "skipped"), ("service", "skipped"), ("default", "used")]
    assert "no local results DB" in res.steps[1].detail
    assert not (env / "ud").exists()  # a launch never creates a database
    assert lookup.resolve_fwd_config(P, SM90) == default_config(P, SM90)
    again = fa4.explain(problem=P)
    assert again.steps[0].source == "cache" and again.steps[0].outcome == "used"


def test_local_db_current_row_is_used(env, fp, monkeypatch):
    url = f"sqlite:///{env / 'r.db'}"
    with ResultsStore.open(url) as store:
        add_row(store, P, tuned(P, 0), fp, 500.0)
        add_row(store, P, tuned(P, 1), fp, 650.0)
        add_row(store, P, tuned(P, 2), "older-source", 900.0)  # stale: faster, but not this code
    monkeypatch.setenv("FA4_DB", url)
    assert lookup.resolve_fwd_config(P, SM90) == tuned(P, 1)
    res = fa4.explain(problem=P)
    assert res.provenance == "local-db" and res.tflops == 650.0
    assert ("local-db", "used") in sources(res)


def test_local_db_answers_by_the_services_rule_for_stale_and_infeasible_rows(env, monkeypatch, fp):
    """One best-config rule (store.best.best_config) wherever a kernel asks: a stale row is served
    labelled stale rather than dropped for the heuristic, an infeasible row is skipped with its
    reason and the nearest usable row of the family served, as GET /v1/configs/best answers."""
    from fa4.rules import Fa4Rules
    from store.best import best_config

    url = f"sqlite:///{env / 'r.db'}"
    with ResultsStore.open(url) as store:
        stale_id = add_row(store, P, tuned(P), "older-source")
        bad = next(c for c in iter_configs(FwdConfigSm90) if violations(c, P2, SM90))
        bad_id = add_row(store, P2, bad, fp)
        service = {p: best_config(store, Fa4Rules(), DEVICE, p, running_fp=fp) for p in (P, P2)}
    monkeypatch.setenv("FA4_DB", url)
    res = fa4.explain(problem=P)
    detail = dict(((s.source, s.detail) for s in res.steps))["local-db"]
    assert res.provenance == "local-db" and ("local-db", "used") in sources(res)
    assert f"measurement {stale_id}" in detail and "(stale source)" in detail and "older-source" in detail
    assert res.config == tuned(P) and config_to_dict(res.config) == service[P]["config"]
    assert service[P]["stale"] and service[P]["measurement_id"] == stale_id
    res = fa4.explain(problem=P2)
    detail = dict(((s.source, s.detail) for s in res.steps))["local-db"]
    assert res.provenance == "local-db" and f"measurement {bad_id}'s config is infeasible" in detail
    assert config_to_dict(res.config) == service[P2]["config"] == config_to_dict(tuned(P))
    assert service[P2]["measurement_id"] == stale_id


def test_broken_db_never_raises_into_a_launch(env, monkeypatch):
    monkeypatch.setenv("FA4_DB", "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
    res = fa4.explain(problem=P)
    assert res.provenance == "default"
    assert ("local-db", "skipped") in sources(res) and "cannot open" in res.steps[1].detail
    monkeypatch.setenv("FA4_DB", str(env / "missing.db"))
    lookup.reset()
    assert fa4.explain(problem=P).provenance == "default"
    assert not (env / "missing.db").exists()


def test_service_over_http_one_call_per_problem_class(env, monkeypatch, fp):
    app = CountingApp(create_app(f"sqlite:///{env / 'svc.db'}", token=TOKEN))
    with serve(app) as base:
        import httpx

        body = {"device": DEVICE_INFO, "provider": "fa4", "problem": P.to_dict(),
                "config": config_to_dict(tuned(P)), "status": "ok", "median_ms": 1.0, "tflops": 640.0,
                "source_fingerprint": fp}
        r = httpx.post(base + "/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
        monkeypatch.setenv("FA4_TUNING_URL", base)

        assert lookup.resolve_fwd_config(P, SM90) == tuned(P)
        for _ in range(50):
            assert lookup.resolve_fwd_config(P, SM90) == tuned(P)
        assert app.calls["/v1/configs/best"] == 1
        res = fa4.explain(problem=P)
        assert res.provenance == "service:exact" and res.tflops == 640.0
        assert res.steps[0] == lookup.Step("cache", "used", "resolved earlier in this process from service:exact")

        # Nothing measured at seqlen 2048 except the 4096 row: the service answers "nearest".
        assert fa4.explain(problem=P2).provenance == "service:nearest"
        # Another family (causal): the service has nothing and says default; the heuristic is used.
        pc = Problem.standard(4096, 128, causal=True)
        res = fa4.explain(problem=pc)
        assert res.provenance == "default" and ("service", "miss") in sources(res)
        assert app.calls["/v1/configs/best"] == 3
        # Even with the cache dropped, a problem class is never sent twice.
        lookup._state.cache.clear()
        res = fa4.explain(problem=pc)
        assert "already asked" in [s.detail for s in res.steps if s.source == "service"][0]
        assert app.calls["/v1/configs/best"] == 3


def test_service_failures_are_remembered(env, monkeypatch):
    monkeypatch.delenv(lookup.TIMEOUT_ENV)
    with silent_server() as base:
        monkeypatch.setenv("FA4_TUNING_URL", base)
        t0 = time.perf_counter()
        res = fa4.explain(problem=P)
        took = time.perf_counter() - t0
        assert res.provenance == "default" and ("service", "error") in sources(res)
        assert "Timeout" in [s.detail for s in res.steps if s.source == "service"][0]
        assert took < 2.0, took  # the 0.5 s client timeout bounds the stall of a launch
        # Within the pause, other problems do not even try.
        t0 = time.perf_counter()
        res = fa4.explain(problem=P2)
        # Well under the 0.5 s a try would wait (a loaded CI host gets some slack).
        assert time.perf_counter() - t0 < 0.4
        assert ("service", "skipped") in sources(res) and "retried after 60 s" in res.steps[-2].detail
    # The skipped class asks again once the pause is over; it did not get its one call yet.
    lookup._state.service_down_until = 0.0
    with serve(create_app(f"sqlite:///{env / 'svc.db'}")) as base:
        monkeypatch.setenv("FA4_TUNING_URL", base)
        assert lookup._state.cache[(P2, SM90, DEFAULT_TIMING)].expires < float("inf")
        lookup._state.cache[(P2, SM90, DEFAULT_TIMING)] = lookup._state.cache[(P2, SM90, DEFAULT_TIMING)].__class__(
            **{**lookup._state.cache[(P2, SM90, DEFAULT_TIMING)].__dict__, "expires": 0.0})
        res = fa4.explain(problem=P2)
        assert ("service", "miss") in sources(res)  # reached it this time: nothing measured there


@pytest.mark.parametrize("raw, timeout", [("0.2", 0.2), ("junk", lookup.HTTP_TIMEOUT_S), ("-1", lookup.HTTP_TIMEOUT_S)])
def test_service_timeout_from_the_environment(env, monkeypatch, raw, timeout):
    import httpx

    given = []
    real_get = httpx.get

    def spy(*a, **kw):
        given.append(kw["timeout"])
        return real_get(*a, **kw)

    monkeypatch.setattr(httpx, "get", spy)
    monkeypatch.setenv(lookup.TIMEOUT_ENV, raw)
    with silent_server() as base:
        monkeypatch.setenv("FA4_TUNING_URL", base)
        t0 = time.perf_counter()
        res = fa4.explain(problem=P)
        took = time.perf_counter() - t0
    service = [s for s in res.steps if s.source == "service"]
    assert given == [timeout]
    assert res.provenance == "default" and "Timeout" in service[-1].detail
    assert took >= 0.9 * timeout, took  # the silent service was waited for, that long
    if timeout == lookup.HTTP_TIMEOUT_S:
        assert service[0].outcome == "error" and f"{raw!r} is not a positive number" in service[0].detail


def test_explicit_config_and_tensors(env):
    res = fa4.explain(problem=P, config={"tile_n": 64})
    assert res.provenance == "explicit" and res.config == FwdConfigSm90(tile_n=64)
    q = torch.zeros(4, 4096, 16, 128, dtype=torch.bfloat16)
    res = fa4.explain(q, q, q, causal=False)
    assert res.config == default_config(P, SM90)
    assert res.to_dict()["chain"][-1] == {"source": "default", "outcome": "used",
                                          "detail": "heuristic default of the kernel's knob declaration"}
    with pytest.raises(TypeError):
        fa4.explain(q)


def test_cached_lookup_is_microseconds(env):
    lookup.resolve_fwd_config(P, SM90)
    n = 200_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            lookup.resolve_fwd_config(P, SM90)
        best = min(best, (time.perf_counter() - t0) / n)
    print(f"cached resolve_fwd_config: {best * 1e6:.3f} us per call")
    assert best < 20e-6


# -- the backward's configs: same chain, pass "bwd", BwdConfigSm90 ---------------------------

PB = Problem.standard(4096, 128, pass_="bwd")
PB_DET = Problem.standard(4096, 128, pass_="bwd", deterministic=True)


def tuned_bwd(problem: Problem, n: int = 0):
    from fa4.sm90.bwd_config import BwdConfigSm90, violations as bwd_violations
    from fa4.sm90.bwd_defaults import default_config as bwd_default

    d = bwd_default(problem, SM90)
    others = (c for c in iter_configs(BwdConfigSm90, problem) if c != d and not bwd_violations(c, problem, SM90))
    return next(itertools.islice(others, n, None))


def add_bwd_row(store, problem, config, fp, tflops=500.0):
    from fa4.sm90.bwd_config import BwdConfigSm90

    dev = store.upsert_device(DEVICE_INFO)
    cid = store.upsert_config("fa4", config_to_dict(config), BwdConfigSm90)
    return store.add_measurement(dev, store.upsert_problem(problem), cid, status="ok", samples_ms=[1.0],
                                 median_ms=1.0, tflops=tflops, source_fingerprint=fp)


def test_bwd_configs_from_the_local_db_by_pass_and_determinism(env, fp, monkeypatch):
    from fa4.sm90.bwd_config import BwdConfigSm90
    from fa4.sm90.bwd_defaults import default_config as bwd_default

    url = f"sqlite:///{env / 'r.db'}"
    with ResultsStore.open(url) as store:
        add_row(store, P, tuned(P), fp)
        add_bwd_row(store, PB, tuned_bwd(PB, 0), fp, 400.0)
        add_bwd_row(store, PB, tuned_bwd(PB, 1), fp, 450.0)
        add_bwd_row(store, PB_DET, tuned_bwd(PB_DET, 2), fp, 380.0)
    monkeypatch.setenv("FA4_DB", url)
    assert lookup.resolve_fwd_config(P, SM90) == tuned(P)
    assert lookup.resolve_bwd_config(PB, SM90) == tuned_bwd(PB, 1)
    assert lookup.resolve_bwd_config(PB_DET, SM90) == tuned_bwd(PB_DET, 2)
    assert tuned_bwd(PB_DET, 2) != tuned_bwd(PB, 1)  # each mode served its own rows
    res = fa4.explain(problem=PB_DET)
    assert res.provenance == "local-db" and res.tflops == 380.0 and isinstance(res.config, BwdConfigSm90)
    # Another bwd class (causal) has no row: the heuristic, deterministic as asked.
    pc = Problem.standard(4096, 128, pass_="bwd", deterministic=True, causal=True)
    assert lookup.resolve_bwd_config(pc, SM90) == bwd_default(pc, SM90)
    res = fa4.explain(problem=PB, config={"stages": 1})
    assert res.provenance == "explicit" and res.config == BwdConfigSm90(stages=1)
    with pytest.raises(ValueError, match="bwd problem"):
        lookup.resolve_bwd_config(P, SM90)
    with pytest.raises(ValueError, match="fwd problem"):
        lookup.resolve_fwd_config(PB, SM90)


def test_bwd_config_over_the_service(env, monkeypatch, fp):
    app = CountingApp(create_app(f"sqlite:///{env / 'svc.db'}", token=TOKEN))
    with serve(app) as base:
        import httpx

        body = {"device": DEVICE_INFO, "provider": "fa4", "problem": PB_DET.to_dict(),
                "config": config_to_dict(tuned_bwd(PB_DET, 3)), "status": "ok", "median_ms": 1.0,
                "tflops": 420.0, "source_fingerprint": fp}
        r = httpx.post(base + "/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
        monkeypatch.setenv("FA4_TUNING_URL", base)
        res = fa4.explain(problem=PB_DET)
        assert res.provenance == "service:exact", res.steps
        assert lookup.resolve_bwd_config(PB_DET, SM90) == tuned_bwd(PB_DET, 3)
        # The non-deterministic class is another family: nothing measured, the heuristic.
        assert fa4.explain(problem=PB).provenance == "default"


def test_autograd_backward_uses_the_tuned_bwd_config(env, fp, monkeypatch):
    """End to end on CPU (launches replaced): a DB row for the bwd problem reaches the backward."""
    from tests.fa4 import cpu_kernels

    calls = cpu_kernels.install(monkeypatch)
    q, k, v, dout = cpu_kernels.inputs(1, 96, 96, 4, 2, 128)
    prob = Problem(1, 96, 96, 4, 2, 128, 128, causal=True, deterministic=True, pass_="bwd")
    url = f"sqlite:///{env / 'r.db'}"
    with ResultsStore.open(url) as store:
        add_bwd_row(store, prob, tuned_bwd(prob, 4), fp)
    monkeypatch.setenv("FA4_DB", url)
    monkeypatch.setenv("FA4_LOOKUP_LOCAL_DB", "1")
    lookup.reset()
    fa4.flash_attn_func(q, k, v, causal=True, deterministic=True).backward(dout)
    assert calls.bwd[0]["config"] == tuned_bwd(prob, 4) and calls.bwd[0]["deterministic"]
    assert fa4.explain(q, k, v, True, pass_="bwd", deterministic=True).provenance == "local-db"
