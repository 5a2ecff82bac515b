"""Tuning packed varlen problems on CPU: the packed lengths and their FLOPs, the harness's packed
inputs and per-sequence check, the providers' argument mapping with the launch faked (the kernels
replaced by the per-sequence models of tests/fa4/test_varlen_host.py and test_varlen_bwd_host.py),
a tuner run end to end, and the command line / shapes file spellings."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random

import pytest
import torch

from fa4.arch import SM90
from fa4.problem import Problem, varlen_lengths, visible_pairs
from providers import get_provider, harness
from providers.fa4_provider import Fa4Provider
from tests.tuner.fake_providers import OffGpuH200
from providers.harness import OK, Settings, passes_error_rule

ISSUE = Problem(8, 4096, 4096, 16, 16, 128, 128, causal=True, varlen=True, varlen_mean_q=2048, varlen_mean_k=2048)
# Small enough for the CPU models: 3 sequences (1, 127, 160 rows), GQA, causal.
SMALL = Problem(3, 160, 160, 4, 2, 64, 64, causal=True, varlen=True, varlen_mean_q=96, varlen_mean_k=96)


# ---- the packed lengths ----------------------------------------------------------------


def test_varlen_lengths_match_count_max_mean_and_are_deterministic():
    assert varlen_lengths(8, 4096, 2048) == (1, 586, 1171, 1755, 2340, 2925, 3510, 4096)
    assert varlen_lengths(1, 300, 300) == (300,)
    assert varlen_lengths(4, 50, 50) == (50, 50, 50, 50)
    rng = random.Random(0)
    for _ in range(3000):
        b, top = rng.randint(1, 80), rng.randint(1, 9000)
        mean = rng.randint(1, top)
        if mean * b < top + b - 1 or (b == 1 and mean != top):
            with pytest.raises(ValueError, match="mean"):
                varlen_lengths(b, top, mean)
            continue
        lens = varlen_lengths(b, top, mean)
        assert len(lens) == b and max(lens) == top and lens[-1] == top and min(lens) >= 1
        assert sum(lens) == b * mean and round(sum(lens) / b) == mean  # what fa4.varlen.problem_of computes
        assert list(lens) == sorted(lens)
        varlen_lengths.cache_clear()
        assert varlen_lengths(b, top, mean) == lens  # recomputed, not cached: the same
    for bad in ((0, 10, 5), (3, 10, 11), (3, 10, 0), (2, 10, True)):
        with pytest.raises(ValueError):
            varlen_lengths(*bad)


def test_problem_varlen_seqlens_pair_the_two_sides():
    p = dataclasses.replace(SMALL, seqlen_k=200, varlen_mean_k=150)
    lens_q, lens_k = p.varlen_seqlens()
    assert lens_q == varlen_lengths(3, 160, 96) and lens_k == varlen_lengths(3, 200, 150)
    with pytest.raises(ValueError, match="varlen problems"):
        Problem.standard(1024, 64).varlen_seqlens()


def _sequence_flops(lq, lk, p):
    """One sequence by the FlashAttention convention: a window counts its visible pairs, causal
    halves the rectangle, bwd = 2.5x."""
    if p.has_window:
        pairs = visible_pairs(lq, lk, lk - lq, p.window_left if p.window_left >= 0 else None,
                              p.window_right if p.window_right >= 0 else None)
    else:
        pairs = lq * lk / (2 if p.causal else 1)
    return 2.0 * p.heads_q * pairs * (p.head_dim + p.head_dim_v) * (2.5 if p.pass_ == "bwd" else 1.0)


@pytest.mark.parametrize("problem", [
    ISSUE, dataclasses.replace(ISSUE, causal=False, pass_="bwd"),
    dataclasses.replace(SMALL, causal=False, window_left=40, window_right=7),
    dataclasses.replace(SMALL, seqlen_k=200, varlen_mean_k=150, head_dim_v=64),
], ids=["issue-causal", "full-bwd", "window", "sq!=sk"])
def test_varlen_flops_sum_over_the_sequences(problem):
    lens_q, lens_k = problem.varlen_seqlens()
    want = sum(_sequence_flops(a, b, problem) for a, b in zip(lens_q, lens_k))
    assert problem.flops == pytest.approx(want, rel=1e-12)
    assert harness.tflops(problem, 2.0) == pytest.approx(want / 2e-3 / 1e12)
    if problem is ISSUE:
        # Not B sequences of the mean length: sum L^2 > B mean^2 for unequal lengths.
        padded_mean = 8 * 16 * 2048 * 2048 * 2 * 256 / 2
        assert want == pytest.approx(2 * 16 * 256 * sum(x * x for x in lens_q) / 2) and want > 1.4 * padded_mean


def test_unmeetable_mean_is_refused_by_providers_and_estimated_in_flops():
    p = Problem(4, 1000, 1000, 4, 4, 64, 64, varlen=True, varlen_mean_q=100, varlen_mean_k=100)  # < (1000+3)/4
    errs = Fa4Provider().problem_errors(p)
    assert len(errs) == 1 and errs[0].startswith("varlen: 4 sequences with a longest of 1000") and "251" in errs[0]
    assert p.flops == pytest.approx(4 * Problem(1, 100, 100, 4, 4, 64, 64).flops)


def test_which_providers_measure_varlen():
    assert Fa4Provider().problem_errors(ISSUE) == []
    assert Fa4Provider().problem_errors(dataclasses.replace(ISSUE, pass_="bwd", deterministic=True)) == []
    assert get_provider("flash-attn-4").problem_errors(ISSUE) == []
    # The SDPA peers would time B padded sequences of the longest length: refused.
    (why,) = get_provider("cudnn").problem_errors(ISSUE)
    assert why.startswith("cudnn does not take varlen")
    assert not get_provider("flash-attn-4").supports_compile_only(ISSUE)


def test_compile_variant_is_the_varlen_launch_key():
    from fa4.sm90.bwd_config import BwdConfigSm90

    p = Fa4Provider()
    fwd_cfg = p.default_config(ISSUE, SM90)
    key = p.compile_variant(ISSUE, fwd_cfg)
    assert key.varlen and not key.has_lse and not (key.seqused_q or key.seqused_k)
    dense = dataclasses.replace(ISSUE, varlen=False, varlen_mean_q=0, varlen_mean_k=0)
    assert not p.compile_variant(dense, fwd_cfg).varlen
    bwd = dataclasses.replace(ISSUE, pass_="bwd")
    bkey = p.compile_variant(bwd, BwdConfigSm90())
    assert bkey.varlen and bkey.causal


# ---- the harness's packed inputs and check ----------------------------------------------


def test_packed_inputs_and_their_cu_seqlens():
    p = dataclasses.replace(SMALL, seqlen_k=200, varlen_mean_k=150, pass_="bwd")
    q, k, v, do = harness.make_inputs(p, seed=3, device="cpu")
    assert q.shape == (288, 4, 64) and k.shape == (450, 2, 64) and v.shape == (450, 2, 64) and do.shape == q.shape
    args = harness.varlen_args(p, "cpu")
    assert args["cu_seqlens_q"].dtype == torch.int32
    assert args["cu_seqlens_q"].tolist() == [0, 1, 128, 288]
    assert args["cu_seqlens_k"].tolist() == [0, *itertools.accumulate(varlen_lengths(3, 200, 150))]
    assert (args["max_seqlen_q"], args["max_seqlen_k"]) == (160, 200)
    assert not torch.equal(q, harness.make_inputs(p, seed=4, device="cpu")[0])


def _packed_reference(problem, q, k, v):
    """fp32 attention of each packed sequence on its own, bottom-right causal per sequence."""
    lens_q, lens_k = problem.varlen_seqlens()
    g = problem.heads_q // problem.heads_kv
    outs, a, ka = [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        qs, ks, vs = q[None, a:a + lq], k[None, ka:ka + lk], v[None, ka:ka + lk]
        outs.append(harness.reference_attention(problem, qs, ks.repeat_interleave(g, 2), vs.repeat_interleave(g, 2),
                                                upcast=True)[0])
        a, ka = a + lq, ka + lk
    return torch.cat(outs)


def test_fwd_check_compares_each_sequence_on_its_own():
    s = Settings(check_batches=3, check_heads=2)
    q, k, v, _ = harness.make_inputs(SMALL, seed=0, device="cpu")
    good = _packed_reference(SMALL, q, k, v).to(torch.bfloat16)
    err, ref_err = harness.fwd_errors(SMALL, good, q, k, v, s)
    assert ref_err > 0 and passes_error_rule(err, ref_err, s.atol)
    # The dense (padded, unmasked across sequences) answer is wrong: the mask is per sequence.
    g = SMALL.heads_q // SMALL.heads_kv
    whole = harness.reference_attention(dataclasses.replace(SMALL, varlen=False, varlen_mean_q=0, varlen_mean_k=0,
                                                            batch=1, seqlen_q=288, seqlen_k=288),
                                        q[None], k[None].repeat_interleave(g, 2), v[None].repeat_interleave(g, 2),
                                        upcast=True)[0].to(torch.bfloat16)
    err, ref_err = harness.fwd_errors(SMALL, whole, q, k, v, s)
    assert not passes_error_rule(err, ref_err, s.atol)
    for row in (0, 1, 5, 127, 128, 287):  # one wrong element in each sequence, its first and last rows
        bad = good.clone()
        bad[row, 3, 7] += 0.5
        err, ref_err = harness.fwd_errors(SMALL, bad, q, k, v, s)
        assert err >= 0.4 and not passes_error_rule(err, ref_err, s.atol), row
    # The default sub-sample is the last (longest) sequence.
    bad = good.clone()
    bad[5, 3, 7] += 0.5
    assert passes_error_rule(*harness.fwd_errors(SMALL, bad, q, k, v, Settings()), s.atol)


def test_bwd_check_compares_the_gradients_of_each_sequence():
    p = dataclasses.replace(SMALL, pass_="bwd")
    s = Settings(check_batches=3, check_heads=2)
    q, k, v, do = harness.make_inputs(p, seed=1, device="cpu")
    qf, kf, vf = (t.float().requires_grad_(True) for t in (q, k, v))
    o = _packed_reference(p, qf, kf, vf)
    grads = [t.to(torch.bfloat16) for t in torch.autograd.grad(o, (qf, kf, vf), do.float())]
    err, ref_err = harness.bwd_errors(p, grads, q, k, v, do, s)
    assert passes_error_rule(err, ref_err, s.atol)
    for which, index in ((0, (60, 3, 5)), (1, (130, 1, 3)), (2, (0, 0, 0))):
        bad = [t.clone() for t in grads]
        bad[which][index] += 1.0
        err, ref_err = harness.bwd_errors(p, bad, q, k, v, do, s)
        assert err >= 0.9 and not passes_error_rule(err, ref_err, s.atol), which


# ---- the providers with the launch faked ------------------------------------------------


def install_fake_backward(monkeypatch) -> list:
    """fa4.sm90.bwd_launch's varlen kernels replaced by tests/fa4/test_varlen_bwd_host.py's models
    (``monkeypatch``: anything with monkeypatch's setattr). Returns the keys built, in order."""
    from fa4.sm90 import bwd_launch
    from tests.fa4 import test_varlen_bwd_host as models

    built = []

    def compiled(key, build):
        built.append(key)
        return models.model_for(key)

    monkeypatch.setattr(bwd_launch, "compiled", compiled)
    monkeypatch.setattr(bwd_launch, "_on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(bwd_launch, "_varlen_plans", {})
    return built


@pytest.fixture
def fake_gpu(monkeypatch):
    """Both directions of the varlen launch faked; returns (forward keys, backward keys)."""
    from tests.fa4.test_varlen_host import install_fake_forward

    return install_fake_forward(monkeypatch), install_fake_backward(monkeypatch)


def test_fa4_make_fwd_runs_the_varlen_kernel_with_the_given_config(fake_gpu):
    from fa4.sm90.compile import compile_time_config

    fwd_keys, _ = fake_gpu
    p = Fa4Provider()
    cfg = dataclasses.replace(p.default_config(SMALL, SM90), tile_n=64)
    assert not p.violations(cfg, SMALL, SM90)
    q, k, v, _ = harness.make_inputs(SMALL, seed=0, device="cpu")
    out = p.make_fwd(SMALL, cfg, q, k, v)()
    assert out.shape == (288, 4, 64)
    err, ref_err = harness.fwd_errors(SMALL, out, q, k, v, Settings(check_batches=3))
    assert passes_error_rule(err, ref_err, 1e-4), (err, ref_err)
    key = fwd_keys[-1]
    assert key == p.compile_variant(SMALL, cfg) and key.config == compile_time_config(cfg) and key.varlen


def test_fa4_make_fwd_bwd_times_the_varlen_backward_with_the_given_config(fake_gpu):
    from fa4.sm90.bwd_compile import BwdKernelKey
    from fa4.sm90.bwd_config import BwdConfigSm90

    _, bwd_keys = fake_gpu
    p = Fa4Provider()
    problem = dataclasses.replace(SMALL, pass_="bwd")
    cfg = dataclasses.replace(p.default_config(problem, SM90), dkv_store="direct")
    assert not p.violations(cfg, problem, SM90)
    q, k, v, do = harness.make_inputs(problem, seed=2, device="cpu")
    run = p.make_fwd_bwd(problem, cfg, q, k, v, do)
    assert bwd_keys == []  # the forward ran when it was built; the backward is what run() times
    grads = run()
    err, ref_err = harness.bwd_errors(problem, grads, q, k, v, do, Settings(check_batches=3))
    assert passes_error_rule(err, ref_err, 1e-4), (err, ref_err)
    main = [key for key in bwd_keys if isinstance(key, BwdKernelKey)]
    assert main == [p.compile_variant(problem, cfg)] and main[0].varlen and main[0].gqa
    run()  # timed again: the same plan
    assert len([key for key in bwd_keys if isinstance(key, BwdKernelKey)]) == 1
    # 'loop' is refused by the backward's violations() because the problem is varlen.
    loop = dataclasses.replace(cfg, gqa_reduce="loop")
    assert any("varlen" in str(r) for r in p.violations(loop, problem, SM90))
    assert p.knob_cls_for(problem) is BwdConfigSm90


def test_flash_attn_varlen_func_takes_the_configs(fake_gpu):
    import fa4
    from fa4.sm90.compile import compile_time_config
    from fa4.sm90.fwd_config import FwdConfigSm90

    fwd_keys, _ = fake_gpu
    q, k, v, _ = harness.make_inputs(SMALL, seed=0, device="cpu")
    args = harness.varlen_args(SMALL, "cpu")
    cfg = FwdConfigSm90(tile_m=128, tile_n=96)
    fa4.flash_attn_varlen_func(q, k, v, causal=True, config=cfg, **args)
    assert fwd_keys[-1].config == compile_time_config(cfg)
    fa4.flash_attn_varlen_func(q, k, v, causal=True, config={"tile_n": 64}, **args)
    assert fwd_keys[-1].config.tile_n == 64
    with pytest.raises(NotImplementedError, match="bwd_config"):
        fa4.flash_attn_varlen_func(q[None], k[None], v[None], bwd_config={"tile_m": 64})


def test_flash_attn4_maps_the_packed_arguments(monkeypatch):
    from providers import flash_attn4

    calls = []

    class Ref:
        @staticmethod
        def _flash_attn_fwd(q, k, v, **kw):
            calls.append(("fwd", kw))
            return (q, None)

        @staticmethod
        def flash_attn_varlen_func(q, k, v, **kw):
            calls.append(("varlen", kw))
            return (q * 1, None)

    monkeypatch.setattr(flash_attn4, "_import_reference", lambda: Ref)
    p = get_provider("flash-attn-4")
    q, k, v, _ = harness.make_inputs(SMALL, seed=0, device="cpu")
    p.make_fwd(SMALL, flash_attn4.RefFa4FwdKnobs(128, 96), q, k, v)()
    kind, kw = calls[-1]
    assert kind == "fwd" and kw["tile_mn"] == (128, 96) and kw["causal"]
    assert kw["cu_seqlens_q"].tolist() == [0, 1, 128, 288] and kw["cu_seqlens_k"].tolist() == [0, 1, 128, 288]
    assert (kw["max_seqlen_q"], kw["max_seqlen_k"]) == (160, 160)
    bwd = dataclasses.replace(SMALL, pass_="bwd", deterministic=True)
    q, k, v, do = harness.make_inputs(bwd, seed=0, device="cpu")
    p.make_fwd_bwd(bwd, None, q, k, v, do)
    kind, kw = calls[-1]
    assert kind == "varlen" and kw["deterministic"] and kw["causal"] and kw["max_seqlen_k"] == 160
    assert kw["cu_seqlens_k"].tolist() == [0, 1, 128, 288]


# ---- measure() and a tuner run end to end ------------------------------------------------


def cpu_measuring(monkeypatch):
    """harness.measure on CPU tensors: no device synchronisation, and a timing loop that runs the
    callable once and reports 2 ms per rep."""
    make_inputs = harness.make_inputs
    monkeypatch.setattr(harness, "make_inputs", lambda p, seed: make_inputs(p, seed, device="cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(harness, "time_callable", lambda fn, settings: (fn(), [2.0, 2.1, 1.9])[1])


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_measure_checks_and_counts_a_varlen_problem(fake_gpu, monkeypatch, pass_):
    cpu_measuring(monkeypatch)
    problem = dataclasses.replace(SMALL, pass_=pass_)
    p = Fa4Provider()
    m = p.measure(problem, p.default_config(problem, SM90), Settings(check_batches=3))
    assert m.status == OK, m.reason
    assert m.median_ms == 2.0 and m.tflops == pytest.approx(problem.flops / 2e-3 / 1e12)
    assert passes_error_rule(m.error, m.ref_error, 1e-4)


class CpuFa4(OffGpuH200, Fa4Provider):
    """Provider fa4 (its knobs, feasibility, varlen argument mapping) measuring on CPU with the
    launch faked by the tests' per-sequence kernel models."""


def test_a_tuner_run_on_a_varlen_problem(fake_gpu, monkeypatch, tmp_path):
    from store import ResultsStore
    from tuner.study import Tuner
    from tuner.worker import InProcessRunner

    cpu_measuring(monkeypatch)
    problem = dataclasses.replace(SMALL, pass_="bwd")
    store = ResultsStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        t = Tuner(CpuFa4(), problem, store=store, runner=InProcessRunner(), trials=4, verify_rounds=0,
                  provider_spec="plugin:tests.tuner.test_varlen_tuning:CpuFa4")
        res = t.run()
        assert res.trials == 4 and res.default["status"] == "ok", res.default
        rows = store.measurements(study_name=t.name)
        ok = [r for r in rows if r["status"] == "ok"]
        assert ok and all(r["tflops"] == pytest.approx(problem.flops / 2e-3 / 1e12) for r in ok)
        assert all(passes_error_rule(r["error"], r["ref_error"], 1e-4) for r in ok)
        assert Problem.from_dict(res.problem) == problem and res.problem["varlen_mean_q"] == 96
        # Served back for the packed problem, never for the dense one of the same sizes.
        assert store.best("faked H200", "fa4", problem) is not None
        dense = dataclasses.replace(problem, varlen=False, varlen_mean_q=0, varlen_mean_k=0)
        assert store.best("faked H200", "fa4", dense) is None
    finally:
        store.close()


# ---- command line and shapes files -------------------------------------------------------


def _problems(argv: str):
    from tuner.cli import build_parser, problems_from_args

    return problems_from_args(build_parser().parse_args(argv.split()))


def test_cli_varlen_mean():
    (p,) = _problems("--batch 8 --seqlen 4096 --hdim 128 --heads 16 --causal --varlen-mean 2048")
    assert p == ISSUE
    (p,) = _problems("--seqlen 4096 --seqlen-k 2048 --hdim 128 --varlen-mean 1024 --pass bwd")
    assert (p.batch, p.varlen_mean_q, p.varlen_mean_k, p.pass_) == (16, 1024, 512, "bwd")  # 16k tokens in all
    (p,) = _problems("--batch 4 --seqlen 512 --seqlen-k 600 --hdim 64 --varlen-mean 300,400")
    assert (p.varlen, p.varlen_mean_q, p.varlen_mean_k) == (True, 300, 400)
    for bad in ("--varlen-mean 0", "--varlen-mean 1,2,3", "--varlen-mean x"):
        with pytest.raises(SystemExit):
            _problems(f"--seqlen 512 --hdim 64 {bad}")
    with pytest.raises(SystemExit):
        _problems("--decode --seqlen-k 4096 --hdim 128 --heads 8 --varlen-mean 100")
    from tuner.cli import build_parser

    assert "--varlen-mean" in build_parser().format_help()


def test_cli_refuses_an_unmeetable_varlen_mean(tmp_path):
    from tests.tuner.test_cli import fa4_tune

    r = fa4_tune("--provider", "fa4", "--batch", "4", "--seqlen", "1000", "--hdim", "64", "--varlen-mean", "100",
                 "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert r.returncode == 2 and "varlen: 4 sequences with a longest of 1000" in r.stderr, r.stderr
    r = fa4_tune("--provider", "cudnn", "--batch", "8", "--seqlen", "4096", "--hdim", "128", "--varlen-mean", "2048",
                 "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert r.returncode == 2 and "cudnn does not take varlen" in r.stderr, r.stderr


def test_shapes_files_spell_varlen(tmp_path):
    from tuner.shapes import load_shapes

    f = tmp_path / "s.csv"
    f.write_text("seqlen,hdim,batch,heads,causal,varlen_mean\n4096,128,8,16,1,2048\n1024,64,,,0,\n")
    packed, dense = load_shapes(f, {})
    assert packed == ISSUE and not dense.varlen and dense.batch == 16
    f.write_text("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,head_dim_v,causal,varlen,varlen_mean_q,"
                 "varlen_mean_k\n8,4096,4096,16,16,128,128,true,true,2048,2048\n2,512,512,4,4,64,64,false,false,0,0\n")
    packed, dense = load_shapes(f, {})
    assert packed == ISSUE and dense == Problem(2, 512, 512, 4, 4, 64, 64)
    # The command line's --varlen-mean makes the file's shapes varlen.
    (p,) = load_shapes(_write(tmp_path, "seqlen,hdim,batch,heads,causal\n4096,128,8,16,1\n"),
                       {"varlen": True, "varlen_mean_q": 2048})
    assert p == ISSUE
    with pytest.raises(ValueError, match="varlen_mean"):
        load_shapes(_write(tmp_path, "seqlen,hdim,varlen_mean\n4096,128,-3\n"), {})


def _write(tmp_path, text):
    f = tmp_path / "t.csv"
    f.write_text(text)
    return f


def test_shape_label_says_varlen():
    from tuner.cli import _shape_label

    assert _shape_label(ISSUE).endswith("causal varlen mean 2048")
    assert "varlen mean 96,150" in _shape_label(dataclasses.replace(SMALL, seqlen_k=200, varlen_mean_k=150))


def test_cli_without_gpu_counts_the_varlen_space_and_compiles_its_kernel(tmp_path):
    """fa4-tune on a varlen problem on a machine without a GPU: the packed problem's space (persistent
    off: the varlen kernel runs a CTA per tile) and a real sm_90a compile of the varlen kernel."""
    import json

    from fa4.knobs import iter_configs
    from fa4.sm90 import fwd_config
    from tests.tuner.test_cli import fa4_tune

    r = fa4_tune("--provider", "fa4", "--batch", "8", "--seqlen", "4096", "--hdim", "128", "--causal",
                 "--varlen-mean", "2048", "--trials", "1", "--json", "--db", f"sqlite:///{tmp_path / 'r.db'}",
                 timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert Problem.from_dict(rep["problem"]) == ISSUE
    # The problem's space (no softcap: tanh_fma_frac at 0; no exp2 pattern at fraction 0 but the default).
    feasible = [c for c in iter_configs(fwd_config.FwdConfigSm90, ISSUE) if not fwd_config.violations(c, ISSUE, SM90)]
    assert rep["feasible"] == len(feasible) and not any(c.persistent for c in feasible)
    assert rep["compile"]["compiled"] == 1 and rep["compile"]["ok"] == 1 and rep["compile"]["errors"] == []


def test_fa4_tune_on_a_fake_gpu_tunes_a_varlen_problem(tmp_path):
    """fa4-tune --varlen-mean as a user runs it on a GPU machine (tests/fakegpu): the lock, the
    measuring process (the launch faked there: tests/tuner/fake_providers.FakedLaunchFa4), the study,
    the results DB and the report, for the packed problem."""
    from store import ResultsStore
    from tests.fakegpu import sitecustomize as fakegpu
    from tests.tuner.test_gpu_paths import on_fake_gpus

    db = f"sqlite:///{tmp_path}/tune.db"
    r = on_fake_gpus(1, "--batch", "3", "--seqlen", "160", "--hdim", "64", "--heads", "4", "--heads-kv", "2",
                     "--causal", "--varlen-mean", "96", "--pass", "bwd", "--trials", "3", "--verify-rounds", "0",
                     "--provider", "plugin:tests.tuner.fake_providers:FakedLaunchFa4", "--db", db, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    problem = dataclasses.replace(SMALL, pass_="bwd")
    assert r.stdout.splitlines()[0] == f"fa4 on {fakegpu.NAME}: {problem.key()}"
    tflops = problem.flops / 2e-3 / 1e12
    assert f"default: {tflops:.1f} TFLOP/s, median 2.0000 ms" in r.stdout, r.stdout
    with ResultsStore.open(db) as store:
        rows = store.measurements(provider="fa4")
        assert len(rows) >= 1 and all(r_["status"] == "ok" for r_ in rows), rows
        assert all(r_["tflops"] == pytest.approx(tflops) for r_ in rows)
        assert all(passes_error_rule(r_["error"], r_["ref_error"], 1e-4) for r_ in rows)
        assert store.best(fakegpu.NAME, "fa4", problem) is not None
