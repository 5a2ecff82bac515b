"""Our Hopper backward on the GPU against PyTorch autograd in fp32 (FlashAttention error rule).

Cases: odd seqlens, Sq != Sk causal (bottom-right, incl. query rows that see no key), GQA,
each compile-time knob changed alone, and deterministic mode bitwise identical over 10 runs.
The same checks run as a script on the device: python bench/check_bwd.py.
"""

import dataclasses

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1)])
def test_grads_match_reference(check_bwd, hd, causal, det, shape):
    import torch

    cfg = check_bwd.default_for(shape, hd, causal, det)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg, det)
    assert ok, info


# Each compile-time knob moved off the default of its head_dim, alone; at hd64 the query-tile-64
# paths (the reduction dQ adds, P^T through shared memory, per-element dS^T stores, a one-deep
# ring) exist only at tile_m 64, so they are changed together with it. Every change is feasible
# and differs from the default: none is skipped.
_T64 = dict(tile_m=64, dq_split="head_dim", stat_shuffle=False)  # stat_shuffle needs tile_m 128
# The launch order's knobs, whose default depends on the problem (default_launch_order): the other
# order, and another group size than the default's.
FLIP, OTHER = "flip", "other"
KNOB_CHANGES = [(64, c) for c in (
    dict(spt_order=FLIP), dict(head_swizzle=OTHER), dict(ds_stages=1, stat_shuffle=False), dict(dq_split="head_dim"),
    dict(dkv_store="direct"), _T64, dict(_T64, stages=1), dict(_T64, dq_accum="red_v2"), dict(_T64, dq_accum="red"),
    dict(_T64, dv_operand="smem"), dict(_T64, ds_store="sts"), dict(ds_early=False, stat_shuffle=False),
    dict(exp_pin=True), dict(stat_shuffle=False),
)] + [(128, c) for c in (
    dict(stages=1), dict(spt_order=FLIP), dict(head_swizzle=OTHER), dict(dv_operand="smem"), dict(ds_store="sts"),
    dict(ds_stages=1), dict(dkv_store="direct"), dict(ds_early=True), dict(ds_early=True, ds_stages=1),
    dict(ds_early=True, dv_operand="smem"), dict(ds_early=True, ds_store="sts"), dict(exp_pin=True),
    dict(exp_pin=True, ds_early=True),
)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,change", KNOB_CHANGES)
def test_each_knob_alone(check_bwd, hd, causal, change):
    _check_knob_alone(check_bwd, hd, causal, change)


def _check_knob_alone(check_bwd, hd, causal, change):
    """The knob change differs from the default of its shape, is feasible, and is right."""
    import torch

    from fa4.sm90.bwd_config import violations

    shape = check_bwd.variant_shape(change)
    base = check_bwd.default_for(shape, hd, causal, False)
    change = dict(change)
    if change.get("spt_order") == FLIP:
        change["spt_order"] = not base.spt_order
    if change.get("head_swizzle") == OTHER:
        change["head_swizzle"] = 1 if base.head_swizzle != 1 else 4
    cfg = check_bwd.default_for(shape, hd, causal, False, **change)
    assert cfg != check_bwd.default_for(shape, hd, causal, False), f"{change} is the default at hd{hd}"
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, False))
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


# The deterministic kernel's dQ (and GQA dK/dV) add order: with the bulk adds of the producer's
# writer warps (the default), SPT turns off, and at hd64 the consumers' own reduction adds.
DET_CHANGES = [(64, c) for c in ({}, dict(spt_order=False), dict(_T64, dq_accum="red_v2"),
                                 dict(_T64, dq_accum="red_v2", spt_order=False),
                                 dict(tile_m=128, dq_split="rows", stat_shuffle=True))] + [
    (128, c) for c in ({}, dict(spt_order=False), dict(ds_store="sts"))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,change", DET_CHANGES)
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2)])
def test_deterministic_bitwise(check_bwd, hd, causal, change, shape):
    """Ten backwards on the same inputs are bitwise identical, and right (against fp32 autograd)."""
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, hd, causal, True, **change)
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, True))
    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


