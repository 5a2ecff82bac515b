"""Provider "fa4" for both passes on CPU: knob class per pass, search space, study and DB, compile-only."""

from __future__ import annotations

import dataclasses
import json

import optuna
import pytest

from fa4.arch import SM90
from fa4.knobs import config_from_dict, config_to_dict, iter_configs, json_schema, knob_specs, space_size
from fa4.problem import Problem
from fa4.sm90 import bwd_config, bwd_defaults, fwd_config
from fa4.sm90.bwd_compile import compile_key as bwd_compile_key
from fa4.sm90.bwd_config import BwdConfigSm90
from fa4.sm90.fwd_config import FwdConfigSm90
from store import ResultsStore
from tests.tuner.test_cli import fa4_tune
from providers.harness import OK, Measurement
from providers import get_provider
from providers.fa4_provider import Fa4Provider
from tests.tuner.fake_providers import OffGpuH200
from tuner.study import Tuner, check_without_gpu, open_storage
from tuner.worker import InProcessRunner

FWD = Problem.standard(4096, 128)
BWD = Problem.standard(4096, 128, pass_="bwd")
BWD_DET = Problem.standard(4096, 64, pass_="bwd", deterministic=True, causal=True)
BWD_GQA = Problem.standard(4096, 64, pass_="bwd", heads_kv=8)


def test_knob_class_follows_the_pass():
    p = get_provider("fa4")
    assert p.passes == ("fwd", "bwd")
    assert p.knob_cls_for(FWD) is FwdConfigSm90 and p.knob_cls_for(BWD) is BwdConfigSm90
    assert p.knob_cls_for(BWD_DET) is BwdConfigSm90
    # A forward config offered for a backward problem (or the reverse) is refused by name.
    assert p.violations(FwdConfigSm90(), BWD, SM90) == ["a bwd config of fa4 is a BwdConfigSm90, got FwdConfigSm90"]
    assert "FwdConfigSm90" in p.violations(BwdConfigSm90(), FWD, SM90)[0]
    assert p.problem_errors(Problem.standard(4096, 80, pass_="bwd")) == [
        "head_dim 80 not supported by fa4's bwd (supported: (64, 96, 128, 192, 256))"]
    # Both passes take the wider head dims (and 192 with head_dim_v 128), and only those pairs.
    for hd, hdv in ((96, 96), (192, 192), (192, 128), (256, 256)):
        for pass_ in ("fwd", "bwd"):
            assert p.problem_errors(Problem.standard(4096, hd, head_dim_v=hdv, pass_=pass_)) == []
    assert p.problem_errors(Problem.standard(4096, 256, head_dim_v=128, pass_="bwd")) == [
        "fa4's bwd needs head_dim_v in (256,) at head_dim 256"]
    assert p.problem_errors(Problem.standard(4096, 256, head_dim_v=128)) == [
        "fa4's fwd needs head_dim_v in (256,) at head_dim 256"]
    assert p.problem_errors(Problem.standard(4096, 80)) == [
        "head_dim 80 not supported by fa4's fwd (supported: (64, 96, 128, 192, 256))"]


# The whole backward declaration walked once (BWD, 24M configs since walk_down) takes 6-10 min on two
# busy CPUs: past the suite's 600 s per test.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("problem", [BWD, BWD_DET, BWD_GQA])
def test_bwd_search_space_is_the_bwd_declaration(problem):
    p = get_provider("fa4")
    feasible = p.feasible_configs(problem, SM90)
    # The whole declaration walked once (BWD); the other problems from their own space, which
    # tests/fa4/test_knob_applies.py checks keeps every feasible config.
    want = [c for c in iter_configs(BwdConfigSm90, None if problem is BWD else problem)
            if not bwd_config.violations(c, problem, SM90)]
    assert feasible == want and feasible
    default = p.default_config(problem, SM90)
    assert default == bwd_defaults.default_config(problem, SM90) and default in feasible
    # Runtime knobs share a compiled kernel; GQA (fp32 dK/dV accumulators) is another kernel.
    for c in feasible[:5]:
        assert p.compile_variant(problem, c) == bwd_compile_key(
            problem.dtype, problem.head_dim, problem.causal, problem.heads_q != problem.heads_kv,
            problem.deterministic, c)
    variants = {p.compile_variant(problem, c) for c in feasible}
    assert len(variants) < len(feasible)
    for name in BwdConfigSm90.RUNTIME_KNOBS:
        for value in dict((s.name, s.choices) for s in knob_specs(BwdConfigSm90))[name]:
            changed = dataclasses.replace(default, **{name: value})
            assert p.compile_variant(problem, changed) == p.compile_variant(problem, default)
    gqa_key = p.compile_variant(BWD_GQA, default)
    assert gqa_key.gqa and not p.compile_variant(Problem.standard(4096, 64, pass_="bwd"), default).gqa


