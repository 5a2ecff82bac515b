"""Harness pure functions on CPU, and (marked) real measurements on a GPU."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from fa4.problem import Problem
from providers import harness
from providers.harness import (
    COMPILE_ERROR,
    INCORRECT,
    OK,
    RUNTIME_ERROR,
    Measurement,
    Settings,
    classify_exception,
    passes_error_rule,
    sample_stats,
)


def test_sample_stats_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 50, 51):
        xs = rng.gamma(3.0, 0.2, size=n).tolist()
        med, iqr = sample_stats(xs)
        assert med == pytest.approx(np.median(xs))
        assert iqr == pytest.approx(np.percentile(xs, 75) - np.percentile(xs, 25))
    with pytest.raises(ValueError):
        sample_stats([])


def test_tflops_follows_flash_attention_convention():
    b, h, s, d = 2, 16, 8192, 128
    p = Problem.standard(s, d)
    assert (p.batch, p.heads_q) == (b, h)
    fwd = 4 * b * h * s * s * d
    assert harness.tflops(p, 1.0) == pytest.approx(fwd / 1e-3 / 1e12)
    pc = Problem.standard(s, d, causal=True)
    assert harness.tflops(pc, 1.0) == pytest.approx(fwd / 2 / 1e-3 / 1e12)
    pb = Problem.standard(s, d, pass_="bwd")
    assert harness.tflops(pb, 2.0) == pytest.approx(2.5 * fwd / 2e-3 / 1e12)


def test_error_rule():
    assert passes_error_rule(4e-3, 2e-3, 1e-4)
    assert passes_error_rule(4.1e-3, 2e-3, 1e-4)
    assert not passes_error_rule(4.2e-3, 2e-3, 1e-4)
    assert not passes_error_rule(math.nan, 2e-3, 1e-4)
    assert not passes_error_rule(math.inf, 2e-3, 1e-4)
    assert not passes_error_rule(1e-3, math.nan, 1e-4)
    assert passes_error_rule(0.0, 0.0, 1e-4)


def test_exception_classification():
    assert classify_exception(ValueError("DSL: shape mismatch"), first_call=True) == COMPILE_ERROR
    assert classify_exception(ValueError("anything"), first_call=False) == RUNTIME_ERROR
    assert classify_exception(RuntimeError("CUDA error: an illegal memory access"), first_call=True) == RUNTIME_ERROR
    m = Measurement(RUNTIME_ERROR, reason=harness.short_reason(RuntimeError("CUDA error: illegal address\nmore")))
    assert harness.is_sticky_cuda_failure(m)
    assert not harness.is_sticky_cuda_failure(Measurement(COMPILE_ERROR, reason="ptxas: too many registers"))
    with pytest.raises(ValueError):
        Measurement("exploded")


def test_reps_scale_with_kernel_time():
    s = Settings(target_ms=300, min_reps=10, max_reps=200)
    assert harness.reps_for(1.5, s) == 200
    assert harness.reps_for(3.0, s) == 100
    assert harness.reps_for(100.0, s) == 10


def test_inputs_are_fresh_normal_never_zero():
    p = Problem(batch=2, seqlen_q=256, seqlen_k=384, heads_q=4, heads_kv=2, head_dim=64, head_dim_v=64,
                pass_="bwd")
    q, k, v, do = harness.make_inputs(p, seed=3, device="cpu")
    assert q.shape == (2, 256, 4, 64) and k.shape == (2, 384, 2, 64) and do.shape == (2, 256, 4, 64)
    assert q.dtype == torch.bfloat16
    for t in (q, k, v, do):
        x = t.float()
        assert (x != 0).float().mean() > 0.99
        assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    q2 = harness.make_inputs(p, seed=4, device="cpu")[0]
    assert not torch.equal(q, q2)


def test_check_slices_keep_whole_gqa_groups():
    p = Problem(batch=3, seqlen_q=128, seqlen_k=128, heads_q=8, heads_kv=2, head_dim=64, head_dim_v=64)
    batches, qheads, kvheads = harness.check_slices(p, Settings(check_batches=1, check_heads=2))
    assert batches == [2]
    assert kvheads == [0, 1]
    assert qheads == list(range(8))


def _naive_attention(q, k, v, causal):
    """Row-by-row softmax attention in float64 on (s, d) matrices, bottom-right causal."""
    sq, sk = q.shape[0], k.shape[0]
    out = np.zeros((sq, v.shape[1]))
    for i in range(sq):
        s = (k @ q[i]) / math.sqrt(q.shape[1])
        if causal:
            s[np.arange(sk) > i + (sk - sq)] = -np.inf
        w = np.exp(s - s.max())
        out[i] = (w / w.sum()) @ v
    return out


@pytest.mark.parametrize("sq,sk,causal", [(64, 64, False), (64, 64, True), (48, 80, True), (80, 80, True)])
def test_reference_attention_matches_naive(sq, sk, causal):
    p = Problem(batch=1, seqlen_q=sq, seqlen_k=sk, heads_q=1, heads_kv=1, head_dim=32, head_dim_v=32,
                causal=causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 1, 32, generator=g) for n in (sq, sk, sk))
    got = harness.reference_attention(p, q, k, v, upcast=True)[0, :, 0].double().numpy()
    want = _naive_attention(q[0, :, 0].double().numpy(), k[0, :, 0].double().numpy(), v[0, :, 0].double().numpy(), causal)
    np.testing.assert_allclose(got, want, atol=1e-5)


def _problem_gqa(causal=True):
    return Problem(batch=2, seqlen_q=96, seqlen_k=128, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32,
                   causal=causal)


def _expanded_reference(p, q, k, v, upcast):
    g = p.heads_q // p.heads_kv
    return harness.reference_attention(p, q, k.repeat_interleave(g, 2), v.repeat_interleave(g, 2), upcast)


def test_fwd_gate_accepts_a_correct_bf16_result_and_rejects_wrong_or_nan():
    p = _problem_gqa()
    s = Settings(check_batches=2, check_heads=2)
    q, k, v, _ = harness.make_inputs(p, seed=0, device="cpu")
    good = _expanded_reference(p, q, k, v, upcast=True).to(torch.bfloat16)  # fp32 answer rounded
    err, ref_err = harness.fwd_errors(p, good, q, k, v, s)
    assert ref_err > 0 and passes_error_rule(err, ref_err, s.atol)
    bad = good.clone()
    bad[1, 5, 3, 7] += 0.25  # one wrong element in the last batch, second kv group
    err, ref_err = harness.fwd_errors(p, bad, q, k, v, s)
    assert err >= 0.2 and not passes_error_rule(err, ref_err, s.atol)
    nan = good.clone()
    nan[0, 0, 1, 0] = float("nan")  # outside the checked slice when only the last batch is compared
    s = Settings(check_batches=1, check_heads=1)
    err, ref_err = harness.fwd_errors(p, nan, q, k, v, s)
    assert math.isnan(err) and not passes_error_rule(err, ref_err, s.atol)


def test_bwd_gate_compares_all_three_gradients():
    p = Problem(batch=1, seqlen_q=64, seqlen_k=64, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32,
                causal=True, pass_="bwd")
    s = Settings(check_batches=1, check_heads=2)
    q, k, v, do = harness.make_inputs(p, seed=1, device="cpu")
    qf, kf, vf = (t.float().requires_grad_(True) for t in (q, k, v))
    o = _expanded_reference(p, qf, kf, vf, upcast=True)
    grads = [g.to(torch.bfloat16) for g in torch.autograd.grad(o, (qf, kf, vf), do.float())]
    err, ref_err = harness.bwd_errors(p, grads, q, k, v, do, s)
    assert passes_error_rule(err, ref_err, s.atol)
    # One wrong element in any of the three gradients is caught: dQ of query head 3 (the last
    # head of kv group 1), dK and dV of kv head 1.
    for which, index in ((0, (0, 5, 3, 7)), (1, (0, 20, 1, 3)), (2, (0, 10, 1, 0))):
        bad = [g.clone() for g in grads]
        bad[which][index] += 1.0
        err, ref_err = harness.bwd_errors(p, bad, q, k, v, do, s)
        assert err >= 0.9 and not passes_error_rule(err, ref_err, s.atol), (which, err, ref_err)


def test_measurement_round_trip():
    m = Measurement(OK, samples_ms=[1.0, 2.0], median_ms=1.5, iqr_ms=0.5, tflops=3.0, error=1e-3, ref_error=1e-3)
    assert Measurement.from_dict(m.to_dict()) == m
    assert Measurement(INCORRECT, reason="x").ok is False


def test_measure_reports_where_its_time_went(monkeypatch):
    """measure() times its phases: the build (compile and first run), the check against the
    reference and the timing loop. Run here on CPU tensors with a provider whose build takes
    0.3 s and a timing loop that takes 0.2 s."""
    import time

    import torch

    from providers import harness

    problem = Problem.standard(256, 64, batch=1, heads_q=2)

    class Provider:
        def make_fwd(self, problem, config, q, k, v):
            time.sleep(0.3)  # the compile of a kernel not seen before
            return lambda: harness.reference_attention(problem, q, k, v, upcast=True).to(q.dtype)

    make_inputs = harness.make_inputs
    monkeypatch.setattr(harness, "make_inputs", lambda p, seed: make_inputs(p, seed, device="cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(harness, "time_callable", lambda fn, settings: time.sleep(0.2) or [1.0, 1.1, 0.9])
    t = time.perf_counter()
    m = harness.measure(Provider(), problem, None, Settings())
    wall = time.perf_counter() - t
    assert m.status == OK, m.reason
    assert list(m.phases) == ["build", "check", "time"]
    assert 0.3 <= m.phases["build"] < 0.3 + 0.25 and 0.2 <= m.phases["time"] < 0.2 + 0.25
    assert sum(m.phases.values()) <= wall + 0.003  # each phase rounded to the millisecond
    assert Measurement.from_dict(m.to_dict()) == m


# ---- GPU ------------------------------------------------------------------------------

SMALL = Problem.standard(1024, 128, batch=2, heads_q=4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cudnn", "fa2"])
def test_sdpa_providers_measure_on_gpu(name):
    from providers import get_provider

    p = get_provider(name)
    m = p.measure(SMALL, None, Settings(target_ms=30, warmup_ms=20))
    assert m.status == OK, m.reason
    assert m.error <= 2 * m.ref_error + 1e-4
    assert len(m.samples_ms) >= 10 and m.median_ms > 0
    assert m.tflops == pytest.approx(SMALL.flops / (m.median_ms * 1e-3) / 1e12)


@pytest.mark.gpu
def test_sdpa_backward_on_gpu():
    from providers import get_provider

    prob = Problem.standard(1024, 64, batch=1, heads_q=4, causal=True, pass_="bwd")
    m = get_provider("cudnn").measure(prob, None, Settings(target_ms=30, warmup_ms=20))
    assert m.status == OK, m.reason
    assert m.error <= 2 * m.ref_error + Settings().atol  # all three gradients against fp32 autograd
    assert len(m.samples_ms) >= 10 and list(m.phases) == ["build", "check", "time"]
    # Backward FLOPs are 2.5x the forward's (the FlashAttention convention).
    assert m.tflops == pytest.approx(prob.flops / (m.median_ms * 1e-3) / 1e12)
    assert prob.flops == pytest.approx(2.5 * dataclasses.replace(prob, pass_="fwd").flops)


@pytest.mark.gpu
@pytest.mark.ref
def test_reference_fa4_default_and_tuned_config_on_gpu():
    from providers import get_provider
    from providers.flash_attn4 import RefFa4FwdKnobs

    p = get_provider("flash-attn-4")
    for cfg in (None, RefFa4FwdKnobs(128, 160, True, True)):
        m = p.measure(SMALL, cfg, Settings(target_ms=30, warmup_ms=20))
        assert m.status == OK, m.reason
        assert m.error <= 2 * m.ref_error + 1e-4


@pytest.mark.gpu
def test_wrong_kernel_is_caught_on_gpu():
    """A provider returning a perturbed output is recorded incorrect, not timed."""
    from providers.sdpa import CudnnProvider

    class Wrong(CudnnProvider):
        def make_fwd(self, problem, config, q, k, v):
            inner = super().make_fwd(problem, config, q, k, v)
            return lambda: inner() * 1.01

    m = Wrong().measure(SMALL, None, Settings(target_ms=30, warmup_ms=20))
    assert m.status == INCORRECT and m.samples_ms == []


@pytest.mark.gpu
def test_isolated_runner_on_gpu():
    from tuner.worker import IsolatedRunner

    with IsolatedRunner() as r:
        m = r.run("cudnn", SMALL, None, Settings(target_ms=30, warmup_ms=20))
    # The whole measurement comes back over the pipe: checked, timed, its phases.
    assert m.status == OK, m.reason
    assert m.error <= 2 * m.ref_error + Settings().atol
    assert len(m.samples_ms) >= 10 and m.tflops == pytest.approx(SMALL.flops / (m.median_ms * 1e-3) / 1e12)
    assert list(m.phases) == ["build", "check", "time"] and m.phases["time"] > 0


def _recorded_case():
    from fa4.knobs import config_to_dict
    from providers.replay import ReplayProvider

    rp = ReplayProvider()
    problem = rp.recording.problems[0]
    return problem, config_to_dict(rp.default_config(problem, rp.arch()))


def test_prestart_warms_the_measuring_process_while_the_caller_works(monkeypatch):
    """The warm-up (imports, CUDA context for real providers) runs in the child while the parent
    does its own start-up work, so the first measurement does not wait for it; the measurement
    is the recorded one, taken by the process that warmed up."""
    import time

    from tuner.worker import IsolatedRunner

    monkeypatch.setenv("FA4_TEST_WARM_S", "2.0")
    monkeypatch.delenv("FA4_TEST_WARM_FAIL", raising=False)
    spec = "plugin:tests.tuner.fake_providers:WarmupProbe"
    problem, cfg = _recorded_case()
    settings = Settings(target_ms=30, warmup_ms=20)
    with IsolatedRunner(timeout_s=120) as r:
        r.prestart(spec)
        time.sleep(3.0)  # the parent opening its studies
        t = time.monotonic()
        m = r.run(spec, problem, cfg, settings)
        first = time.monotonic() - t
        m2 = r.run(spec, problem, cfg, settings)
    assert r.warm_result == "ok" and 2.0 <= r.warm_s < 3.0
    assert m.status == OK and m.reason.endswith("warmed=True")
    assert m.reason.split()[0] == m2.reason.split()[0]  # the same (warmed) process measured both
    assert first < 1.5, f"first measurement waited {first:.2f} s: the warm-up was not overlapped"
    from providers.replay import ReplayProvider

    want = ReplayProvider().measure(problem, ReplayProvider().config_from_dict(problem, cfg), settings)
    assert m.tflops == want.tflops and m.median_ms == want.median_ms


def test_failed_warmup_is_reported_and_measuring_goes_on(monkeypatch):
    from tuner.worker import IsolatedRunner

    monkeypatch.setenv("FA4_TEST_WARM_S", "0")
    monkeypatch.setenv("FA4_TEST_WARM_FAIL", "1")
    spec = "plugin:tests.tuner.fake_providers:WarmupProbe"
    problem, cfg = _recorded_case()
    with IsolatedRunner(timeout_s=120) as r:
        r.prestart(spec)
        m = r.run(spec, problem, cfg, Settings(target_ms=30, warmup_ms=20))
    assert "warm-up failed on purpose" in r.warm_result
    assert m.status == OK and m.reason.endswith("warmed=False")


def test_close_stops_the_measuring_process_without_its_teardown(monkeypatch):
    """At the end of a run the measuring process exits at once, cleanly (exit code 0), instead of
    running its teardown into close()'s grace and a SIGKILL: seconds at the end of every run."""
    import time

    from tuner.worker import CLOSE_GRACE_S, IsolatedRunner

    monkeypatch.setenv("FA4_TEST_TEARDOWN_S", "5")
    spec = "plugin:tests.tuner.fake_providers:SlowTeardown"
    problem, cfg = _recorded_case()
    r = IsolatedRunner(timeout_s=120)
    r.prestart(spec)
    assert r.run(spec, problem, cfg, Settings(target_ms=30, warmup_ms=20)).status == OK
    proc = r._proc
    t = time.monotonic()
    r.close()
    took = time.monotonic() - t
    assert proc.exitcode == 0, f"measuring process ended with {proc.exitcode} (killed, not exited)"
    assert took < CLOSE_GRACE_S / 2, f"close() took {took:.2f} s"


