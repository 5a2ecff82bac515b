"""gqa_reduce 'loop' on the GPU (one CTA per key tile and K/V head walks the group's query heads,
dK/dV stored once) against PyTorch autograd in fp32 with FlashAttention's error rule
(bench/check_bwd_feat.py; the forward's out and lse from the fp32 reference).

Cases: GQA 2, 4 and 8 (and 7, Qwen's), causal and not, Sq != Sk both ways, odd seqlens, a key
range shorter than a tile, fp16, window + softcap + sink + the LSE's gradient, the knobs whose
paths the loop touches (dK/dV by element stores, dQ by per-thread reductions, P^T through shared
memory, a one-deep ring), head dims 96-256, and deterministic mode bitwise over 10 runs.
"""

import pytest

pytestmark = pytest.mark.gpu

def loop_config(feat, shape, hd, causal, det=False, softcap=0.0, dtype=None, features=None, **change):
    """The problem's default with gqa_reduce 'loop' (these small shapes default to 'atomic') and,
    unless changed, dK/dV by TMA (the 'loop' default at the sizes that take it); without the 2-CTA
    dS exchange (the hd256 default, not built with 'loop'), and at head_dim 192/256 without the
    default's shifted query starts where they apply (q_starts with 'loop' spills there). ``features``:
    the window and sink the case runs (check_case's keywords), which the default is resolved with."""
    import torch

    change.setdefault("dkv_store", "tma")
    change.setdefault("cluster_exchange", False)
    if hd in (192, 256):
        change.setdefault("q_starts", 1)
    b, sq, sk, hq, hkv = shape
    dtype = dtype or torch.bfloat16
    q = torch.empty(b, sq, hq, hd, device="cuda", dtype=dtype)
    kv = torch.empty(b, sk, hkv, hd, device="cuda", dtype=dtype)
    cfg = feat.default_for(q, kv, kv, causal, det, **{"softcap": softcap, **(features or {})}, gqa_reduce="loop",
                           **change)
    assert cfg.gqa_reduce == "loop"
    return cfg

SHAPES = [(2, 1000, 1000, 8, 4), (1, 333, 777, 8, 2), (1, 777, 333, 8, 1), (2, 1027, 1027, 28, 4), (3, 65, 1, 4, 2)]

@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_loop_grads(feat, hd, causal, shape):
    ok, info = feat.check_case(*shape, hd, causal=causal, config=loop_config(feat, shape, hd, causal))
    assert ok, info

@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_loop_fp16(feat, hd, causal):
    import torch

    shape = (1, 777, 1333, 8, 2)
    cfg = loop_config(feat, shape, hd, causal, dtype=torch.float16)
    ok, info = feat.check_case(*shape, hd, dtype=torch.float16, causal=causal, config=cfg)
    assert ok, info

@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 777, 1333, 8, 2), (2, 1000, 1000, 8, 1)], ids=lambda s: "x".join(map(str, s)))
def test_loop_window_softcap_sink(feat, hd, causal, shape):
    """Window, softcap, sink (dsink reduced from D) and the LSE's gradient at once."""
    kw = dict(window_left=200, window_right=30, softcap=20.0)
    cfg = loop_config(feat, shape, hd, causal, softcap=20.0, features=dict(kw, sink=True))
    ok, info = feat.check_case(*shape, hd, causal=causal, sink=True, dlse=True, config=cfg, **kw)
    assert ok, info

@pytest.mark.parametrize("hd,change", [
    (64, dict(tile_m=64, dq_split="head_dim", stat_shuffle=False, dkv_store="direct")),
    (64, dict(tile_m=64, dq_split="head_dim", stat_shuffle=False, dq_accum="red_v2")),
    (128, dict(dv_operand="smem")),
    (128, dict(stages=1, dkv_store="direct")),
], ids=lambda x: str(x))
@pytest.mark.parametrize("causal", [False, True])
def test_loop_with_other_knobs(feat, hd, change, causal):
    shape = (1, 777, 1333, 8, 2)
    ok, info = feat.check_case(*shape, hd, causal=causal, config=loop_config(feat, shape, hd, causal, **change))
    assert ok, info