def test_fwd_pass_is_unchanged():
    p = get_provider("fa4")
    # (iter_configs with the problem skips tanh_fma_frac's infeasible values: tests/fa4/test_knob_applies.py.)
    assert p.feasible_configs(FWD, SM90) == [c for c in iter_configs(FwdConfigSm90, FWD)
                                             if not fwd_config.violations(c, FWD, SM90)]
    assert p.default_config(FWD, SM90) == fwd_config.default_config(FWD, SM90)


def test_check_without_gpu_counts_the_bwd_space():
    p = get_provider("fa4")
    rep = check_without_gpu(p, BWD_DET, compile_configs=False)
    # The problem's space: MHA, not varlen, head_dim 64, deterministic, so gqa_reduce, gqa_finish,
    # varlen_grid, the hd192/256 knobs (dp_first, dk_before_dq, qm_tile_n's four values, do_single) and
    # q_starts' four values at their defaults only (a 1024th of the declaration's before stat_shuffle
    # and gqa_add, which double it each; gqa_add applies to GQA only); stat_shuffle applies (head_dim 64) but takes both values only where its
    # requires holds (tile_m 128, 'bulk', 'keys', no exchange: 1 config in 24), so 25/24 of that.
    n = len(list(iter_configs(BwdConfigSm90, BWD_DET)))
    assert n == space_size(BwdConfigSm90) // 4096 * 25 // 24 == rep["space"] // 4096 * 25 // 24
    n_ok = len([c for c in iter_configs(BwdConfigSm90, BWD_DET) if not bwd_config.violations(c, BWD_DET, SM90)])
    assert (rep["configs"], rep["feasible"], rep["infeasible"]) == (n, n_ok, n - n_ok)
    assert rep["default"]["config"] == config_to_dict(bwd_defaults.default_config(BWD_DET, SM90))
    assert rep["default"]["violations"] == [] and rep["problem"]["pass"] == "bwd"


class SyntheticFa4(OffGpuH200, Fa4Provider):
    """Provider fa4 with its knobs and feasibility, timed by a formula instead of a GPU."""

    device_name = "synthetic H200"

    def measure(self, problem, config, settings):
        assert isinstance(config, self.knob_cls_for(problem)), type(config)
        # Distinct per config: its position in the declaration's space (iter_configs' order).
        rank = 0
        for spec in knob_specs(type(config)):
            rank = rank * len(spec.choices) + spec.choices.index(getattr(config, spec.name))
        return Measurement(OK, samples_ms=[1.0], median_ms=1.0, iqr_ms=0.0, tflops=300.0 + rank / 10)


def test_a_bwd_study_suggests_and_stores_bwd_configs(tmp_path):
    store = ResultsStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        t = Tuner(SyntheticFa4(), BWD_DET, store=store, runner=InProcessRunner(), trials=25,
                  provider_spec="plugin:tests.tuner.test_fa4_provider:SyntheticFa4")
        assert t.knob_cls is BwdConfigSm90
        res = t.run()
        study = optuna.load_study(study_name=t.name, storage=open_storage(t.storage_spec))
        names = sorted(s.name for s in knob_specs(BwdConfigSm90))
        assert res.trials == 25 and all(sorted(tr.params) == names for tr in study.trials)
        assert res.default["config"] == config_to_dict(bwd_defaults.default_config(BWD_DET, SM90))
        rows = store.measurements(study_name=t.name)
        assert len(rows) == res.measured + sum(r["status"] == "infeasible" for r in rows)
        for r in rows:
            cfg = config_from_dict(BwdConfigSm90, r["config"])
            assert store.get_config(r["config_id"])["knob_schema"] == json_schema(BwdConfigSm90)
            reasons = bwd_config.violations(cfg, BWD_DET, SM90)
            if r["status"] == "ok":
                assert not reasons
                assert r["tflops"] == SyntheticFa4().measure(BWD_DET, cfg, None).tflops
            else:
                assert r["status"] == "infeasible" and r["reason"] == "; ".join(reasons)
        top = max((r for r in rows if r["status"] == "ok"), key=lambda r: r["tflops"])
        assert res.best["config"] == top["config"]
        assert store.best("synthetic H200", "fa4", BWD_DET)["config"] == top["config"]
    finally:
        store.close()


def test_a_config_with_an_inert_knob_is_the_default_s_trial(tmp_path):
    """The exp2 pattern has no effect at fraction 0 (its knob's ``inert``): a config that differs
    from the default only there (enqueued by hand, or a warm start from an older study) points at
    the default's measurement instead of measuring the same kernel again, and a report of what a
    config changes leaves the pattern out."""
    store = ResultsStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        t = Tuner(SyntheticFa4(), FWD, store=store, runner=InProcessRunner(), trials=1,
                  provider_spec="plugin:tests.tuner.test_fa4_provider:SyntheticFa4")
        t.run()
        default = config_to_dict(fwd_config.default_config(FWD, SM90))
        assert default["exp2_emu_frac"] == 0.0 and default["exp2_emu_pattern"] == "block"
        alias = {**default, "exp2_emu_pattern": "spread"}
        study = optuna.load_study(study_name=t.name, storage=open_storage(t.storage_spec))
        study.enqueue_trial(alias)
        t2 = Tuner(SyntheticFa4(), FWD, store=store, runner=InProcessRunner(), trials=2,
                   provider_spec="plugin:tests.tuner.test_fa4_provider:SyntheticFa4")
        res = t2.run()
        trials = optuna.load_study(study_name=t.name, storage=open_storage(t.storage_spec)).trials
        assert trials[1].params == alias and trials[1].user_attrs["duplicate_of"] == 0
        assert res.measured == 1 and len(store.measurements(study_name=t.name)) == 1
        assert t2._changes(alias) == {}
        assert t2._changes({**alias, "tile_n": 96}) == {"tile_n": 96}
    finally:
        store.close()