def test_reference_attention_takes_the_features_and_providers_say_which_they_run():
    """The harness's reference (window, softcap, sinks) against the fp32 model of the kernels' tests,
    and a provider without the features refuses such problems instead of timing plain attention."""
    import torch

    from fa4.problem import Problem
    from providers import get_provider
    from providers.harness import feature_kwargs, reference_attention, sink_for
    from tests.fa4.cpu_kernels import forward_math, inputs

    p = Problem(1, 70, 90, 4, 4, 64, 64, causal=True, window_left=9, softcap=15.0, sink=True)
    q, k, v, _ = inputs(b=1, sq=70, sk=90, hq=4, hkv=4, d=64, grad=False)
    sink = sink_for(p, "cpu")
    assert torch.equal(sink, sink_for(p, "cpu")) and sink.shape == (4,)
    got = reference_attention(p, q, k, v, upcast=True, sink=sink)
    want, _ = forward_math(q, k, v, 1 / 8, True, 9, -1, 15.0, sink, out_dtype=torch.float32)
    assert torch.allclose(got, want, atol=1e-5)
    kw = feature_kwargs(p, "cpu")
    assert kw["window_size"] == (9, None) and kw["softcap"] == 15.0 and torch.equal(kw["learnable_sink"], sink)
    assert not get_provider("fa4").problem_errors(p)
    for name in ("cudnn", "fa2"):
        assert any("does not take window_left, softcap, sink" in e for e in get_provider(name).problem_errors(p))
