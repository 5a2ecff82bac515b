"""The backward's wide-head tiling (knob qm_tile_n, fa4.sm90.bwd_qm) on the GPU against PyTorch
autograd in fp32 (bench/check_bwd.py and bench/check_bwd_feat.py: FlashAttention's error rule).

Cases: each layout (hd192 with 96 keys and the reference's rings, Q 2 / dO 1; hd192/128; hd256 with
48 keys), odd seqlens, Sq != Sk causal (rows that see no key), GQA 'atomic' (a key tile of 96 or 48
past the accumulators' 128-row padding) and 'loop', fp16, the knobs beside it one at a time, the
other key tiles, deterministic bitwise over 10 runs, and issue 18's features (window, softcap, sink,
the LSE's gradient).
"""

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

# The layout's config per head dims, over each problem's default (fa4.sm90.bwd_config: the
# exchange is not built with it).
QM = {
    192: dict(qm_tile_n=96, stages=2, do_single=True, ds_stages=1, dq_accum="bulk"),
    (192, 128): dict(qm_tile_n=96, stages=2, do_single=False, ds_stages=1, dq_accum="bulk"),
    256: dict(qm_tile_n=48, stages=2, do_single=True, ds_stages=1, dq_accum="bulk", ds_store="sts"),
}
# The knobs not built with the layout (the exchange) or off unless a test turns them on.
OFF = dict(cluster_exchange=False, dp_first=False, dk_before_dq=False)
_ID = {192: "hd192", (192, 128): "hd192v128", 256: "hd256"}
SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1), (1, 1000, 1000, 8, 2)]


def qm_config(check_bwd, shape, hd, causal, det, **change):
    """The problem's default with the layout's knobs and ``change``, checked feasible."""
    from fa4.sm90.bwd_config import violations

    base = check_bwd.default_for(shape, hd, causal, det)
    cfg = dataclasses.replace(base, **{**OFF, **QM[hd], **change})
    prob = check_bwd.problem_for(shape, hd, causal, det)
    assert not violations(cfg, prob), violations(cfg, prob)
    return cfg


def check_qm(check_bwd, shape, hd, causal, fp16=False, **change):
    """The layout's config with ``change``, non-deterministic, against fp32 autograd (the error rule)."""
    import torch

    cfg = qm_config(check_bwd, shape, hd, causal, False, **change)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.float16 if fp16 else torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", list(QM), ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_qm_grads_match_reference(check_bwd, hd, causal, shape):
    check_qm(check_bwd, shape, hd, causal)


@pytest.mark.parametrize("hd", list(QM), ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
def test_qm_fp16(check_bwd, hd, causal):
    check_qm(check_bwd, (1, 777, 1333, 8, 2), hd, causal, fp16=True)


# The knobs beside the layout, one at a time (each feasible; GQA shape unless a dK/dV store is
# the change, whose choice exists only with one K/V head per query head).
CHANGES = [(hd, c) for hd in (192, (192, 128)) for c in (
    dict(stages=1, do_single=False), dict(ds_stages=2, do_single=True) if hd == (192, 128) else dict(stages=1, ds_stages=2),
    # (Per-thread dQ adds fit the registers beside 96 keys' dK^T/dV^T only at hd192/128.)
    dict(ds_store="sts"), dict(dq_accum="red_v2", qm_tile_n=96 if hd == (192, 128) else 64),
    dict(dq_accum="red", qm_tile_n=96 if hd == (192, 128) else 64), dict(dkv_store="direct"),
    dict(dp_first=True), dict(dk_before_dq=True), dict(qm_tile_n=64),
    dict(spt_order=True), dict(head_swizzle=4),
)] + [(256, c) for c in (
    dict(stages=1, do_single=False), dict(dq_accum="red_v2"), dict(dkv_store="direct"), dict(dk_before_dq=True),
    dict(dp_first=True), dict(qm_tile_n=64, stages=1, do_single=False, ds_store="stmatrix"),
)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,change", CHANGES, ids=lambda x: _ID.get(x) if not isinstance(x, dict) else None)
def test_qm_with_each_knob(check_bwd, hd, causal, change):
    check_qm(check_bwd, check_bwd.variant_shape(change), hd, causal, **change)


@pytest.mark.parametrize("hd", [192, (192, 128)], ids=_ID.get)
def test_qm_mask_bits(check_bwd, hd):
    """mask_bits (a causal problem's masked rows as bit words) with the rows being queries."""
    check_qm(check_bwd, check_bwd.variant_shape({}), hd, True, mask_bits=True)


@pytest.mark.parametrize("hd", list(QM), ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
def test_qm_gqa_loop(check_bwd, hd, causal):
    """gqa_reduce 'loop': a CTA walks its K/V head's query heads, dK^T/dV^T held across them."""
    # The plain walk: shifted starts (q_starts, 16 by default at hd256 here) spill beside 'loop' at
    # the split head dims (violations()).
    check_qm(check_bwd, (2, 300, 1500, 8, 2), hd, causal, gqa_reduce="loop", q_starts=1)


@pytest.mark.parametrize("hd", list(QM), ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2)])
def test_qm_deterministic_bitwise(check_bwd, hd, causal, shape):
    """Ten backwards on the same inputs are bitwise identical, and right (dQ turns; GQA's dK/dV
    turns with 'atomic')."""
    import torch

    cfg = qm_config(check_bwd, shape, hd, causal, True)
    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


FEATURES = [dict(window_left=256), dict(window_left=300, window_right=50), dict(softcap=30.0), dict(sink=True),
            dict(dlse=True), dict(window_left=100, softcap=20.0, sink=True, dlse=True)]


@pytest.mark.parametrize("hd", [192, 256], ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_qm_features(feat, hd, causal, feature):
    import torch

    from fa4.problem import Problem
    from fa4.sm90.bwd_config import violations
    from fa4.sm90.bwd_defaults import default_config

    shape = (1, 777, 1333, 8, 2)
    b, sq, sk, hq, hkv = shape
    prob = Problem(b, sq, sk, hq, hkv, hd, hd, causal=causal, pass_="bwd",
                   window_left=feature.get("window_left", -1), window_right=feature.get("window_right", -1))
    if feature.get("softcap") and hasattr(prob, "softcap"):
        prob = dataclasses.replace(prob, softcap=feature["softcap"])
    cfg = dataclasses.replace(default_config(prob), **{**OFF, **QM[hd]})
    assert not violations(cfg, prob), violations(cfg, prob)
    ok, info = feat.check_case(*shape, hd, torch.bfloat16, causal=causal, config=cfg, **feature)
    assert ok, info
