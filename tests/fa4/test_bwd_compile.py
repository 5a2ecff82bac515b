"""Compile-only checks of our Hopper backward (no GPU: CUTE_DSL_ARCH=sm_90a, fake tensors).

For a pairwise-covering subset of the feasible compile-time space (head_dim, causal, GQA and
every compile-time knob; every feasible pair of values appears together), the main kernel
must contain WGMMA, must not touch local memory (no spills, zero stack frame), must not have
its WGMMAs serialized by ptxas (C7512), must evaluate exactly one MUFU.EX2 per element of
S^T per code path, and must carry the dQ accumulation and lock pattern its knobs ask for:
deterministic kernels acquire (ld.acquire.gpu) and release (fence.acq_rel.gpu +
red.release.gpu) a semaphore, the others contain neither.
FA4_COMPILE_ALL=1 compiles every distinct kernel instead (~100; ~40 min on two cores).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile

import pytest

from fa4.knobs import iter_configs, knob_specs
from fa4.problem import Problem
from fa4.sm90.bwd_compile import (
    compile_bwd_main,
    compile_bwd_post,
    compile_bwd_post_dq,
    compile_bwd_pre,
    compile_key,
)
from fa4.sm90.bwd_config import REG_SPLIT, BwdConfigSm90, violations
from fa4.sm90.compile import ensure_target
from tests.fa4.codegen_asserts import assert_clean, compile_and_read

COMPILE_KNOBS = [s.name for s in knob_specs(BwdConfigSm90) if s.name not in BwdConfigSm90.RUNTIME_KNOBS]
DIMS = ["hd", "causal", "gqa", "det"] + COMPILE_KNOBS


def problem(hd: int, causal: bool, gqa: bool, det: bool) -> Problem:
    return Problem.standard(4096, hd, causal=causal, deterministic=det, pass_="bwd",
                            heads_kv=(2048 // hd) // 4 if gqa else None)


def feasible_kernels() -> list[tuple]:
    """(hd, causal, gqa, det, config) for every distinct feasible main kernel."""
    seen = {}
    for hd, causal, gqa, det in itertools.product((64, 128), (False, True), (False, True), (False, True)):
        for c in iter_configs(BwdConfigSm90):
            if violations(c, problem(hd, causal, gqa, det)):
                continue
            seen.setdefault(compile_key("bf16", hd, causal, gqa, det, c), (hd, causal, gqa, det, c))
    return list(seen.values())


def values(case: tuple) -> dict:
    hd, causal, gqa, det, c = case
    return {"hd": hd, "causal": causal, "gqa": gqa, "det": det, **{n: getattr(c, n) for n in COMPILE_KNOBS}}


def pairwise_subset(cases: list[tuple]) -> list[tuple]:
    """Greedy cover of every feasible (dim_a=x, dim_b=y) pair."""
    def pairs(case):
        return set(itertools.combinations(sorted(values(case).items()), 2))

    uncovered = set().union(*(pairs(c) for c in cases))
    chosen = []
    while uncovered:
        best = max(cases, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def default_kernels() -> list[tuple]:
    """The default config of each issue shape (hd 64/128, causal or not, deterministic or not)."""
    from fa4.sm90.bwd_config import default_config

    out = []
    for hd, causal, det in itertools.product((64, 128), (False, True), (False, True)):
        out.append((hd, causal, False, det, default_config(problem(hd, causal, False, det))))
    return out


def cases():
    ks = feasible_kernels()
    if os.environ.get("FA4_COMPILE_ALL") != "1":
        ks = pairwise_subset(ks)
        keys = {compile_key("bf16", *k) for k in ks}
        ks += [k for k in default_kernels() if compile_key("bf16", *k) not in keys]
    return [pytest.param(*k, id="-".join(f"{n}={v}" for n, v in values(k).items())) for k in ks]


def test_subset_covers_every_feasible_value_and_pair():
    ks = feasible_kernels()
    sub = pairwise_subset(ks)
    for dim in DIMS:
        assert {values(c)[dim] for c in sub} == {values(c)[dim] for c in ks}, dim
    for a, b in itertools.combinations(DIMS, 2):
        want = {(values(c)[a], values(c)[b]) for c in ks}
        assert want == {(values(c)[a], values(c)[b]) for c in sub}, (a, b)
    assert len(sub) < len(ks)


@pytest.mark.parametrize("hd,causal,gqa,det,config", cases())
def test_main_kernel_codegen(hd, causal, gqa, det, config):
    ensure_target()
    from fa4.common import codegen_check as cc

    key = compile_key("bf16", hd, causal, gqa, det, config)
    ptx, cubin, ops = compile_and_read(
        compile_bwd_main, key, ["MUFU.EX2", "STSM.16.M88.4", "UTMASTG.4D", "STG.E.U16"]
    )
    assert_clean(ptx, cubin, ops, 2, REG_SPLIT)
    # S^T of a consumer thread: 64 key rows x tile_m / 128 threads; masked and unmasked loops.
    assert ops["MUFU.EX2"] == 2 * 64 * config.tile_m // 128
    # dS^T of a consumer thread (64 keys x tile_m bf16) with ds_store 'stmatrix': one stmatrix.x4 per
    # 16 of its bytes (masked and unmasked loops), and none otherwise. dkv_store 'tma' adds the dK and
    # dV tiles (64 keys x hd bf16 each per thread's warpgroup: hd bytes per thread and tile).
    ds_bytes = 64 * config.tile_m * 2 // 128
    tma = config.dkv_store == "tma"
    stsm = (2 * ds_bytes // 16 if config.ds_store == "stmatrix" else 0) + (2 * hd // 16 if tma else 0)
    assert ops["STSM.16.M88.4"] == stsm, ops
    # dK/dV out: TMA stores and no 2-byte element stores, or (no GQA) the element stores.
    assert (ops["UTMASTG.4D"] > 0) == tma, ops
    assert (ops["STG.E.U16"] > 0) == (not tma and not gqa), ops

    pops = cc.count_ops(
        cc.ptx_opcodes(ptx),
        ["ld.acquire.gpu", "red.release.gpu", "fence.acq_rel.gpu", "cp.reduce.async.bulk",
         "red.relaxed.gpu.global.add.v2.f32", "red.relaxed.gpu.global.add.f32"],
    )
    lock = ("ld.acquire.gpu", "red.release.gpu", "fence.acq_rel.gpu")
    if det:
        assert all(pops[p] > 0 for p in lock), pops
    else:
        assert all(pops[p] == 0 for p in lock), pops
    bulk = config.dq_accum == "bulk"
    assert (pops["cp.reduce.async.bulk"] > 0) == bulk, pops
    # GQA adds dK/dV with per-element reductions whatever the dQ path is.
    expect_v2 = config.dq_accum == "red_v2" or (gqa and config.dq_accum != "red")
    assert (pops["red.relaxed.gpu.global.add.v2.f32"] > 0) == expect_v2, pops
    assert (pops["red.relaxed.gpu.global.add.f32"] > 0) == (config.dq_accum == "red"), pops


@pytest.mark.parametrize("hd", [64, 128])
def test_pre_and_postprocess_codegen(hd):
    """Rows are shared by consecutive threads in 16-byte pieces (whole rows per warp access); nothing spills."""
    ensure_target()
    from fa4.common import codegen_check as cc

    for build in (compile_bwd_pre, compile_bwd_post):
        with tempfile.TemporaryDirectory() as d:
            compiled = build("bf16", hd, options=f"--enable-tvm-ffi --keep-ptx --keep-cubin --dump-dir={d}")
            ptx = compiled.__ptx__
        ops = cc.count_ops(
            cc.ptx_opcodes(ptx), ["ld.global.v4", "st.global.v4", "st.global.v2", "shfl.sync.bfly", "ld.local", "st.local"]
        )
        assert ops["ld.local"] == 0 and ops["st.local"] == 0, (build.__name__, ops)
        lanes_pre, lanes_post = hd // 8, hd // 4  # threads sharing one row: 16-byte pieces of it
        if build is compile_bwd_pre:
            # 128 rows x (O, dO) in 16-byte pieces over 128 threads, the row sums finished with
            # log2(lanes) shuffles per pass; the 128 x hd fp32 accumulator zeroed in 16-byte stores.
            assert ops["ld.global.v4"] == 2 * lanes_pre, ops
            assert ops["shfl.sync.bfly"] == lanes_pre * (lanes_pre.bit_length() - 1), ops
            assert ops["st.global.v4"] == hd // 4, ops
        else:
            # fp32 rows read as 16-byte pieces, written as 8-byte bf16 pieces, lanes_post per row.
            assert ops["ld.global.v4"] == lanes_post and ops["st.global.v2"] == lanes_post, ops


@pytest.mark.parametrize("hd,tile_m,dq_split", [(64, 64, "head_dim"), (64, 128, "head_dim"), (64, 128, "rows"),
                                               (128, 64, "head_dim")])
def test_dq_postprocess_codegen(hd, tile_m, dq_split):
    """The fragment-ordered dQ accumulator is read with 16-byte loads; nothing spills."""
    ensure_target()
    from fa4.common import codegen_check as cc

    with tempfile.TemporaryDirectory() as d:
        ptx = compile_bwd_post_dq(
            "bf16", hd, tile_m, dq_split, options=f"--enable-tvm-ffi --keep-ptx --keep-cubin --dump-dir={d}"
        ).__ptx__
    ops = cc.count_ops(cc.ptx_opcodes(ptx), ["ld.global.v4", "st.global.v4", "st.global", "ld.local", "st.local"])
    assert ops["ld.global.v4"] == tile_m * hd // 256 // 4, ops
    # dQ leaves through shared memory as 16-byte row-contiguous stores (8 bf16 per thread and
    # pass), none narrower: written from the fragment it took 2-byte stores over 8 rows per warp.
    assert ops["st.global.v4"] == tile_m * hd // 8 // 256, ops
    assert ops["st.global"] == ops["st.global.v4"], ops
    assert ops["ld.local"] == 0 and ops["st.local"] == 0, ops


def test_dq_fragment_order_is_a_permutation_of_the_tile():
    """Every (value, thread, warpgroup) of the dQ fragment order lands on a distinct element of
    the tile (the accumulator is added whole, so a collision would add two values in one place
    and leave another at zero), and a thread's 4-value groups are 16 contiguous bytes."""
    from fa4.sm90.bwd_prepost import dq_frag_shape_stride

    for tile_m, hd in ((64, 64), (64, 128), (128, 64)):
        ((four, groups), (threads, wgs)), ((s_a, s_b), (s_t, s_w)) = dq_frag_shape_stride(tile_m, hd)
        assert four == 4 and s_a == 1 and threads * wgs == 256 and 4 * groups * 256 == tile_m * hd
        offs = [a * s_a + b * s_b + t * s_t + w * s_w
                for a in range(4) for b in range(groups) for t in range(threads) for w in range(wgs)]
        assert sorted(offs) == list(range(tile_m * hd))
        # Consecutive threads of a warp store consecutive 16-byte groups (conflict-free STS.128).
        assert s_t == 4


def test_runtime_knobs_share_a_kernel():
    a = BwdConfigSm90(spt_order=True, head_swizzle=1)
    b = dataclasses.replace(a, spt_order=False, head_swizzle=8)
    assert compile_key("bf16", 128, True, False, False, a) == compile_key("bf16", 128, True, False, False, b)
    # Deterministic mode (the problem's) is another kernel for the same config.
    assert compile_key("bf16", 128, True, False, False, a) != compile_key("bf16", 128, True, False, True, a)
