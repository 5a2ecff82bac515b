"""q_order 'descending' on the GPU (each CTA walks its query tiles from the last one down) against
PyTorch autograd in fp32 with FlashAttention's error rule (bench/check_bwd_feat.py), and
deterministic mode bitwise over 10 runs with either launch order: the dQ turns follow the launch
order whatever the walk, so the longest-first launch (spt_order False) must neither deadlock nor
change the sums' order from run to run.

Cases: MHA and GQA 4 ('atomic' dK/dV adds behind their own turns, and 'loop', whose walk runs
backwards head after head), Sq < Sk and Sq > Sk (query rows that see no key), hd64 at query tile
128, the per-thread dQ reductions, a sliding window with softcap and a sink (its left-cut run
walked first).
"""

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

DESC = dict(q_order="descending")
SHAPES = [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2), (1, 1333, 777, 8, 2)]


def _config(feat, shape, hd, causal, det, softcap=0.0, **change):
    import torch

    b, sq, sk, hq, hkv = shape
    q = torch.empty(b, sq, hq, hd, device="cuda", dtype=torch.bfloat16)
    kv = torch.empty(b, sk, hkv, hd, device="cuda", dtype=torch.bfloat16)
    cfg = feat.default_for(q, kv, kv, causal, det, softcap, **change)
    assert cfg.q_order == "descending"
    return cfg


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("spt", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_descending_deterministic_bitwise(feat, hd, spt, shape):
    cfg = _config(feat, shape, hd, True, True, spt_order=spt, **DESC)
    ok, info = feat.check_deterministic(*shape, hd, causal=True, config=cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_descending_grads(feat, hd, shape):
    ok, info = feat.check_case(*shape, hd, causal=True, config=_config(feat, shape, hd, True, False, **DESC))
    assert ok, info


@pytest.mark.parametrize("hd,change", [
    (64, dict(tile_m=128, dq_split="rows")),
    (64, dict(tile_m=64, dq_split="head_dim", dq_accum="red_v2")),
    (128, dict(dq_accum="red")),
    (128, dict(gqa_reduce="loop", dkv_store="tma")),
    (64, dict(gqa_reduce="loop", dkv_store="tma")),
], ids=str)
def test_descending_other_paths_deterministic(feat, hd, change):
    shape = (1, 777, 1333, 8, 2)
    cfg = _config(feat, shape, hd, True, True, spt_order=False, **DESC, **change)
    ok, info = feat.check_deterministic(*shape, hd, causal=True, config=cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_descending_window_softcap_sink(feat, hd, causal):
    """A window (both bounds; the left one's cut run is walked first), softcap, a sink and the
    LSE's gradient, deterministic, longest key tiles first."""
    shape = (1, 777, 1333, 8, 2)
    kw = dict(window_left=200, window_right=30, softcap=20.0)
    base = _config(feat, shape, hd, True, True, 20.0, spt_order=False, **DESC)
    cfg = dataclasses.replace(base, gqa_reduce="atomic")
    ok, info = feat.check_deterministic(*shape, hd, causal=causal, sink=True, config=cfg, **kw)
    assert ok, info
