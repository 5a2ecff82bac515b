"""The backward walking its query tiles down (knob walk_down, fa4.common.bwd_schedule.walk_down_tile
and walk_runs) on the GPU against PyTorch autograd in fp32 (bench/check_bwd.py, bench/check_bwd_feat.py:
FlashAttention's error rule).

Every role of the kernel (the producer's loads, the consumers' masked and unmasked loops, the dQ
writer warps or the consumers' own dQ adds) must visit the same tile at each walk position: a
mismatch reads another tile's Q, dO or row statistics, or adds dQ into another tile, and the
gradients are wrong. The masked tiles come last walking down (first the window's left-bound ones);
a masked tile run unmasked shows as a wrong gradient too. Cases: each head-dim layout (dkv_split
'keys' at 64/96/128, the queries-on-M tiling at 192 and 192/128, the exchange of a cluster pair
at 256), odd seqlens and Sq != Sk both ways, GQA 'atomic' and 'loop', the consumers' dQ adds, the
sliding window (both bounds, a left bound alone), fp16; and what the knob is for, the
deterministic backward launched longest first: bitwise identical over 10 runs and right.
Varlen: tests/fa4/test_varlen_bwd_gpu.py (`-k walk_down`).
"""

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

HDS = [64, 96, 128, 192, (192, 128), 256]
_ID = {64: "hd64", 96: "hd96", 128: "hd128", 192: "hd192", (192, 128): "hd192v128", 256: "hd256"}
SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 8, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1), (1, 4100, 4100, 2, 2)]


def walking_down(check_bwd, shape, hd, det, **change):
    """The problem's causal default with walk_down and ``change`` (bench/check_bwd.py: with_knob), its
    walk unshifted (q_starts 1: the default's 16 where Sq < Sk at hd128/256 permutes the walk too)."""
    return check_bwd.with_knob(shape, hd, True, det, "walk_down", True, **{"q_starts": 1, **change})


@pytest.mark.parametrize("hd", HDS, ids=_ID.get)
@pytest.mark.parametrize("shape", SHAPES)
def test_walking_down_matches_reference(check_bwd, hd, shape):
    import torch

    cfg = walking_down(check_bwd, shape, hd, False)
    ok, info = check_bwd.check_case(*shape, hd, True, torch.bfloat16, cfg)
    assert ok, info


# The deterministic backward the knob is for: longest key tiles first (spt_order False, whose dQ
# turns then follow walk_down's order), with GQA 'atomic' (dK/dV turns too) and 'loop', the
# consumers' own dQ adds at hd64, and the wider head dims.
DET_SHAPES = [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2), (1, 1333, 777, 8, 2)]
DET_CHANGES = [
    (64, dict(spt_order=False)),
    (64, dict(spt_order=False, tile_m=64, dq_split="head_dim", stat_shuffle=False, dq_accum="red_v2")),
    (128, dict(spt_order=False)),
    (128, dict(spt_order=False, gqa_reduce="loop")),
    (128, {}),
    (96, dict(spt_order=False)),
    (192, dict(spt_order=False)),
    ((192, 128), dict(spt_order=False)),
    (256, dict(spt_order=False)),
]


@pytest.mark.parametrize("hd,change", DET_CHANGES, ids=lambda x: _ID.get(x) if not isinstance(x, dict) else
                         "-".join(f"{k}={v}" for k, v in x.items()) or "default")
@pytest.mark.parametrize("shape", DET_SHAPES)
def test_walking_down_deterministic_bitwise(check_bwd, hd, change, shape):
    """Ten backwards on the same inputs are bitwise identical, and right (against fp32 autograd)."""
    import torch

    if change.get("gqa_reduce") == "loop" and shape[3] == shape[4]:
        shape = (shape[0], shape[1], shape[2], shape[3], shape[3] // 2)
    cfg = walking_down(check_bwd, shape, hd, True, **change)
    ok, info = check_bwd.check_deterministic(*shape, hd, True, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd,shape", [(128, (1, 8192, 8192, 8, 2)), (128, (1, 8192, 8192, 4, 4)),
                                      (128, (1, 2048, 8192, 64, 8)), (64, (1, 8192, 8192, 8, 2))],
                         ids=["gqa", "mha", "loop-sq2k", "hd64-gqa"])