@pytest.mark.parametrize("hd", [96, 192, 256])
def test_loop_later_head_dims(feat, hd):
    shape = (1, 333, 777, 8, 2)
    ok, info = feat.check_case(*shape, hd, causal=True, config=loop_config(feat, shape, hd, True))
    assert ok, info

@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spt", [True, False])
@pytest.mark.parametrize("kw", [{}, dict(window_left=150, window_right=10, softcap=20.0, sink=True)],
                         ids=["plain", "features"])
def test_loop_deterministic_bitwise(feat, hd, causal, spt, kw):
    """Ten backwards bitwise identical and right: dQ's turns hold while a CTA walks 4 heads."""
    shape = (1, 777, 1333, 8, 2)
    cfg = loop_config(feat, shape, hd, causal, True, features=feat.problem_features(kw), spt_order=spt)
    ok, info = feat.check_deterministic(*shape, hd, causal=causal, config=cfg, **kw)
    assert ok, info

def test_loop_matches_atomic(feat):
    """The two reductions agree (dK/dV summed in another order: within bf16 rounding) at a GQA 8
    shape with a partial last key tile."""
    import dataclasses
    import math

    import torch

    shape, hd = (1, 1500, 1500, 16, 2), 128
    q, k, v, dout, out, lse, s, dl = feat.make_inputs(*shape, hd, torch.bfloat16, 3, causal=True)
    loop_cfg = loop_config(feat, shape, hd, True)
    loop = feat.run_ours(q, k, v, dout, out, lse, s, dl, True, config=loop_cfg)
    atomic_cfg = dataclasses.replace(loop_cfg, gqa_reduce="atomic", dkv_store="direct")
    atomic = feat.run_ours(q, k, v, dout, out, lse, s, dl, True, config=atomic_cfg)
    for a, b in zip(loop, atomic):
        rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
        assert rel < 2 ** -7, rel
    ok, info = feat.grads_match(loop, q, k, v, dout, dl, sink=s, out=out, scale=1 / math.sqrt(hd), causal=True)
    assert ok, info

@pytest.mark.parametrize("causal", [False, True])
def test_loop_deterministic_hd64_tile128(feat, causal):
    """hd64 deterministic 'loop' at query tile 128 (the default where Sq << Sk takes 'loop'),
    bitwise over 10 runs and right."""
    shape = (1, 777, 1333, 8, 2)
    cfg = loop_config(feat, shape, 64, causal, True, tile_m=128, dq_split="rows")
    ok, info = feat.check_deterministic(*shape, 64, causal=causal, config=cfg)
    assert ok, info

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [False, True])
def test_atomic_deterministic_hd64_tile128(feat, causal, window):
    """hd64 deterministic 'atomic' at query tile 128 with the stmatrix dS^T store (the masked GQA
    default since session 13), bitwise over 10 runs and right; with a window too (its mask limits
    beside the dK/dV locks)."""
    import torch

    shape = b, sq, sk, hq, hkv = (1, 777, 1333, 8, 2)
    q = torch.empty(b, sq, hq, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.empty(b, sk, hkv, 64, device="cuda", dtype=torch.bfloat16)
    kw = dict(window_left=300, window_right=40) if window else {}
    cfg = feat.default_for(q, kv, kv, causal, True, 0.0, gqa_reduce="atomic", dkv_store="direct",
                           tile_m=128, dq_split="rows", ds_store="stmatrix")
    assert cfg.tile_m == 128 and cfg.gqa_reduce == "atomic"
    ok, info = feat.check_deterministic(*shape, 64, causal=causal, config=cfg, **kw)
    assert ok, info