def test_cli_compile_only_bwd_without_gpu(tmp_path):
    """fa4-tune --pass bwd on a machine without a GPU: the space, and real sm_90a compiles of the backward."""
    r = fa4_tune("--provider", "fa4", "--pass", "bwd", "--deterministic", "--causal", "--seqlen", "2048",
                 "--hdim", "64", "--trials", "2", "--json", "--db", f"sqlite:///{tmp_path / 'r.db'}", timeout=900)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    prob = Problem.standard(2048, 64, pass_="bwd", deterministic=True, causal=True)
    assert Problem.from_dict(rep["problem"]) == prob
    feasible = [c for c in iter_configs(BwdConfigSm90, prob) if not bwd_config.violations(c, prob, SM90)]
    kernels = {bwd_compile_key("bf16", 64, True, False, True, c) for c in feasible}
    assert rep["feasible"] == len(feasible)
    assert rep["compile"]["distinct_kernels"] == len(kernels) and rep["compile"]["compiled"] == 2
    assert rep["compile"]["ok"] == 2 and rep["compile"]["errors"] == []
    assert rep["default"]["config"] == config_to_dict(bwd_defaults.default_config(prob, SM90))
    assert "timing needs a CUDA GPU" in rep["timing"]


def test_bwd_compile_variant_carries_the_features():
    """A backward Problem with issue 18's fields (a window, softcap, a sink) names the kernel the
    launch compiles for it: the same flags as fa4.sm90.bwd_launch's (a right bound under causal,
    or one that hides no key, is no bound)."""
    def feature_problem(causal, window_left=-1, window_right=-1, softcap=0.0, sink=False):
        return dataclasses.replace(Problem.standard(4096, 128, causal=causal, pass_="bwd"), window_left=window_left,
                                   window_right=window_right, softcap=softcap, sink=sink)

    p = get_provider("fa4")
    c = bwd_config.BwdConfigSm90(tile_m=64)
    key = p.compile_variant(feature_problem(False, 1023, 5, 30.0, True), c)
    assert (key.has_window_left, key.has_window_right, key.has_softcap, key.has_sink) == (True, True, True, True)
    key = p.compile_variant(feature_problem(True, 1023, 5), c)
    assert (key.has_window_left, key.has_window_right, key.has_softcap, key.has_sink) == (True, False, False, False)
    plain = p.compile_variant(feature_problem(False, sink=True), c)
    assert plain.has_sink and not (plain.has_window_left or plain.has_window_right or plain.has_softcap)
    # The Mistral-style window (left, 0) is the causal kernel with a left bound.
    mistral = feature_problem(False, 1023, 0)
    key = p.compile_variant(mistral, c)
    assert key.causal and key.has_window_left and not key.has_window_right


def test_varlen_problems_are_measured_packed_not_timed_dense():
    """fa4 takes packed problems (tests/tuner/test_varlen_tuning.py measures them with the launch
    faked); a provider without a packed harness refuses them rather than time padded batches."""
    from fa4.problem import Problem
    from providers.fa4_provider import Fa4Provider

    packed = Problem(8, 4096, 4096, 16, 16, 128, 128, causal=True, varlen=True, varlen_mean_q=2048,
                     varlen_mean_k=2048)
    assert Fa4Provider().varlen and Fa4Provider().problem_errors(packed) == []
    assert any("varlen" in e for e in get_provider("fa2").problem_errors(packed))


def test_the_fa4_provider_times_our_kernels_never_the_auto_dispatch(monkeypatch):
    """flash_attn_func's default provider is "auto"; the tuner's fa4 rows must be ours even where
    the DB holds a faster peer, so every call it builds names provider="fa4" (CPU tensors, the
    call faked: the arguments are what is checked)."""
    import torch

    import fa4

    seen = []

    def fake(q, k, v, **kw):
        seen.append(kw.get("provider"))
        return q.detach().clone().requires_grad_(q.requires_grad)

    monkeypatch.setattr(fa4, "flash_attn_func", fake)
    p = Fa4Provider()
    prob = Problem(batch=1, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=64, head_dim_v=64,
                   causal=True)
    q, k, v, do = (torch.randn(1, 128, 2, 64) for _ in range(4))
    p.make_fwd(prob, p.default_config(prob, SM90), q, k, v)()
    bwd = dataclasses.replace(prob, pass_="bwd")
    p.make_fwd_bwd(bwd, p.default_config(bwd, SM90), q, k, v, do)
    assert seen == ["fa4", "fa4"]