# gqa_finish 'last_cta': per (key tile, K/V head) the first CTA of the group stores its fp32 tiles,
# the ones between add theirs, the last writes dK/dV. Groups of 4, 2 (a first and a last only) and 7,
# Sq < Sk and Sq > Sk (tiles past a short side), and a single key (every CTA on one key tile).
LAST_SHAPES = [(2, 1000, 1000, 8, 2), (1, 777, 1333, 8, 4), (1, 1333, 777, 28, 4), (3, 65, 1, 4, 1)]
# stat_shuffle (on by default at hd64 tile_m 128 since session 37) is built for gqa_finish 'postprocess'
# only: off here, or 8 of these cases would be infeasible (tests/fa4/test_bwd_walk_configs.py checks).
LAST = dict(gqa_reduce="atomic", gqa_finish="last_cta", stat_shuffle=False)


@pytest.mark.parametrize("hd", [64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", LAST_SHAPES)
def test_gqa_finish_in_the_main_kernel(check_bwd, hd, causal, shape):
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, hd, causal, False, **LAST)
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, False))
    # Three runs on fresh inputs: the arrival order, and with it each CTA's part, changes between them.
    for _ in range(3):
        ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg)
        assert ok, info


@pytest.mark.parametrize("hd", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", LAST_SHAPES)
def test_gqa_add_bulk(check_bwd, hd, causal, shape):
    """gqa_add 'bulk': each CTA's fp32 dK/dV tiles staged in shared memory and added by one bulk
    reduction each into fragment-ordered sums, converted by the dQ postprocess. The same groups and
    ranges as the in-kernel finish (tiles past a short side, a single key), against the fp32 reference."""
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, hd, causal, False, gqa_reduce="atomic", gqa_add="bulk")
    assert cfg.gqa_finish == "postprocess"
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, False))
    for _ in range(2):
        ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg)
        assert ok, info


@pytest.mark.parametrize("hd", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", LAST_SHAPES)
def test_gqa_add_bulk_deterministic(check_bwd, hd, causal, shape):
    """Deterministic gqa_add 'bulk': the first head's CTA stores its staged tiles, the others add
    theirs in head order behind the tile's semaphore; against the fp32 reference, then ten runs
    bitwise alike (check_deterministic)."""
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, hd, causal, True, gqa_reduce="atomic", gqa_finish="postprocess",
                                gqa_add="bulk")
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, True))
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg, deterministic=True)
    assert ok, info
    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", LAST_SHAPES)
def test_gqa_add_bulk_one_stage(check_bwd, causal, shape):
    """hd128 with one Q/dO stage: the rings cannot hold dV's fp32 tile, so dV is staged over K and V
    after dK's reduction has read them (the other branch of add_bulk)."""
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, 128, causal, False, gqa_reduce="atomic", gqa_add="bulk", stages=1)
    assert cfg.tile_m * cfg.stages < cfg.tile_n
    assert not violations(cfg, check_bwd.problem_for(shape, 128, causal, False))
    ok, info = check_bwd.check_case(*shape, 128, causal, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", LAST_SHAPES[:3])
def test_gqa_finish_in_the_main_kernel_deterministic_bitwise(check_bwd, hd, causal, shape):
    """The head order of the turns fixes the order of the additions: ten runs bitwise alike."""
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, hd, causal, True, **LAST)
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, True))
    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


# -- the later head dims: 96 (dkv_split 'keys'), 192, 192/128 and 256 (dkv_split 'head_dim') --

NEW_HDS = [96, 192, (192, 128), 256]
_ID = {96: "hd96", 192: "hd192", (192, 128): "hd192v128", 256: "hd256"}


@pytest.mark.parametrize("hd", NEW_HDS, ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1),
                                   (1, 129, 4097, 2, 2)])
def test_later_head_dims_grads_match_reference(check_bwd, hd, causal, det, shape):
    """Odd seqlens, Sq != Sk both ways under the causal mask (query rows that see no key), GQA and
    MQA, a key count one past a tile: bf16, the default config of each problem."""
    import torch

    cfg = check_bwd.default_for(shape, hd, causal, det)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, cfg, det)
    assert ok, info


