"""The softcap tanh of fa4/common/softcap.py: the FMA-pipe sequence's bit-exact numpy model
(fa4/common/softcap_model.py) against exact tanh, the compiled instruction sequence the model
mirrors, and (on a GPU) the device against the model bit for bit.

Stated bound: max |tanh_fma(x) - tanh(x)| <= 2e-7 for every fp32 x (measured 1.49e-7, near
|x| = 0.013 where 1 - 2/(1 + e^{2|x|}) cancels). On the capped score c * t that is <= 2e-7 c in
natural-log units: 6e-6 relative on P at c = 30, 300x under bf16's half ulp (2^-9) that P is
rounded to before the PV GEMM. The bound must be absolute and tiny, not just under MUFU's
relative 2^-10.99: near x = 0 the error is the same sign and size for all of a row's small scores
(a bias the PV sum does not average away), and the first version's 4.4e-5 there (degree-3 exp2,
two Newton steps; 1.3e-3 on the score at c = 30) put the forward over the error rule on the
H200 (test_fwd_features_gpu.py::test_softcap_fma_split_matches_reference).
"""

from __future__ import annotations

import re

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
from cutlass import Float32

from fa4.common import softcap_model as sm
from fa4.common.exp2 import emulated_indices

BOUND = 2e-7


def _grid():
    rng = np.random.default_rng(0)
    return np.concatenate([
        np.linspace(-12, 12, 1_000_001), rng.standard_normal(200_000) * 3, np.geomspace(1e-30, 1e-2, 2000),
        -np.geomspace(1e-30, 1e-2, 2000), [0.0, -0.0, 9.0, 9.02, 20.0, 1e4, 3e38, np.inf, -np.inf],
    ]).astype(np.float32)


def test_model_error_against_exact_tanh_is_bounded():
    x = _grid()
    t = sm.tanh_fma_model(x)
    ref = np.tanh(x.astype(np.float64))
    err = np.abs(t.astype(np.float64) - ref)
    assert err.max() <= BOUND, (err.max(), x[err.argmax()])
    assert np.all(np.abs(t) <= 1.0) and np.array_equal(np.signbit(t), np.signbit(x))
    # 1 - 2 r resolves steps of 2^-24 only: below that t is a signed zero, within the bound.
    assert np.all(np.abs(x[t == 0]) < 1.2e-7) and np.all(t[np.abs(x) >= 1.2e-7] != 0)
    assert np.all(t[np.abs(x) >= 9.02] == np.sign(x[np.abs(x) >= 9.02]))  # saturated exactly
    # The first version (degree-3 exp2, two Newton steps) and either half of the fix alone miss it
    # by far: the third step and the degree-5 polynomial are what it rests on.
    for steps, degree in [(2, 3), (2, 5), (3, 3)]:
        assert np.abs(sm.tanh_fma_model(x, newton_steps=steps, degree=degree) - ref).max() > 10 * BOUND


def _raw_scores(scale: float, cap: float) -> np.ndarray:
    """Every raw q.k the kernel can hand tanh_fma: the whole fp32 range of both signs (tiny,
    denormal, huge, inf), dense where tanh bends (|s scale / c| < 12), and random scores."""
    rng = np.random.default_rng(1)
    bend = 12 * cap / scale
    mags = np.concatenate([np.geomspace(1e-45, 3.4e38, 200_001), [0.0, np.inf]])
    return np.concatenate([mags, -mags, np.linspace(-bend, bend, 1_000_001),
                           rng.standard_normal(200_000) * 60]).astype(np.float32)


@pytest.mark.parametrize("scale,cap", [(0.125, 30.0), (0.088, 50.0), (0.125, 5.0), (0.125, 1.0), (0.0625, 0.5)])
def test_model_with_the_kernels_folded_scale(scale, cap):
    """The kernels pass the raw q.k and k = 2 log2(e) scale / c: over every fp32 score, the capped
    score stays within c * BOUND plus the rounding of k and of c * t (a few fp32 ulps of c)."""
    s = _raw_scores(scale, cap)
    with np.errstate(over="ignore", invalid="ignore"):
        got = sm.softcapped_scores_model(s, scale, cap, fma=np.ones(s.shape, bool))
    want = cap * np.tanh(s.astype(np.float64) * scale / cap)
    assert np.all(np.isfinite(got))
    assert np.abs(got - want).max() <= cap * (BOUND + 2 * 2.0**-24), np.abs(got - want).max() / cap


def test_monotone_enough_for_softmax():
    # The row max is taken over t: an FMA-path score may not overtake a larger exact one by more
    # than the bound (no ordering surprise beyond it).
    x = np.linspace(-6, 6, 200_001).astype(np.float32)
    t = sm.tanh_fma_model(x).astype(np.float64)
    assert np.all(np.diff(t) >= -2 * BOUND)


