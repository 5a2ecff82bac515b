"""Issue 19's decode in the tuner, on CPU: the fa4-decode provider's space and feasibility, a study
replayed from the split sweep measured on the H200 (providers/data/decode_splits_h200.json), the
launch-time lookup serving what it found through the local results DB, and fa4-tune --decode."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fa4 import lookup
from fa4.arch import SM90
from fa4.decode_problem import DecodeProblem
from fa4.fingerprint import source_fingerprint
from fa4.knobs import config_to_dict, iter_configs, knob_specs
from fa4.problem import Problem
from fa4.sm90 import decode_config
from providers import get_provider
from providers.replay import DATA_DIR, Recording, ReplayProvider
from store import ResultsStore
from tests.fa4.test_decode_host import fake  # noqa: F401 (fixture: the decode kernels' CPU model)
from tests.tuner.test_cli import fa4_tune
from tuner.study import Tuner
from tuner.worker import InProcessRunner

RECORDING = DATA_DIR / "decode_splits_h200.json"
H200_SMS = 132


def decode(batch, kv, page=256):
    return DecodeProblem(batch=batch, seqlen_q=1, seqlen_k=kv, heads_q=32, heads_kv=8, head_dim=128, page_size=page)


class DecodeReplay(ReplayProvider):
    """The recorded sweep served under the decode provider's name and the running kernel source,
    so its rows are what a launch's lookup asks for (a real study's rows carry both)."""

    name = "fa4-decode"

    def __init__(self):
        super().__init__(RECORDING)

    def source_fingerprint(self) -> str:
        return source_fingerprint()


SPEC = f"plugin:{__name__}:DecodeReplay"


# ---------------------------------------------------------------- the provider
def test_space_is_the_knob_declaration_and_feasibility_is_its_violations():
    p = get_provider("fa4-decode")
    assert p.knob_cls is decode_config.DecodeConfigSm90
    for prob in (decode(1, 8192), decode(4, 32768, page=64), decode(1, 4096, page=16)):
        every = list(iter_configs(p.knob_cls))
        feasible = p.feasible_configs(prob, SM90)
        assert 0 < len(feasible) < len(every)
        assert feasible == [c for c in every if not decode_config.violations(c, prob, SM90)]
        assert all(prob.page_size % c.tile_n == 0 for c in feasible)
        assert all(decode_config.smem_bytes(c, prob) <= SM90.smem_per_cta for c in feasible)
        # Every split count of the menu is searched, the heuristic (0) among them.
        menu = next(k.choices for k in knob_specs(p.knob_cls) if k.name == "num_splits")
        assert {c.num_splits for c in feasible} == set(menu) and 0 in menu
        default = p.default_config(prob, SM90)
        assert default.num_splits == 0 and default in feasible
    # Page 64 takes no 128-key tile; the default is the widest tile that fits the page.
    assert p.default_config(decode(4, 32768, page=64), SM90).tile_n == 64
    assert p.problem_errors(Problem(1, 1, 8192, 32, 8, 128, 128)) != []
    assert p.problem_errors(DecodeProblem(1, 1, 8192, 32, 8, 80)) != []  # no decode kernel at hd80
    assert p.problem_errors(DecodeProblem(1, 1, 8192, 32, 8, 256)) == []
    assert p.violations(decode_config.DecodeConfigSm90(tile_n=128), decode(1, 8192, page=64), SM90)


def test_compile_variant_shares_one_kernel_across_runtime_knobs():
    p = get_provider("fa4-decode")
    prob = decode(1, 8192)
    base = p.default_config(prob, SM90)
    keys = {p.compile_variant(prob, dataclasses.replace(base, num_splits=s)) for s in (0, 2, 8, 64)}
    assert len(keys) == 1
    assert p.compile_variant(prob, dataclasses.replace(base, num_splits=1)) not in keys  # unsplit writes O
    assert p.compile_variant(prob, dataclasses.replace(base, kv_stages=2)) not in keys


# ---------------------------------------------------------------- the recorded sweep
def test_recording_holds_the_measured_sweep_and_the_heuristic_picks_what_it_says():
    rec = Recording(RECORDING)
    assert rec.provider_name == "fa4-decode" and rec.space == "recorded"
    assert "SYNTHETIC" not in rec.device["name"]
    for entry in rec.data["problems"]:
        prob = DecodeProblem.from_dict(entry["problem"])
        default = decode_config.default_config(prob)
        # Recorded before the fused combine: today's default but for the combine, which was the kernel.
        assert entry["default"] == {**config_to_dict(default), "combine": "kernel"}
        # num_splits=0's row is the heuristic's pick: the pure function agrees on the H200's 132 SMs.
        picked = decode_config.num_splits_auto(prob.batch, prob.heads_kv, decode_config.rows_per_cta_head(prob, True),
                                               prob.seqlen_k, H200_SMS, default.tile_n)
        assert picked == entry["heuristic_splits"]
        rows = {r["config"]["num_splits"]: r for r in entry["results"]}
        assert rows[0]["tflops"] == rows[picked]["tflops"]
        for r in rows.values():  # TB/s and ms agree: K+V bytes over the median
            assert r["tflops"] == pytest.approx(prob.kv_bytes / (r["median_ms"] * 1e-3) / 1e12, rel=1e-4)


@pytest.fixture
def lookup_env(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    monkeypatch.setenv("FA4_DB", f"sqlite:///{db}")
    monkeypatch.setenv(lookup.DEVICE_ENV, "replay of NVIDIA H200")
    monkeypatch.delenv(lookup.URL_ENV, raising=False)
    monkeypatch.delenv(lookup.LOCAL_DB_ENV, raising=False)
    lookup.reset()
    yield db
    lookup.reset()


def _tune(db, prob, trials=12):
    with ResultsStore.open(f"sqlite:///{db}") as store:
        return Tuner(SPEC, prob, store=store, trials=trials, runner=InProcessRunner(), verify_rounds=3).run()


def test_study_finds_8_splits_at_batch_1_8k_and_the_lookup_serves_it(lookup_env):
    prob = decode(1, 8192)
    res = _tune(lookup_env, prob)
    assert res.default["config"]["num_splits"] == 0  # the heuristic is what tuning beat
    assert res.best["config"]["num_splits"] == 8
    assert res.best["tflops"] == 1.291 and res.default["tflops"] == 1.253
    assert res.served["config"]["num_splits"] == 8 and res.served["significant"]
    assert res.speedup == pytest.approx(1.291 / 1.253)
    # Every recorded config was measured (9 splits + the heuristic: the budget covers them).
    assert res.measured == 10

    why = lookup.explain_problem(prob, SM90)
    assert why.provenance == "local-db", str(why)
    assert why.config.num_splits == 8
    assert why.tflops == 1.291
    assert [s.outcome for s in why.steps if s.source == "local-db"] == ["used"]
    assert "verdict" in next(s.detail for s in why.steps if s.source == "local-db")
    # Asked once per (problem, arch, timing): the second answer is the in-process cache's.
    assert lookup.resolve_decode_config(prob, SM90) is why.config
    assert lookup.explain_problem(prob, SM90).steps[0].source == "cache"

    # fa4.explain_decode from the call's tensors (their shapes only) names the same source.
    import torch

    import fa4

    k = torch.empty(32, 256, 8, 128, dtype=torch.bfloat16)
    by_tensors = fa4.explain_decode(torch.empty(1, 1, 32, 128, dtype=torch.bfloat16), k, k,
                                    torch.empty(1, dtype=torch.int32), torch.zeros(1, 32, dtype=torch.int32))
    assert by_tensors.provenance == "cache" or by_tensors.config == why.config
    assert by_tensors.config.num_splits == 8 and "local-db" in str(by_tensors)

    # Another shape, another page size or a stale kernel source: not this row.
    for other in (decode(2, 8192), decode(1, 8192, page=64)):
        assert lookup.explain_problem(other, SM90).provenance == "default"


def test_where_the_heuristic_is_best_the_default_stays(lookup_env):
    for prob, splits in ((decode(4, 8192), 4), (decode(1, 32768), 16)):
        res = _tune(lookup_env, prob)
        assert res.best["config"]["num_splits"] in (0, splits)
        assert res.served is None  # nothing beat the default: no verdict to serve
        why = lookup.explain_problem(prob, SM90)
        # The fastest row is the heuristic's own (num_splits=0) or its twin: what a launch does anyway.
        assert why.provenance == "local-db" and why.config.num_splits in (0, splits)


def test_the_decode_plan_resolves_through_the_lookup_once(lookup_env, fake, monkeypatch):  # noqa: F811
    """fa4.flash_attn_with_kvcache with the kernels faked (tests/fa4/test_decode_host.py's CPU model):
    its plan takes the tuned split count from the local DB, asks once per plan key, and the output
    of the 8-split launch matches the fp32 reference."""
    import math

    import torch

    import fa4
    from fa4 import decode as fa4_decode
    from tests.fa4 import decode_ref

    _tune(lookup_env, decode(1, 8192))
    asked = []
    resolve = lookup.resolve_decode_config
    monkeypatch.setattr(lookup, "resolve_decode_config", lambda *a: asked.append(a) or resolve(*a))
    q, k, v, seqlens, table = decode_ref.make_case(1, 1, 32, 8, 128, [8192], 256, spare_pages=0)
    for _ in range(3):
        out, lse = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, return_lse=True)
    (plan,) = fa4_decode._plans.values()
    assert plan.num_splits == 8 and plan.config.num_splits == 8 and plan.workspace[0] == 8
    assert asked == [(decode(1, 8192), SM90)]
    assert [launch[1] for launch in fake.launches if launch[0] == "decode"] == [8, 8, 8]
    ok, info = decode_ref.errors(out, lse, q, k, v, [8192], table, False, 1 / math.sqrt(128))
    assert ok, info
    # The call's own num_splits still wins over the tuned one.
    fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, num_splits=2)
    assert sorted(p.num_splits for p in fa4_decode._plans.values()) == [2, 8]
    assert torch.isfinite(out.float()).all()


# ---------------------------------------------------------------- the command line
def test_cli_decode_grid_and_without_gpu_report():
    from tuner.cli import build_parser, problems_from_args

    a = build_parser().parse_args(["--decode", "--batch", "1,4", "--seqlen-k", "8192,32768", "--heads", "32",
                                   "--heads-kv", "8", "--hdim", "128", "--page-size", "256"])
    assert problems_from_args(a) == [decode(b, kv) for b in (1, 4) for kv in (8192, 32768)]
    r = fa4_tune("--decode", "--batch", "1", "--seqlen-k", "32768", "--heads", "32", "--heads-kv", "8", "--hdim",
                 "128", "--page-size", "256", "--json", "--trials", "1")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    prob = decode(1, 32768)
    assert rep["provider"] == "fa4-decode" and rep["problem"] == prob.to_dict()
    assert rep["feasible"] == len(get_provider("fa4-decode").feasible_configs(prob, SM90))
    assert rep["default"]["config"]["num_splits"] == 0
    bad = fa4_tune("--decode", "--seqlen-k", "8192", "--heads", "32", "--hdim", "128", "--window", "8,0")
    assert bad.returncode == 2 and "--decode takes" in bad.stderr
    bad = fa4_tune("--seqlen", "8192", "--hdim", "128", "--page-size", "256")
    assert bad.returncode == 2 and "apply to --decode" in bad.stderr