def test_the_deterministic_default_walks_down_bitwise(check_bwd, hd, shape):
    """The default where it walks down (bwd_defaults.det_walk_down_pays: deterministic causal hd128 or hd64
    under GQA, 64 key tiles a head; GQA 'loop' at Sq < Sk), with its launch order (longest first, 16
    heads a group): ten runs bitwise equal and right."""
    import torch

    cfg = check_bwd.default_for(shape, hd, True, True)
    assert (cfg.walk_down, cfg.spt_order, cfg.head_swizzle) == (True, False, 16)
    ok, info = check_bwd.check_deterministic(*shape, hd, True, torch.bfloat16, cfg)
    assert ok, info


# The other dQ paths and layouts: the consumers' reductions (hd64 at tile_m 64), GQA 'loop' (each
# head of the group walked down in turn), the keys-on-M split at 192 and 256 without the pair.
BESIDE_SHAPES = [(1, 1000, 2500, 8, 2), (1, 2500, 1000, 8, 2)]
CHANGES = [
    (64, dict(tile_m=64, dq_split="head_dim", stat_shuffle=False, dq_accum="red_v2")),
    (64, dict(tile_m=64, dq_split="head_dim", stat_shuffle=False, dq_accum="red")),
    (128, dict(gqa_reduce="loop")),
    (192, dict(qm_tile_n=0, do_single=False, dk_before_dq=False, stages=2, ds_stages=2)),
    (256, dict(cluster_exchange=False)),
]


@pytest.mark.parametrize("hd,change", CHANGES)
@pytest.mark.parametrize("shape", BESIDE_SHAPES)
def test_walking_down_beside_other_paths(check_bwd, hd, change, shape):
    import torch

    cfg = walking_down(check_bwd, shape, hd, False, **change)
    ok, info = check_bwd.check_case(*shape, hd, True, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [128, 256], ids=_ID.get)
def test_walking_down_fp16(check_bwd, hd):
    import torch

    shape = (1, 777, 1333, 8, 2)
    cfg = walking_down(check_bwd, shape, hd, False)
    ok, info = check_bwd.check_case(*shape, hd, True, torch.float16, cfg)
    assert ok, info


# The window: both bounds (the left bound's masked tiles first, then the unmasked run, then the
# right bound's), a left bound alone (no right-bound masked run), and the deterministic kernel.
WINDOWS = [(255, 0), (100, 37), (300, -1)]


@pytest.mark.parametrize("hd", [64, 128], ids=_ID.get)
@pytest.mark.parametrize("left,right", WINDOWS)
@pytest.mark.parametrize("det", [False, True], ids=["nondet", "det"])
def test_walking_down_under_a_window(feat, hd, left, right, det):
    import torch

    from fa4.sm90.bwd_config import violations
    from fa4.tensors import problem_of

    shape = (1, 1000, 1333, 8, 2)
    feat_kw = dict(window_left=left, window_right=right)
    q, k, v = (torch.empty(shape[0], n, h, hd, device="cuda", dtype=torch.bfloat16)
               for n, h in ((shape[1], shape[3]), (shape[2], shape[4]), (shape[2], shape[4])))
    # (q_starts 1: walk_down walks one run; the windowed problem's default has it already.)
    change = dict(q_starts=1, spt_order=False) if det else dict(q_starts=1)
    cfg = dataclasses.replace(feat.default_for(q, k, v, False, det, **feat_kw, **change), walk_down=True)
    assert not violations(cfg, problem_of(q, k, v, False, pass_="bwd", deterministic=det, **feat_kw))
    if det:
        ok, info = feat.check_deterministic(*shape, hd, config=cfg, **feat_kw)
    else:
        ok, info = feat.check_case(*shape, hd, config=cfg, **feat_kw)
    assert ok, info
