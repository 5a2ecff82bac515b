"""Compile-only checks of the 2-CTA dS exchange kernels (cluster_exchange; no GPU: CUTE_DSL_ARCH=sm_90a).

Each variant (hd192, hd192 with a value head of 128, hd256; causal and not; GQA) must pass the
codegen checks of every backward kernel (WGMMA present, no spills, no C7512 serialization, a
setmaxnreg split the CTA can grant) and carry the exchange: one bulk copy into the peer's shared
memory and one remote cluster-scope arrive per mainloop body (masked and unmasked), the cluster
barrier after the mbarrier init and before exit, and half-width bulk dQ adds. The kernels without
the knob carry none of it. tests/fa4/test_bwd_compile.py's pairwise sweep covers the knob's
pairs with the other knobs; these are the shapes the device script measures.
"""

from __future__ import annotations

import dataclasses
import tempfile

import pytest

from fa4.problem import Problem
from fa4.sm90.bwd_compile import compile_bwd_main, compile_bwd_post_dq, compile_key
from fa4.sm90.bwd_config import REG_SPLIT, BwdConfigSm90, violations
from fa4.sm90.bwd_defaults import default_config
from fa4.sm90.compile import ensure_target
from tests.fa4 import cpu_kernels
from tests.fa4.codegen_asserts import assert_clean, compile_and_read

EXCHANGE = ["cp.async.bulk.shared::cluster.shared::cta", "mbarrier.arrive.release.cluster.shared::cluster",
            "barrier.cluster.arrive", "barrier.cluster.wait", "mapa.shared::cluster", "cp.reduce.async.bulk"]


def problem(hd, hdv, causal, gqa) -> Problem:
    return Problem.standard(8192, hd, head_dim_v=hdv, causal=causal, pass_="bwd", heads_q=16,
                            heads_kv=4 if gqa else 16)


def exchanged(prob: Problem) -> BwdConfigSm90:
    """bench/check_bwd.py's: the default with the exchange (what the GPU tests and the bench run)."""
    cfg = cpu_kernels.check_bwd().exchanged(prob)
    assert cfg.cluster_exchange and not violations(cfg, prob)
    return cfg


def ptx_counts(ptx: str) -> dict:
    from fa4.common import codegen_check as cc

    return cc.count_ops(cc.ptx_opcodes(ptx), EXCHANGE)


@pytest.mark.parametrize("hd,hdv", [(192, 192), (192, 128), (256, 256)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_exchange_kernel_codegen(hd, hdv, causal, gqa):
    ensure_target()
    prob = problem(hd, hdv, causal, gqa)
    cfg = exchanged(prob)
    key = compile_key("bf16", hd, causal, gqa, False, cfg, hdv)
    ptx, cubin, ops = compile_and_read(compile_bwd_main, key, ["MUFU.EX2", "STSM.16.M88.4"])
    assert_clean(ptx, cubin, ops, 2, REG_SPLIT)
    # The split kernel's pointwise work is unchanged: 64 keys x 32 queries per thread, two loops.
    assert ops["MUFU.EX2"] == 2 * 64 * cfg.tile_m // 128 // 2
    pops = ptx_counts(ptx)
    assert pops["cp.async.bulk.shared::cluster.shared::cta"] == 2, pops  # one per loop body
    assert pops["mbarrier.arrive.release.cluster.shared::cluster"] == 2, pops
    assert pops["barrier.cluster.arrive"] == 2 and pops["barrier.cluster.wait"] == 2, pops
    assert pops["cp.reduce.async.bulk"] > 0, pops
    # The dQ accumulator is a quarter of the head dim per warpgroup: tile_m x d/4 over 128 threads.
    # (Each WGMMA of dQ is N = d/4; both GEMMs of the pair's K reduction, K = 64 each.)


@pytest.mark.parametrize("hd", [192, 256])
def test_exchange_with_sink_codegen(hd):
    """A learnable sink (allowed: its gradient is the host's) compiles the same clean exchange."""
    ensure_target()
    prob = Problem(1, 8192, 8192, 16, 4, hd, hd, causal=True, pass_="bwd", sink=True)
    cfg = exchanged(prob)
    key = compile_key("bf16", hd, True, True, False, cfg, hd, has_sink=True)
    ptx, cubin, ops = compile_and_read(compile_bwd_main, key, [])
    assert_clean(ptx, cubin, ops, 2, REG_SPLIT)
    assert ptx_counts(ptx)["cp.async.bulk.shared::cluster.shared::cta"] == 2


def test_kernels_without_the_knob_have_no_cluster_code():
    ensure_target()
    prob = problem(256, 256, False, False)
    cfg = dataclasses.replace(default_config(prob), cluster_exchange=False)  # the exchange is hd256's default
    key = compile_key("bf16", 256, False, False, False, cfg, 256)
    ptx, _, _ = compile_and_read(compile_bwd_main, key, [])
    pops = ptx_counts(ptx)
    assert all(pops[op] == 0 for op in EXCHANGE[:-1]), pops


@pytest.mark.parametrize("hd", [192, 256])
def test_pair_dq_postprocess_codegen(hd):
    """The pair's accumulator tiles (two column halves) are read with the same 16-byte loads."""
    ensure_target()
    from fa4.common import codegen_check as cc

    with tempfile.TemporaryDirectory() as d:
        ptx = compile_bwd_post_dq("bf16", hd, 64, "head_dim", pair=True,
                                  options=f"--enable-tvm-ffi --keep-ptx --keep-cubin --dump-dir={d}").__ptx__
    ops = cc.count_ops(cc.ptx_opcodes(ptx), ["ld.global.v4", "st.global.v4", "st.global", "ld.local", "st.local"])
    assert ops["ld.global.v4"] == 64 * hd // 256 // 4, ops
    assert ops["st.global.v4"] == 64 * hd // 8 // 256 and ops["st.global"] == ops["st.global.v4"], ops
    assert ops["ld.local"] == 0 and ops["st.local"] == 0, ops


def test_pair_fragment_order_is_a_permutation_of_the_tile():
    """The two halves' fragment orders (each a (tile_m, d/2) dQ tile's, at offset r tile_m d/2)
    together place every element of the (tile_m, d) accumulator tile exactly once."""
    from fa4.sm90.bwd_prepost import dq_frag_shape_stride

    for hd in (192, 256):
        half = hd // 2
        ((four, groups), (threads, wgs)), ((s_a, s_b), (s_t, s_w)) = dq_frag_shape_stride(64, half)
        offs = [r * 64 * half + a * s_a + b * s_b + t * s_t + w * s_w for r in range(2)
                for a in range(four) for b in range(groups) for t in range(threads) for w in range(wgs)]
        assert sorted(offs) == list(range(64 * hd))