@pytest.mark.parametrize("hd", NEW_HDS, ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2)])
def test_later_head_dims_fp16(check_bwd, hd, causal, shape):
    import torch

    cfg = check_bwd.default_for(shape, hd, causal, False)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.float16, cfg)
    assert ok, info


# Knobs moved off each later head dim's default, alone (or with what they need), where feasible.
# hd192's 64-key split (dkv_split 'head_dim' with the keys on M) and its rings.
_SPLIT192 = dict(qm_tile_n=0, do_single=False, dk_before_dq=False, stages=2, ds_stages=2)  # (default_config(..., queries_on_m=False))
LATER_CHANGES = [(96, c) for c in (
    dict(stages=1), dict(ds_stages=1), dict(dv_operand="smem"), dict(ds_store="sts"), dict(dq_accum="red_v2"),
    dict(dkv_store="direct"), dict(spt_order=FLIP),
)] + [(hd, dict(_SPLIT192, **c)) for hd in (192, (192, 128)) for c in (
    # hd192's keys-on-M split (the default before session 27's queries-on-M tiling, whose own knobs
    # are tests/fa4/test_bwd_qm_gpu.py's), itself and with each knob.
    {}, dict(ds_stages=1), dict(stages=1), dict(ds_store="sts"), dict(dq_accum="red_v2"), dict(dq_accum="red"),
    dict(dkv_store="direct"),
)] + [(256, c) for c in (dict(ds_stages=1), dict(ds_store="sts"), dict(dkv_store="direct"), dict(spt_order=FLIP))
] + [(hd, dict(_SPLIT192, **c)) for hd in (192, (192, 128)) for c in (
    # The step orders of dkv_split 'head_dim'.
    dict(dp_first=True), dict(dk_before_dq=True), dict(dp_first=True, dk_before_dq=True),
)] + [(256, c) for c in (
    # hd256's default: the exchange, one Q/dO stage, dk_before_dq (session 27).
    dict(dp_first=True), dict(dk_before_dq=False), dict(dp_first=True, dk_before_dq=False),
)] + [(hd, dict(_SPLIT192, stages=1, **c)) for hd in (192, (192, 128))
      for c in (dict(dp_first=True), dict(dk_before_dq=True))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd,change", LATER_CHANGES, ids=lambda x: _ID.get(x) if not isinstance(x, dict) else None)
def test_later_head_dims_each_knob_alone(check_bwd, hd, causal, change):
    _check_knob_alone(check_bwd, hd, causal, change)


@pytest.mark.parametrize("hd", NEW_HDS, ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("change", [{}, dict(spt_order=False), dict(ds_store="sts")])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2)])
def test_later_head_dims_deterministic_bitwise(check_bwd, hd, causal, change, shape):
    """Ten backwards on the same inputs are bitwise identical, and right."""
    import torch

    from fa4.sm90.bwd_config import violations

    cfg = check_bwd.default_for(shape, hd, causal, True, **change)
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, True))
    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [192, (192, 128), 256], ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("change", [dict(dp_first=True), dict(dk_before_dq=True), dict(dp_first=True, dk_before_dq=True)])
def test_step_orders_deterministic_bitwise(check_bwd, hd, causal, change):
    """dkv_split 'head_dim' with its step orders: the dQ turns do not depend on the GEMM order."""
    import torch

    from fa4.sm90.bwd_config import violations

    shape = (1, 777, 1333, 8, 2)
    cfg = check_bwd.default_for(shape, hd, causal, True, **change)
    assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, True))
    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", NEW_HDS, ids=_ID.get)
@pytest.mark.parametrize("causal", [False, True])
def test_later_head_dims_through_flash_attn_func(check_bwd, hd, causal):
    import math

    import fa4

    d, dv = check_bwd.dims(hd)
    q, k, v, dout = _qkv(2, 700, 900, 8, 2, d, seed=13, dv=dv)
    qg, kg, vg = _leaves(q, k, v)
    out = fa4.flash_attn_func(qg, kg, vg, causal=causal, deterministic=True)
    out.backward(dout)
    grads = (qg.grad, kg.grad, vg.grad)
    assert grads[2].shape == v.shape
    ok, info = check_bwd.grads_match_reference(grads, q, k, v, dout, causal, 1.0 / math.sqrt(d))
    assert ok, info


