"""The backward's yardstick with the out it is given (bench/check_bwd_feat.rounded_out_grads).

A FlashAttention backward forms D = rowsum(dO * O) - dLSE from the forward's rounded O; PyTorch's
autograd never does, so its same-dtype error cannot bound that term. On the H200 the causal
Sk = 1 shape with a sink (3, 65, 1, 2, 1) failed dq/dk by this alone: the FA formulas evaluated
exactly here (fp32, bf16 only where the kernel rounds) miss the old rule on most seeds.
"""

import math

import pytest
import torch

from tests.fa4 import cpu_kernels

F = cpu_kernels.check_bwd_feat()
SHAPE = (3, 65, 1, 2, 1)  # B, Sq, Sk, Hq, Hkv: rows 0..63 see no key under causal, row 64 one


def fa_formula_bwd(q, k, v, dout, out, lse, sink, dlse, causal, scale, d_scale=1.0):
    """dq, dk, dv, dsink by the kernel's formulas: P = exp(S - LSE), D = rowsum(dO * out) - dLSE,
    dS = P (dP - D) rounded to q's dtype for the dQ/dK products, P rounded for dV (``d_scale``:
    a deliberately wrong D, which the rule must catch)."""
    sq, sk, rep = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    qq = q.transpose(1, 2).float()
    kk, vv = (t.transpose(1, 2).repeat_interleave(rep, 1).float() for t in (k, v))
    do = dout.transpose(1, 2).float()
    s = (qq @ kk.transpose(-1, -2) * scale).masked_fill(~F.visible(sq, sk, causal, -1, -1), -math.inf)
    p = torch.exp(s - lse[..., None])
    big_d = (do * out.transpose(1, 2).float()).sum(-1) * d_scale - (0 if dlse is None else dlse)
    ds = (p * (do @ vv.transpose(-1, -2) - big_d[..., None])).to(q.dtype).float()
    dq = (ds @ kk * scale).transpose(1, 2)
    dk = (ds.transpose(-1, -2) @ qq * scale).unflatten(1, (-1, rep)).sum(2).transpose(1, 2)
    dv = (p.to(q.dtype).float().transpose(-1, -2) @ do).unflatten(1, (-1, rep)).sum(2).transpose(1, 2)
    dsink = -(torch.exp(sink[None, :, None] - lse) * big_d).sum((0, 2))
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dsink


def _case(seed, dlse=False, causal=True, shape=SHAPE):
    return F.make_inputs(*shape, 128, torch.bfloat16, seed, sink=True, dlse=dlse, device="cpu", causal=causal)


@pytest.mark.parametrize("dlse", [False, True])
def test_rounded_out_grads_are_the_formulas_in_fp32(dlse):
    """rounded_out_grads (autograd with dLSE shifted by -dO . (out - O_fp32)) equals the formulas
    above evaluated in fp32 from the rounded out: the term it adds is exactly D's."""
    q, k, v, dout, out, lse, s, dl = _case(3, dlse)
    want = fa_formula_bwd(q.float(), k.float(), v.float(), dout.float(), out, lse, s, dl, True, 1 / math.sqrt(128))
    got = F.rounded_out_grads(q, k, v, dout, dl, out, sink=s, scale=1 / math.sqrt(128), causal=True)
    for w, g in zip(want, got):
        assert torch.allclose(w, g, atol=2e-5, rtol=1e-4), (w - g).abs().max()


def test_the_formulas_pass_with_the_rounded_out_and_missed_the_old_rule():
    """The H200's failing shape: the exact formulas pass the rule given out, and failed without it
    (so the failure was the yardstick's, not the kernel's)."""
    old_fail = 0
    for seed in range(8):
        q, k, v, dout, out, lse, s, dl = _case(seed)
        grads = fa_formula_bwd(q, k, v, dout, out, lse, s, dl, True, 1 / math.sqrt(128))
        kw = dict(sink=s, scale=1 / math.sqrt(128), causal=True)
        ok, info = F.grads_match(grads, q, k, v, dout, dl, out=out, **kw)
        assert ok, (seed, info)
        old_fail += not F.grads_match(grads, q, k, v, dout, dl, **kw)[0]
    assert old_fail >= 2


@pytest.mark.parametrize("shape,causal", [(SHAPE, True), (SHAPE, False), ((1, 333, 777, 4, 2), True)])
def test_a_wrong_d_still_fails(shape, causal):
    """The looser yardstick still sees a D off by 5 %, on the failing shape and on a realistic one."""
    misses = 0
    for seed in range(4):
        q, k, v, dout, out, lse, s, dl = _case(seed, causal=causal, shape=shape)
        grads = fa_formula_bwd(q, k, v, dout, out, lse, s, dl, causal, 1 / math.sqrt(128), d_scale=1.05)
        misses += not F.grads_match(grads, q, k, v, dout, dl, out=out, sink=s, scale=1 / math.sqrt(128),
                                    causal=causal)[0]
    assert misses >= 3


@pytest.mark.parametrize("dlse", [False, True])
def test_the_gpu_tests_path_with_the_formulas_as_the_kernel(monkeypatch, dlse):
    """check_case as test_bwd_feat_gpu.py::test_sink_single_key_over_seeds runs it (the H200's
    failing seed among them), on CPU with launch_bwd replaced by the formulas: the config, the
    seed, the out handed to the rule all flow as on the device."""
    from fa4.sm90 import bwd_launch

    def formulas(dout, q, k, v, out, lse, scale, causal, deterministic, config, dlse=None, sink=None):
        return fa_formula_bwd(q, k, v, dout, out, lse, sink, dlse, causal, scale)

    monkeypatch.setattr(bwd_launch, "launch_bwd", formulas)
    for seed in (2, 6, 493543130):
        ok, info = F.check_case(*SHAPE, 128, causal=True, sink=True, dlse=dlse, seed=seed, device="cpu")
        assert ok and info["seed"] == seed, info
