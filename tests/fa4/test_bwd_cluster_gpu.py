"""The 2-CTA dS exchange backward (cluster_exchange) on the GPU against fp32 autograd.

The error rule of tests/fa4/test_bwd_gpu.py (bench/check_bwd.py). Cases: hd192, hd192 with a
value head of 128, hd256; causal and not; odd seqlens and odd numbers of 64-key tiles (the last
pair's second CTA owns no key), Sq != Sk both ways under the causal mask, GQA and MQA (gqa_reduce
'atomic': 'loop' is refused), fp16, beside other knobs, a learnable sink with the LSE's gradient.
"""

import pytest

pytestmark = pytest.mark.gpu

HDS = [192, (192, 128), 256]
_ID = {192: "hd192", (192, 128): "hd192v128", 256: "hd256"}
# (B, Sq, Sk, Hq, Hkv): key tiles 16 (even), 13 (odd, GQA), 6 (MQA, Sq > Sk), 1 (odd: one key),
# 65 (odd, a key past a 128 pair boundary), 10 (even, Sk a multiple of 128).
SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1), (1, 129, 4097, 2, 2),
          (1, 1000, 640, 8, 8)]


def exchanged(check_bwd, shape, hd, causal, **change):
    """The problem's default config with the exchange on (bench/check_bwd.exchanged)."""
    return check_bwd.exchanged(check_bwd.problem_for(shape, hd, causal, False), **change)


@pytest.mark.parametrize("hd", HDS, ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_exchange_grads_match_reference(check_bwd, hd, causal, shape):
    import torch

    cfg = exchanged(check_bwd, shape, hd, causal)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", HDS, ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_exchange_fp16(check_bwd, hd, causal, shape):
    import torch

    cfg = exchanged(check_bwd, shape, hd, causal)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.float16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [192, 256], ids=_ID.get)
@pytest.mark.parametrize("change", [dict(dq_accum="red_v2"), dict(spt_order=False, head_swizzle=2),
                                    dict(ds_store="sts"), dict(dkv_store="direct"), dict(dp_first=True),
                                    dict(dk_before_dq=True), dict(dp_first=True, dk_before_dq=True),
                                    dict(dk_before_dq=True, ds_stages=1)])
def test_exchange_with_other_knobs(check_bwd, hd, change):
    """The exchange beside the knobs that touch its neighbours: per-thread dQ adds of the half
    tile, the pair scheduling order, per-element dS^T stores, dK/dV without TMA, the step orders
    (dK before the wait for the peer's dS, the peer's buffer released after dQ; one dS buffer,
    where that release gates the peer's next store) (causal, GQA)."""
    import torch

    shape = (1, 1000, 1000, 8, 8) if "dkv_store" in change else (1, 777, 1333, 8, 2)
    cfg = exchanged(check_bwd, shape, hd, True, **change)
    ok, info = check_bwd.check_case(*shape, hd, True, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [192, 256], ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
def test_exchange_with_sink_and_lse_grad(check_bwd, feat, hd, causal):
    """A learnable sink (its gradient reduced on the host from D) and the LSE's gradient (in D):
    the exchanged kernel is the plain one, the host's sums come from its D."""
    from fa4.problem import Problem

    shape = (1, 777, 1333, 8, 2)
    cfg = check_bwd.exchanged(Problem(*shape, hd, hd, causal=causal, pass_="bwd", sink=True))
    ok, info = feat.check_case(*shape, hd, causal=causal, sink=True, dlse=True, config=cfg)
    assert ok, info