# -- through fa4.flash_attn_func: autograd, deterministic mode, torch.compile, the custom ops ----

SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1)]


def _qkv(b, sq, sk, hq, hkv, hd, seed, dv=None):
    import torch

    dv = dv or hd
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    return randn(b, sq, hq, hd), randn(b, sk, hkv, hd), randn(b, sk, hkv, dv), randn(b, sq, hq, dv)


def _leaves(*ts):
    return tuple(t.detach().clone().requires_grad_() for t in ts)


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_autograd_grads_match_reference(check_bwd, hd, causal, det, shape):
    import math

    import torch

    import fa4
    from fa4.sm90.bwd_launch import flash_attn_bwd

    q, k, v, dout = _qkv(*shape, hd, seed=11)
    qg, kg, vg = _leaves(q, k, v)
    out = fa4.flash_attn_func(qg, kg, vg, causal=causal, deterministic=det)
    # Without grad, asking for LSE selects the same forward kernel the autograd path runs.
    ref_out, ref_lse = fa4.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert torch.equal(out.detach(), ref_out)
    out.backward(dout)
    grads = (qg.grad, kg.grad, vg.grad)
    ok, info = check_bwd.grads_match_reference(grads, q, k, v, dout, causal, 1.0 / math.sqrt(hd))
    assert ok, info
    if det:
        # The backward ran the kernel with the config the lookup chain names for this problem.
        cfg = fa4.explain(q, k, v, causal, pass_="bwd", deterministic=True).config
        direct = flash_attn_bwd(dout, q, k, v, ref_out, ref_lse, None, causal, True, cfg)
        assert all(torch.equal(a, b) for a, b in zip(grads, direct))


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2), (1, 1500, 700, 8, 1)])
def test_autograd_deterministic_bitwise_over_10_backwards(hd, causal, shape):
    import torch

    import fa4

    q, k, v, dout = _qkv(*shape, hd, seed=3)
    q, k, v = _leaves(q, k, v)
    out = fa4.flash_attn_func(q, k, v, causal=causal, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for run in range(9):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again)), f"run {run + 2} differs"


def test_explicit_bwd_config_is_the_one_run():
    import torch

    import fa4
    from fa4.sm90.bwd_config import violations
    from fa4.sm90.bwd_launch import flash_attn_bwd
    from fa4.tensors import problem_of

    q, k, v, dout = _qkv(1, 900, 900, 8, 2, 128, seed=5)
    prob = problem_of(q, k, v, True, pass_="bwd", deterministic=True)
    # A config the lookup would not pick: a different kernel (ds_stages or stages) and order. The first
    # feasible one is taken so the test follows the feasibility rules instead of restating them.
    chosen = fa4.explain(problem=prob).config
    changes = [{"ds_stages": 3 - chosen.ds_stages, "spt_order": not chosen.spt_order}] + [
               {"stages": s, "spt_order": not chosen.spt_order} for s in (1, 2, 3) if s != chosen.stages]
    cfg = next(c for c in (dataclasses.replace(chosen, **ch) for ch in changes) if not violations(c, prob))
    assert cfg != chosen
    qg, kg, vg = _leaves(q, k, v)
    out = fa4.flash_attn_func(qg, kg, vg, causal=True, deterministic=True, bwd_config=cfg)
    out.backward(dout)
    ref_out, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True)
    want = flash_attn_bwd(dout, q, k, v, ref_out, lse, None, True, True, cfg)
    assert all(torch.equal(a, b) for a, b in zip((qg.grad, kg.grad, vg.grad), want))


