"""Our forward with issue 18's features on the GPU against an fp32 reference (the error rule of
test_fwd_gpu.py: error <= 2x PyTorch's own same-dtype error + 1e-4; LSE within 1e-3).

Sliding windows (causal and not, a window smaller than a tile, rows that see nothing), softcap
(MUFU and the FMA-pipe tanh split), learnable sinks, all combined; odd seqlens, Sq != Sk, GQA,
fp16, several head dims. The output is poisoned with NaN before each run; NaN never passes.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fa4  # noqa: E402
from fa4.features import normalize, problem_fields  # noqa: E402
from fa4.problem import Problem  # noqa: E402
from fa4.sm90.fwd_config import default_config, violations  # noqa: E402
from tests.fa4.cpu_kernels import _scores  # noqa: E402

SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1)]


def _low(q, k, v, scale, causal, wl, wr, cap, sink):
    """PyTorch in the input dtype (QK^T and PV in 16 bits, softmax in fp32): the error yardstick."""
    rep = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = (qt @ kt.transpose(-1, -2)).float() * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=s.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=s.device)[None, :]
    mask = torch.zeros_like(s, dtype=torch.bool)
    if causal:
        mask |= j > i
    if wr >= 0:
        mask |= j > i + wr
    if wl >= 0:
        mask |= j < i - wl
    s = s.masked_fill(mask, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float()[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)[..., :sk]
    return (p.to(q.dtype) @ vt).transpose(1, 2)


def _ref(q, k, v, scale, causal, wl, wr, cap, sink):
    rep = q.shape[2] // k.shape[2]
    s = _scores(q, k, scale, causal, wl, wr, cap)
    vv = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    if sink is None:
        lse = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    else:
        col = sink.float()[None, :, None, None].expand(*s.shape[:3], 1)
        lse = torch.logsumexp(torch.cat([s, col], dim=-1), dim=-1)
        p = torch.exp(s - lse[..., None])
    return (p @ vv).transpose(1, 2), lse


def check(shape, hd, causal, window=(None, None), softcap=0.0, sink=False, dtype=torch.bfloat16, change=None,
          scale_mult=1.0, hdv=None):
    b, sq, sk, hq, hkv = shape
    hdv = hdv or hd
    g = torch.Generator(device="cuda").manual_seed(1234 + sq + 7 * sk + hd)
    q = (torch.randn(b, sq, hq, hd, device="cuda", generator=g) * scale_mult).to(dtype)
    k = (torch.randn(b, sk, hkv, hd, device="cuda", generator=g) * scale_mult).to(dtype)
    v = torch.randn(b, sk, hkv, hdv, device="cuda", generator=g).to(dtype)
    s = torch.randn(hq, device="cuda", generator=g) * 2 if sink else None
    feat = normalize(q, causal, window, s, softcap)
    problem = Problem(b, sq, sk, hq, hkv, hd, hdv, "bf16" if dtype == torch.bfloat16 else "fp16", feat.causal,
                      **problem_fields(feat))
    cfg = dataclasses.replace(default_config(problem), **(change or {}))
    assert not violations(cfg, problem), violations(cfg, problem)
    out = torch.full((b, sq, hq, hdv), float("nan"), device="cuda", dtype=dtype)
    o, lse = fa4.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, learnable_sink=s,
                                 return_lse=True, config=cfg, out=out)
    torch.cuda.synchronize()
    scale = 1.0 / math.sqrt(hd)
    wl, wr = feat.window_left, feat.window_right
    ref, ref_lse = _ref(q, k, v, scale, feat.causal, wl, wr, feat.softcap, s)
    low = _low(q, k, v, scale, feat.causal, wl, wr, feat.softcap, s)
    err = (o.float() - ref).abs().max().item()
    err_pt = (low.float() - ref).abs().max().item()
    assert not torch.isnan(o).any()
    fin = torch.isfinite(ref_lse)
    if fin.any():
        assert (lse[fin] - ref_lse[fin]).abs().max().item() <= 1e-3
    # Rows that see no key: O = 0 and LSE = -inf (no sink).
    assert bool((lse[~fin] == float("-inf")).all())
    empty = ~fin.any(dim=0).any(dim=0)  # (Sq,) rows no batch/head sees a key of (a mask property)
    if empty.any():
        assert bool((o[:, empty] == 0).all())
    assert err <= 2 * err_pt + 1e-4, (err, err_pt)
    return err, err_pt


# hd128 (two consumer warpgroups) and hd64 (three): every feature alone and combined.
FEATURES = {
    "causal-window": dict(causal=True, window=(255, None)),
    "window-lr": dict(causal=False, window=(100, 37)),
    "window-right": dict(causal=False, window=(None, 5)),
    "window-tiny": dict(causal=False, window=(3, 2)),  # smaller than a tile: both edges in one tile
    "causal-softcap": dict(causal=True, softcap=30.0),
    "softcap-small-cap": dict(causal=False, softcap=5.0),
    "sink": dict(causal=False, sink=True),
    "causal-sink": dict(causal=True, sink=True),
    "causal-window-softcap-sink": dict(causal=True, window=(64, None), softcap=30.0, sink=True),
    "window-lr-softcap-sink": dict(causal=False, window=(129, 300), softcap=20.0, sink=True),
}


# hd64: the variants whose kernels differ most (each new kernel costs a compile on the device).
HD64 = ("causal-window", "window-tiny", "causal-softcap", "sink", "causal-window-softcap-sink",
        "window-lr-softcap-sink")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("hd,name", [(128, n) for n in FEATURES] + [(64, n) for n in HD64])
def test_features_match_reference(hd, name, shape):
    check(shape, hd, **FEATURES[name])


@pytest.mark.parametrize("frac", [0.25, 0.5])
@pytest.mark.parametrize("scale_mult", [1.0, 3.0])  # 3x: scores near the cap, tanh saturating
def test_softcap_fma_split_matches_reference(frac, scale_mult):
    check((2, 1000, 1000, 4, 2), 128, True, softcap=30.0, change={"tanh_fma_frac": frac}, scale_mult=scale_mult)
    check((1, 777, 333, 4, 1), 128, True, window=(64, None), softcap=30.0, sink=True,
          change={"tanh_fma_frac": frac}, scale_mult=scale_mult)


def test_softcap_fma_split_hd64():
    check((2, 1000, 1000, 4, 2), 64, True, softcap=30.0, change={"tanh_fma_frac": 0.125}, scale_mult=3.0)


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("name", ["causal-window-softcap-sink", "window-lr-softcap-sink"])
def test_exp_pin_with_features(hd, name):
    """exp_pin fences the softmax's exponentials ahead of the PV wait with every feature on (the
    softcap's tanh before them, masked tiles, the sink's share at the end)."""
    check(SHAPES[1], hd, change={"exp_pin": True}, **FEATURES[name])


# The features whose masked tiles take the bit words under mask_bits (a bound that moves per row).
MASKED = [n for n, f in FEATURES.items() if f["causal"] or f.get("window")]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("hd,name", [(128, "causal"), (64, "causal")] + [(128, n) for n in MASKED]
                         + [(64, n) for n in HD64 if n in MASKED])
def test_mask_bits_matches_reference(hd, name, shape):
    """mask_bits (fa4.common.masking: each row's verdicts as 32-bit words) against the fp32 reference:
    causal with Sq != Sk both ways, windows narrower than a tile, rows that see no key."""
    check(shape, hd, change={"mask_bits": True}, **FEATURES.get(name, {"causal": True}))


@pytest.mark.parametrize("hd,hdv", [(96, 96), (192, 192), (192, 128), (256, 256)])
def test_mask_bits_wide_head_dims(hd, hdv):
    for shape in SHAPES[1:]:
        check(shape, hd, True, hdv=hdv, change={"mask_bits": True})
        check(shape, hd, False, window=(100, 37), hdv=hdv, change={"mask_bits": True})


@pytest.mark.parametrize("hd,hdv", [(96, 96), (192, 192), (192, 128), (256, 256)])
def test_wide_head_dims_all_features(hd, hdv):
    check((1, 333, 777, 4, 2), hd, True, window=(64, None), softcap=30.0, sink=True, hdv=hdv)


@pytest.mark.parametrize("hd", [64, 128])
def test_fp16(hd):
    check((2, 1000, 1000, 4, 2), hd, True, window=(64, None), softcap=30.0, sink=True, dtype=torch.float16)


def test_rows_that_see_nothing():
    # Sq > Sk causal with a window: the first 444 rows see no key (O = 0, LSE = -inf); and a
    # window that excludes every key of the first rows when seqlen_k is short.
    check((1, 777, 333, 4, 1), 128, True, window=(10, None))
    b, sq, sk, h = 1, 300, 100, 2
    q = torch.randn(b, sq, h, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, h, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, h, 128, device="cuda", dtype=torch.bfloat16)
    sink = torch.tensor([0.5, -2.0], device="cuda")
    o, lse = fa4.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
    assert bool((o[:, :200] == 0).all())
    # A row that sees nothing has the sink alone: LSE = sink (as the reference FA4).
    # (the kernel's sink * log2(e) * ln(2): within an ulp or two of the logit)
    assert torch.allclose(lse[0, :, :200], sink[:, None].expand(2, 200), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_sink_single_key(hd, causal):
    """The backward's failing shape (3, 65, 1, 2, 1), forward side: one key; causal, rows 0..63 see
    none (LSE = the sink, O = 0) and both consumer warpgroups of a tile_m 128 run the one KV tile."""
    check((3, 65, 1, 2, 1), hd, causal, sink=True)
    check((3, 65, 1, 2, 1), hd, causal, sink=True, softcap=5.0, change={"tanh_fma_frac": 0.5} if hd == 128 else None)
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(3, 65, 2, hd, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(3, 1, 1, hd, device="cuda", generator=g).bfloat16() for _ in range(2))
    sink = torch.tensor([0.5, -2.0], device="cuda")
    o, lse = fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink, return_lse=True)
    seen = 1 if causal else 65
    assert bool((o[:, :65 - seen] == 0).all()) and not torch.isnan(o).any()
    assert torch.allclose(lse[:, :, :65 - seen], sink[None, :, None].expand(3, 2, 65 - seen), rtol=1e-6, atol=1e-6)
    p = torch.sigmoid((q[:, 65 - seen:].float() @ k[:, 0, 0].float()[:, :, None].unsqueeze(1)).squeeze(-1)
                      / math.sqrt(hd) - sink)  # (3, seen, 2): the key's share against the sink
    want = p[..., None] * v[:, 0, 0].float()[:, None, None, :]
    assert (o[:, 65 - seen:].float() - want).abs().max().item() <= 2e-2


def test_large_scores_with_sink_and_tau():
    # Row maxima jumping across tiles (tau's conditional rescale) with the sink folded at the end.
    check((1, 2048, 2048, 4, 4), 128, True, sink=True, scale_mult=4.0)
    check((1, 2048, 2048, 4, 4), 64, False, window=(500, 500), sink=True, scale_mult=4.0)


# ctas_per_sm 2 (hd64 only: two CTAs of 104-register consumers an SM, tile_n 64 or 80, P through
# shared memory); the default of hd64 causal up to 512 keys.
TWO_CTAS = {"ctas_per_sm": 2, "tile_m": 128, "tile_n": 64, "p_operand": "smem"}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["causal", "full"] + list(HD64))
def test_two_ctas_per_sm_matches_reference(name, shape):
    check(shape, 64, change=TWO_CTAS, **FEATURES.get(name, {"causal": name == "causal"}))


@pytest.mark.parametrize("extra", [{"tile_n": 80}, {"exp_pin": True}, {"kv_stages": 3}, {"mask_bits": False},
                                   {"pingpong": "off"},
                                   {"intra_wg_overlap": False, "pingpong": "mma", "exp_pin": False}])
def test_two_ctas_per_sm_variants(extra):
    check((2, 1000, 1000, 4, 2), 64, True, change={**TWO_CTAS, **extra})
    check((1, 333, 777, 4, 1), 64, True, window=(64, None), softcap=30.0, sink=True, change={**TWO_CTAS, **extra})


def test_two_ctas_per_sm_fp16_and_the_short_default():
    check((2, 1000, 1000, 4, 2), 64, True, window=(64, None), softcap=30.0, sink=True, dtype=torch.float16,
          change=TWO_CTAS)
    # The default at 512 keys (causal hd64) is a two-CTA kernel: every feature, GQA, Sq != Sk.
    for shape in ((4, 512, 512, 8, 2), (2, 300, 512, 4, 4), (2, 512, 200, 4, 1)):
        problem = Problem(shape[0], shape[1], shape[2], shape[3], shape[4], 64, 64, causal=True)
        assert default_config(problem).ctas_per_sm == 2
        check(shape, 64, True)
        check(shape, 64, True, window=(64, None), softcap=30.0, sink=True)