def _split_errors(scale_mult: float, frac: float, **seq) -> tuple[float, float]:
    """(max LSE error, max O error) that the split's tanh alone gives a causal 512 x 512 hd128
    softmax at c = 30 with q, k ~ N(0, scale_mult^2) in bf16 (the GPU test's inputs), in float64
    against exact tanh; the kernel's columns on the FMA pipe approximated by key index mod 32."""
    import math

    import torch

    from fa4.common.exp2 import emulated_indices

    g = torch.Generator().manual_seed(0)
    n, d, cap = 512, 128, 30.0
    q, k = ((torch.randn(n, d, generator=g) * scale_mult).bfloat16().float() for _ in range(2))
    v = torch.randn(n, d, generator=g).bfloat16().double()
    x = (q @ k.T).numpy()
    scale = 1 / math.sqrt(d)
    fma = np.isin(np.arange(n) % 32, emulated_indices(32, frac, "spread"))[None, :].repeat(n, 0)
    exact = np.tanh(x.astype(np.float64) * scale / cap)
    t = np.where(fma, sm.tanh_fma_model(x, np.float32(np.float32(scale / cap) * sm.TWO_LOG2_E), **seq), exact)
    causal = torch.ones(n, n, dtype=torch.bool).tril()

    def lse_out(tt):
        sc = torch.from_numpy(cap * np.asarray(tt, np.float64)).masked_fill(~causal, -math.inf)
        return torch.logsumexp(sc, -1), torch.softmax(sc, -1) @ v

    (l0, o0), (l1, o1) = lse_out(exact), lse_out(t)
    return (l1 - l0).abs().max().item(), (o1 - o0).abs().max().item()


@pytest.mark.parametrize("scale_mult,frac", [(1.0, 0.5), (3.0, 0.25), (3.0, 0.5)])
def test_split_leaves_the_forward_far_inside_its_error_rule(scale_mult, frac):
    """The H200's failing cases of test_fwd_features_gpu.py::test_softcap_fma_split_matches_reference
    (LSE within 1e-3): the first sequence's bias alone took 5e-4 to 1.2e-3 of that budget here
    (the device's exp2 and log add the rest); the shipped one takes under 1e-5, and O's error is
    far under bf16's."""
    lse_err, o_err = _split_errors(scale_mult, frac)
    assert lse_err < 1e-5 and o_err < 1e-5, (lse_err, o_err)
    old_lse, _ = _split_errors(scale_mult, frac, newton_steps=2, degree=3)
    assert old_lse > 4e-4, old_lse


# ---------------------------------------------------------------------------------- compile-only

N = 16


def _kernel(frac: float):
    from fa4.common.softcap import tanh_fma, tanh_mufu

    fma = frozenset(emulated_indices(N, frac, "spread"))

    @cute.kernel
    def kernel(src: cute.Tensor, dst: cute.Tensor, k: Float32):
        tid, _, _ = cute.arch.thread_idx()
        for i in cutlass.range_constexpr(N):
            x = src[tid * N + i]
            if cutlass.const_expr(i in fma):
                dst[tid * N + i] = tanh_fma(x, k)
            else:
                dst[tid * N + i] = tanh_mufu(x * (k * Float32(float(1.0 / sm.TWO_LOG2_E))))

    @cute.jit
    def host(src: cute.Tensor, dst: cute.Tensor, k: Float32):
        kernel(src, dst, k).launch(grid=(1, 1, 1), block=(128, 1, 1))

    return host, fma


_SEQ = (["abs.f32", "mul.rn.f32", "min.f32", "add.rm.ftz.f32", "sub.rn.f32", "sub.rn.f32"]
        + ["fma.rn.f32"] * sm.TANH_EXP2_DEGREE + ["shl.b32", "add.s32", "add.rn.f32", "sub.s32"]
        + ["fma.rn.f32"] * (2 * sm.NEWTON_STEPS + 1) + ["and.b32", "or.b32"])


def test_compiled_sequence_is_the_models():
    from cutlass.cute.runtime import make_fake_compact_tensor

    from fa4.common.codegen_check import compile_and_inspect, ptx_opcodes
    from fa4.sm90.compile import ensure_target

    ensure_target()
    host, fma = _kernel(0.5)
    a = make_fake_compact_tensor(Float32, (128 * N,))
    b = make_fake_compact_tensor(Float32, (128 * N,))
    rep = compile_and_inspect(host, a, b, Float32(1.0), ptx_ops=["tanh.approx.f32"],
                              sass_ops=["MUFU.TANH", "MUFU.EX2", "MUFU.RCP", "LDL", "STL"])
    assert rep.ptx_counts["tanh.approx.f32"] == rep.sass_counts["MUFU.TANH"] == N - len(fma)
    assert rep.sass_counts["MUFU.EX2"] == rep.sass_counts["MUFU.RCP"] == 0  # the FMA path uses no MUFU
    ops = []
    for body in re.findall(r"// begin inline asm\n(.*?)// end inline asm", rep.ptx, flags=re.S):
        ops += [op for op in ptx_opcodes(body) if not op.startswith("tanh")]
    assert ops == _SEQ * len(fma)
    assert rep.local_memory_instructions == 0 and not rep.spills


@pytest.mark.gpu
def test_device_matches_model_bitwise():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from cutlass.cute.runtime import from_dlpack

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(128 * N - 64) * 4, np.linspace(-10, 10, 48),
                        [0.0, -0.0, np.inf, -np.inf, 1e-30, -1e-30, 9.02, -20.0] * 2]).astype(np.float32)
    host, fma = _kernel(1.0)
    src = torch.from_numpy(x).cuda()
    dst = torch.full_like(src, float("nan"))
    args = (from_dlpack(src), from_dlpack(dst), Float32(float(sm.TWO_LOG2_E)))
    cute.compile(host, *args)(*args)
    torch.cuda.synchronize()
    y = dst.cpu().numpy()
    assert np.array_equal(y.view(np.uint32), sm.tanh_fma_model(x).view(np.uint32))
    # MUFU tanh within its documented 2^-10.99 relative error.
    host, _ = _kernel(0.0)
    cute.compile(host, *args)(*args)
    torch.cuda.synchronize()
    y = dst.cpu().numpy().astype(np.float64)
    ref = np.tanh(x.astype(np.float64))
    assert np.all(np.abs(y - ref) <= 2.0**-10.98 * np.abs(ref) + 1e-37)