@pytest.mark.parametrize("layout", ["transposed", "broadcast"])
def test_non_contiguous_dout(check_bwd, layout):
    import math

    import torch

    import fa4

    q, k, v, _ = _qkv(2, 500, 600, 8, 4, 64, seed=9)
    qg, kg, vg = _leaves(q, k, v)
    out = fa4.flash_attn_func(qg, kg, vg, causal=True)
    if layout == "transposed":  # dO with a strided last dimension
        w = torch.randn(2, 500, 64, 8, device="cuda", dtype=torch.bfloat16)
        (out.transpose(2, 3) * w).float().sum().backward()
        dout = w.transpose(2, 3).contiguous()
    else:  # out.sum(): a dO with every stride 0
        out.float().sum().backward()
        dout = torch.ones_like(q)
    ok, info = check_bwd.grads_match_reference((qg.grad, kg.grad, vg.grad), q, k, v, dout, True, 1 / math.sqrt(64))
    assert ok, info


@pytest.mark.parametrize("hd,causal,gqa,det", [(64, False, False, True), (128, True, True, True),
                                               (128, False, True, False), (64, True, False, False)])
def test_torch_compile_fullgraph_fwd_bwd_equals_eager(check_bwd, hd, causal, gqa, det):
    import math

    import torch

    import fa4

    def f(q, k, v, w):
        o = fa4.flash_attn_func(q, k, v, causal=causal, deterministic=det)
        return (o.float() * w).sum(), o

    q, k, v, dout = _qkv(2, 700, 900, 8, 2 if gqa else 8, hd, seed=21)
    w = dout.float()  # d loss / d o = w, rounded to bf16 by the backward of .float(): dout exactly
    eager = _leaves(q, k, v)
    loss, o = f(*eager, w)
    loss.backward()
    comp = _leaves(q, k, v)
    loss_c, o_c = torch.compile(f, fullgraph=True)(*comp, w)
    loss_c.backward()
    assert torch.equal(o_c, o)  # same forward kernel and config, no reduction in between
    torch.testing.assert_close(loss_c, loss, rtol=1e-4, atol=1e-2)  # the sum may run in another order
    grads_c = tuple(t.grad for t in comp)
    if det:
        assert all(torch.equal(a.grad, b) for a, b in zip(eager, grads_c))
    ok, info = check_bwd.grads_match_reference(grads_c, q, k, v, dout, causal, 1 / math.sqrt(hd))
    assert ok, info


def test_custom_ops_opcheck():
    import torch

    import fa4.ops  # noqa: F401 - registers fa4::fwd / fa4::bwd

    q, k, v, dout = _qkv(1, 200, 333, 4, 2, 128, seed=2)
    # deterministic=True: the checks compare repeated backward runs with the eager one.
    torch.library.opcheck(torch.ops.fa4.fwd, (*_leaves(q, k, v), None, True, None, True, None))
    out, lse = torch.ops.fa4.fwd(q, k, v, None, True, None, True, None)
    torch.library.opcheck(torch.ops.fa4.bwd, (dout, q, k, v, out, lse, None, True, True, None))


@pytest.mark.parametrize("hd,gqa", [(64, False), (128, True)])
def test_torch_compile_fullgraph_with_features_equals_eager(hd, gqa):
    """Window, softcap and a bf16 learnable sink under torch.compile(fullgraph=True), deterministic:
    output, LSE and every gradient (the sink's included) equal the eager call's bit for bit (same
    kernels, same configs, fixed reduction order)."""
    import torch

    import fa4

    def f(q, k, v, sink, w, wl):
        o, lse = fa4.flash_attn_func(q, k, v, causal=True, window_size=(255, 0), softcap=20.0,
                                     learnable_sink=sink, return_lse=True, deterministic=True)
        return (o.float() * w).sum() + (lse * wl).sum(), o, lse

    q, k, v, dout = _qkv(2, 700, 900, 8, 2 if gqa else 8, hd, seed=23)
    w = dout.float()
    wl = torch.randn(2, 8, 700, device="cuda")
    sink0 = torch.randn(8, device="cuda").to(torch.bfloat16)
    runs = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = _leaves(q, k, v) + (sink0.clone().requires_grad_(),)
        loss, o, lse = fn(*leaves, w, wl)
        loss.backward()
        runs.append((o, lse) + tuple(t.grad for t in leaves))
    for a, b in zip(*runs):
        assert a is not None and b is not None and a.dtype == b.dtype and torch.equal(a, b)
    assert runs[0][-1].dtype == torch.bfloat16 and runs[0][-1].abs().sum() > 0
