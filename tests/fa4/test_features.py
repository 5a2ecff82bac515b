"""Issue 18's features on the host (CPU): the masks' tile ranges, the arguments of flash_attn_func,
the launch path's keys and runtime arguments, explain and the knob's feasibility.

Launches are replaced (tests/fa4/cpu_kernels.py, or a recording stand-in for the compiled kernel
where the real fa4.launch._forward runs); the kernels themselves are tested in
test_fwd_features_compile.py (codegen) and test_fwd_features_gpu.py (numerics, H200).
"""

from __future__ import annotations

import contextlib
import math
import random

import pytest
import torch

import fa4
from fa4 import features, launch
from fa4.common import masking
from fa4.problem import Problem
from fa4.sm90.fwd_config import FwdConfigSm90, violations
from tests.fa4 import cpu_kernels
from tests.fa4.cpu_kernels import forward_math, inputs


# -- tile ranges ----------------------------------------------------------------------------------

def _sees(i, j, sq, sk, causal, wl, wr):
    o = sk - sq
    if (causal and j > i + o) or (wr >= 0 and j > i + o + wr) or (wl >= 0 and j < i + o - wl):
        return False
    return 0 <= j < sk


def _cases(n=400, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        sq, sk = rng.randint(1, 700), rng.randint(1, 700)
        causal = rng.random() < 0.5
        wl = rng.choice([-1, 0, 1, 17, 64, 127, 128, 300, 1000])
        wr = rng.choice([-1, 0, 1, 5, 128, 300]) if not causal else -1
        yield sq, sk, causal, wl, wr, rng.choice([(128, 128), (192, 128), (128, 80), (64, 128)])


def test_kv_block_range_and_split_match_brute_force():
    for sq, sk, causal, wl, wr, (tm, tn) in _cases():
        args = (sq, sk, causal, wl >= 0, wr >= 0, wl, wr)
        for m in range((sq + tm - 1) // tm):
            rows = range(m * tm, (m + 1) * tm)  # the kernel's padding rows past seqlen_q included
            seen = [n for n in range((sk + tn - 1) // tn)
                    if any(_sees(i, j, sq, sk, causal, wl, wr) for i in rows for j in range(n * tn, (n + 1) * tn))]
            lo, hi = masking.kv_block_range(m, tm, tn, *args)
            if seen:
                assert (lo, hi) == (seen[0], seen[-1] + 1), (sq, sk, causal, wl, wr, tm, tn, m)
            else:
                assert lo >= hi
            n_min, n_max, right, unm = masking.kv_mask_split(m, tm, tn, *args)
            assert n_max - n_min >= 1 and (not seen or (n_min, n_max) == (lo, hi))
            # The tiles walked without a mask must need none: every element is visible or past no bound.
            order = list(range(n_max - 1, n_min - 1, -1))
            for n in order[1 + right:1 + right + unm]:
                for i in (rows[0], rows[-1]):
                    for j in (n * tn, n * tn + tn - 1):
                        assert _sees(i, j, sq, sk, causal, wl, wr), (sq, sk, causal, wl, wr, tm, tn, m, n, i, j)


def test_q_block_range_matches_brute_force():
    for sq, sk, causal, wl, wr, (tm, tn) in _cases(seed=1):
        args = (sq, sk, causal, wl >= 0, wr >= 0, wl, wr)
        for n in range((sk + tn - 1) // tn):
            cols = range(n * tn, min((n + 1) * tn, sk))
            seen = [m for m in range((sq + tm - 1) // tm)
                    if any(_sees(i, j, sq, sk, causal, wl, wr) for i in range(m * tm, (m + 1) * tm) for j in cols)]
            lo, hi = masking.q_block_range(n, tm, tn, *args)
            if seen:
                assert (lo, hi) == (seen[0], seen[-1] + 1), (sq, sk, causal, wl, wr, tm, tn, n)
            else:
                assert lo >= hi


def test_visible_pairs_count_the_unmasked_region():
    for sq, sk, causal, wl, wr, _ in list(_cases(60, seed=2)):
        p = Problem(1, sq, sk, 1, 1, 64, 64, causal=causal, window_left=wl, window_right=wr)
        want = sum(_sees(i, j, sq, sk, causal, wl, wr) for i in range(sq) for j in range(sk))
        assert p.visible_pairs() == want
    plain = Problem(2, 512, 512, 4, 4, 128, 128, causal=True)
    assert plain.flops == 2.0 * 2 * 4 * 512 * 512 * 256 / 2  # unchanged without a window
    win = Problem(1, 16384, 16384, 16, 16, 128, 128, causal=True, window_left=1023)
    assert win.flops == 4.0 * 16 * 128 * win.visible_pairs()
    assert win.visible_pairs() == 1024 * 16384 - 1023 * 1024 // 2


# -- arguments ------------------------------------------------------------------------------------

def _q(h=4):
    return torch.zeros(1, 8, h, 64, dtype=torch.bfloat16)


@pytest.mark.parametrize("kw,match", [
    (dict(window_size=(-1, 0)), "window_size left must be None"),
    (dict(window_size=(4, 2.5)), "window_size right"),
    (dict(window_size=(True, None)), "window_size left"),
    (dict(window_size=5), r"\(left, right\) pair"),
    (dict(softcap=-1.0), "softcap must be a finite number >= 0"),
    (dict(softcap=float("inf")), "softcap"),
    (dict(softcap=float("nan")), "softcap"),
    (dict(learnable_sink=torch.zeros(3)), r"shape \(heads_q,\) = \(4,\)"),
    (dict(learnable_sink=torch.zeros(4, dtype=torch.int32)), "float32, bfloat16 or float16"),
    (dict(learnable_sink=[0.0] * 4), "torch.Tensor"),
])
def test_bad_feature_arguments_name_the_argument(kw, match):
    args = dict(window_size=(None, None), learnable_sink=None, softcap=0.0) | kw
    with pytest.raises(ValueError, match=match):
        features.normalize(_q(), False, args["window_size"], args["learnable_sink"], args["softcap"])


def test_features_are_normalised_as_the_reference():
    n = features.normalize
    assert n(_q(), False, (None, None), None, 0.0).plain
    # causal means right = 0 (a positive right bound is overridden, as the reference does).
    assert n(_q(), True, (None, 5), None, 0.0)[:3] == (True, -1, -1)
    # (left, 0) is the causal sliding window whichever way it is spelled.
    assert n(_q(), False, (128, 0), None, 0.0)[:3] == n(_q(), True, (128, None), None, 0.0)[:3] == (True, 128, -1)
    assert n(_q(), False, (None, 3), None, None)[:4] == (False, -1, 3, 0.0)
    f = n(_q(), False, (None, None), torch.zeros(4, dtype=torch.bfloat16), 30)
    assert f.sink.dtype == torch.float32 and f.softcap == 30.0 and f.names() == ["softcap", "learnable_sink"]
    base = torch.zeros(5)
    f = n(_q(), False, (None, None), base[1:], 0.0)  # a misaligned slice is copied, an aligned one kept
    assert f.sink.data_ptr() % 16 == 0 and f.sink.data_ptr() != base[1:].data_ptr()
    assert n(_q(), False, (None, None), base[:4], 0.0).sink.data_ptr() == base.data_ptr()


def test_features_trace_with_a_symbolic_softcap(monkeypatch):
    """Under torch.compile a float argument may be symbolic (the H200's torch 2.11 made the varlen
    fullgraph test's softcap one): the checks must trace, guard on the value, and give what eager gives;
    a bad value still raises while tracing."""
    import torch._dynamo.config as dynamo_config

    monkeypatch.setattr(dynamo_config, "specialize_float", False)
    torch._dynamo.reset()

    def f(q, softcap):
        feat = features.normalize(q, True, (100, None), None, softcap)
        return q * feat.softcap + feat.window_left

    g = torch.compile(f, fullgraph=True, dynamic=True, backend="eager")
    q = torch.randn(1, 8, 4, 64)
    for softcap in (15.0, 12.5):
        assert torch.equal(g(q, softcap), f(q, softcap))
    with pytest.raises(Exception, match="softcap must be a finite number"):
        g(q, -3.0)
    torch._dynamo.reset()


@pytest.fixture
def calls(monkeypatch):
    return cpu_kernels.install(monkeypatch)


def test_features_reach_both_launches_through_the_public_call(calls):
    q, k, v, _ = inputs(grad=False)
    sink = torch.randn(4)
    out, lse = fa4.flash_attn_func(q, k, v, window_size=(8, 0), softcap=20.0, learnable_sink=sink, return_lse=True)
    (causal, wl, wr, cap, s), = calls.features
    assert (causal, wl, wr, cap) == (True, 8, -1, 20.0) and torch.equal(s, sink)
    want, want_lse = forward_math(q, k, v, 1 / 8, True, 8, -1, 20.0, sink)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    # With gradients the same canonical features reach the backward, and a bf16 sink that requires
    # grad gets its gradient in its own dtype through the fp32 copy the kernels read.
    q, k, v, dout = inputs(grad=True)
    sink16 = torch.randn(4).to(torch.bfloat16).requires_grad_()
    out = fa4.flash_attn_func(q, k, v, window_size=(8, None), softcap=5.0, learnable_sink=sink16)
    out.backward(dout)
    bwd, = calls.bwd
    assert (bwd["window_left"], bwd["window_right"], bwd["softcap"]) == (8, -1, 5.0)
    assert bwd["sink"].dtype == torch.float32 and torch.equal(bwd["sink"], sink16.detach().float())
    assert sink16.grad is not None and sink16.grad.dtype == torch.bfloat16
    ok, info = cpu_kernels.check_bwd_feat().grads_match(
        (q.grad, k.grad, v.grad, sink16.grad), q, k, v, dout, None, sink=sink16, scale=1 / 8, causal=False,
        window_left=8, window_right=-1, softcap=5.0)
    assert ok, info


def test_reference_semantics_of_the_fp32_model():
    """The test's own reference against a direct evaluation: window rows, softcap, sinks, empty rows."""
    q, k, v, _ = inputs(b=1, sq=5, sk=9, hq=2, hkv=1, d=64, grad=False)
    sink = torch.tensor([0.5, -1.0])
    out, lse = forward_math(q, k, v, 0.125, False, 1, 0, 10.0, sink, out_dtype=torch.float32)
    qf, kf, vf = q.float(), k.float(), v.float()
    for h in range(2):
        for i in range(5):
            js = [j for j in range(9) if i + 4 - 1 <= j <= i + 4]
            s = torch.stack([10.0 * torch.tanh(qf[0, i, h] @ kf[0, j, 0] * 0.125 / 10.0) for j in js])
            z = torch.logsumexp(torch.cat([s, sink[h:h + 1]]), 0)
            assert torch.allclose(lse[0, h, i], z, atol=1e-5)
            assert torch.allclose(out[0, i, h], (torch.exp(s - z)[:, None] * vf[0, js, 0]).sum(0), atol=1e-5)
    # A row with no key: O = 0 and LSE = -inf, or the sink's logit with a sink.
    q, k, v, _ = inputs(b=1, sq=6, sk=2, hq=2, hkv=2, d=64, grad=False)
    out, lse = forward_math(q, k, v, 0.125, True)
    assert torch.all(out[0, :4] == 0) and torch.all(lse[0, :, :4] == -math.inf)
    out, lse = forward_math(q, k, v, 0.125, True, sink=sink)
    assert torch.all(out[0, :4] == 0) and torch.equal(lse[0, :, 0], sink)


def test_empty_problem_lse_is_the_sink(monkeypatch):
    q, k, v, _ = inputs(b=2, sq=3, sk=1, grad=False)
    k, v = k[:, :0], v[:, :0]
    sink = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out, lse = fa4.flash_attn_func(q, k, v, learnable_sink=sink, return_lse=True)
    assert torch.all(out == 0) and torch.equal(lse, sink[None, :, None].expand(2, 4, 3))


# -- the real launch path, with the compiled kernel replaced -----------------------------------------

class FakeKernel:
    def __init__(self):
        self.args = []

    def __call__(self, *args):
        self.args.append(args)


def test_forward_fast_path_keys_features_and_passes_runtime_arguments(monkeypatch):
    from fa4.arch import SM90

    kernels, keys = {}, []

    def fake_compiled(key, build):
        keys.append(key)
        return kernels.setdefault(key, FakeKernel())

    monkeypatch.setattr(launch, "compiled", fake_compiled)
    monkeypatch.setattr(launch, "arch_of", lambda device: SM90)
    monkeypatch.setattr(launch, "validate", lambda *a, **k: None)
    monkeypatch.setattr(launch, "_launch_cache", {})
    guarded = []
    monkeypatch.setattr(launch, "device_guard", lambda t: guarded.append(t) or contextlib.nullcontext())
    monkeypatch.setenv("FA4_LOOKUP_LOCAL_DB", "0")
    monkeypatch.delenv("FA4_TUNING_URL", raising=False)
    q, k, v, _ = inputs(b=1, sq=64, sk=64, hq=4, hkv=4, d=128, grad=False)
    s1, s2 = torch.zeros(4), torch.ones(4)
    launch._forward(q, k, v, 0.1, True, True, None, None, 255, -1, 30.0, s1)
    launch._forward(q, k, v, 0.1, True, True, None, None, 255, -1, 30.0, s2)
    assert len(launch._launch_cache) == 1 and len(keys) == 1  # one entry: the sink's presence, not identity
    assert guarded == [q, q]  # each launch under q's device context (tests/fa4/test_device_guard.py)
    key = keys[0]
    assert (key.has_window_left, key.has_window_right, key.has_softcap, key.has_sink) == (True, False, True, True)
    (a1, a2) = kernels[key].args
    assert a1[5] is s1 and a2[5] is s2
    assert a1[6:10] == (None,) * 4  # the varlen tensors (cu_seqlens, seqused): dense
    # scale_log2 = c log2(e), softcap_scale = scale / c, then the window sides and max_seqlen_q (varlen).
    assert a1[10] == pytest.approx(30.0 * math.log2(math.e)) and a1[11] == pytest.approx(0.1 / 30.0)
    assert a1[12:15] == (255, -1, 0)
    launch._forward(q, k, v, 0.1, True, True, None, None)
    assert len(launch._launch_cache) == 2
    plain = keys[-1]
    assert not (plain.has_window_left or plain.has_softcap or plain.has_sink)
    args = kernels[plain].args[0]
    assert args[5] is None and args[10] == pytest.approx(0.1 * math.log2(math.e))


def test_explain_sees_the_features_and_the_tanh_knob_needs_softcap(monkeypatch):
    monkeypatch.setenv("FA4_LOOKUP_LOCAL_DB", "0")
    monkeypatch.delenv("FA4_TUNING_URL", raising=False)
    from fa4 import lookup

    lookup.reset()
    q, k, v, _ = inputs(b=1, sq=128, sk=128, hq=4, hkv=4, d=128, grad=False)
    res = fa4.explain(q, k, v, True, window_size=(63, None), softcap=30.0, learnable_sink=torch.zeros(4))
    assert res.config is not None
    p = Problem.standard(8192, 128, causal=True, softcap=30.0)
    assert not violations(FwdConfigSm90(tanh_fma_frac=0.25), p)
    why = violations(FwdConfigSm90(tanh_fma_frac=0.25), Problem.standard(8192, 128, causal=True))
    assert any("softcap problems only" in w for w in why)
    from fa4.arch import SM90
    from fa4.lookup import resolve_config

    with pytest.raises(ValueError, match="softcap problems only"):
        resolve_config(Problem.standard(8192, 128), SM90, {"tanh_fma_frac": 0.25})
    assert resolve_config(p, SM90, {"tanh_fma_frac": 0.25})[1].tanh_fma_frac == 0.25
