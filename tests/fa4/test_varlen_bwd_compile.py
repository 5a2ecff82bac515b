"""Compile-only checks of the packed varlen backward (no GPU: sm_90a, fake tensors).

The main kernel for the issue's shape class (hd128 causal bf16, the default varlen config), GQA
deterministic with seqused on both sides, fp16 with a window, softcap and a sink, the hd64 tile-128
kernel, the per-thread dQ path, dkv_store 'direct' and the hd256 dkv_split 'head_dim' kernel: WGMMA
present, no spills, no serialized WGMMAs, dK/dV of whole key tiles by TMA and of a sequence's last,
partial tile by predicated stores (a box would run into the next sequence), the deterministic locks
where asked. The pre- and postprocesses keep their 16-byte row accesses with the sequence offsets.
"""

from __future__ import annotations

import dataclasses
import tempfile

import pytest

from fa4.problem import Problem
from fa4.sm90.bwd_compile import compile_bwd_main, compile_bwd_post, compile_bwd_post_dq, compile_bwd_pre, compile_key
from fa4.sm90.bwd_config import REG_SPLIT, BwdConfigSm90, violations
from fa4.sm90.bwd_defaults import VARLEN_HEAD_SWIZZLE, default_config
from fa4.sm90.compile import ensure_target
from tests.fa4.codegen_asserts import assert_clean, compile_and_read


def varlen_problem(hd, causal, gqa=False, det=False, dtype="bf16", **feat):
    heads = 16
    return Problem(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=heads, heads_kv=heads // 4 if gqa else heads,
                   head_dim=hd, head_dim_v=hd, dtype=dtype, causal=causal, deterministic=det, pass_="bwd",
                   varlen=True, varlen_mean_q=2048, varlen_mean_k=2048, **feat)


CASES = [
    pytest.param("bf16", 128, True, False, False, {}, False, None, id="bf16-hd128-causal"),
    pytest.param("bf16", 128, True, True, True, {}, True, None, id="bf16-hd128-causal-gqa-det-seqused"),
    pytest.param("fp16", 128, False, False, False, dict(window_left=255, window_right=63, softcap=30.0, sink=True),
                 False, None, id="fp16-hd128-window-softcap-sink"),
    pytest.param("bf16", 64, False, False, True, {}, False, None, id="bf16-hd64-det"),
    pytest.param("bf16", 64, True, False, True, {}, False, dict(dq_accum="red_v2"), id="bf16-hd64-causal-det-red_v2"),
    pytest.param("bf16", 128, True, False, False, {}, True, dict(dkv_store="direct"), id="bf16-hd128-causal-direct"),
    pytest.param("bf16", 256, True, False, False, {}, False, None, id="bf16-hd256-causal-split"),
    pytest.param("bf16", 128, True, True, True, {}, True, dict(varlen_grid="compact", spt_order=False),
                 id="bf16-hd128-causal-gqa-det-seqused-compact"),
    pytest.param("bf16", 64, False, False, False, dict(window_left=255, window_right=63, softcap=30.0, sink=True),
                 False, dict(varlen_grid="compact", ds_early=True), id="bf16-hd64-features-compact"),
    pytest.param("bf16", 96, True, True, False, {}, True, None, id="bf16-hd96-causal-gqa-seqused"),
    pytest.param("bf16", 192, True, True, False, {}, False, None, id="bf16-hd192-causal-gqa"),
]


@pytest.mark.parametrize("dtype,hd,causal,gqa,det,feat,seqused,knobs", CASES)
def test_varlen_bwd_main_codegen(dtype, hd, causal, gqa, det, feat, seqused, knobs):
    ensure_target()
    from fa4.common import codegen_check as cc

    problem = varlen_problem(hd, causal, gqa, det, dtype, **feat)
    config = default_config(problem) if knobs is None else BwdConfigSm90(**knobs)
    assert not violations(config, problem), violations(config, problem)
    flags = problem.kernel_flags()
    key = compile_key(dtype, hd, causal, gqa, det, config, hd, flags["has_window_left"], flags["has_window_right"],
                      flags["has_softcap"], flags["has_sink"], varlen=True, seqused_q=seqused, seqused_k=seqused)
    ptx, cubin, ops = compile_and_read(compile_bwd_main, key, ["MUFU.EX2", "UTMASTG.4D", "STG.E.U16", "STG.E"])
    assert_clean(ptx, cubin, ops, 2, REG_SPLIT)
    # dK/dV: whole tiles by TMA where asked (no GQA), the partial tile by 16-bit element stores.
    assert (ops["UTMASTG.4D"] > 0) == (config.dkv_store == "tma" and not gqa), ops
    ptx_ops = cc.count_ops(cc.ptx_opcodes(ptx), ["ld.acquire.gpu", "red.release.gpu"])
    if det:
        assert ptx_ops["ld.acquire.gpu"] > 0 and ptx_ops["red.release.gpu"] > 0, ptx_ops
    else:
        assert ptx_ops["ld.acquire.gpu"] == 0, ptx_ops
    if not gqa:
        # dK and dV leave from the fragment in the input dtype, each element predicated on the
        # sequence's keys (dkv_store 'direct', or a partial tile beside 'tma').
        assert ops["STG.E.U16"] >= 64 * hd // 128, ops


def test_varlen_bwd_prepost_codegen():
    """Pre- and postprocesses with the sequence offsets: the same 16-byte row accesses as the dense
    ones (the offsets keep the 16-byte alignment the strides promise), nothing spills."""
    ensure_target()
    from fa4.common import codegen_check as cc

    hd = 128
    builds = [
        ("pre", lambda o: compile_bwd_pre("bf16", hd, options=o, has_dlse=True, varlen=True, seqused=True),
         lambda o: compile_bwd_pre("bf16", hd, options=o, has_dlse=True)),
        # The deterministic variant: each sequence's rows to zero from its key count (its accesses
        # are the plain one's; the zeroing is skipped per CTA, not per store).
        ("pre_det", lambda o: compile_bwd_pre("bf16", hd, options=o, varlen=True, seqused=True, det_tile_m=64,
                                              seqused_k=True),
         lambda o: compile_bwd_pre("bf16", hd, options=o)),
        ("post", lambda o: compile_bwd_post("bf16", hd, options=o, varlen=True), lambda o: compile_bwd_post("bf16", hd, options=o)),
        ("post_dq", lambda o: compile_bwd_post_dq("bf16", hd, 64, options=o, varlen=True, seqused=True),
         lambda o: compile_bwd_post_dq("bf16", hd, 64, options=o)),
    ]
    names = ["ld.global.v4", "st.global.v4", "st.global.v2", "shfl.sync.bfly", "ld.local", "st.local"]
    for name, varlen_build, dense_build in builds:
        counts = []
        for build in (varlen_build, dense_build):
            with tempfile.TemporaryDirectory() as d:
                ptx = build(f"--enable-tvm-ffi --keep-ptx --dump-dir={d}").__ptx__
            counts.append(cc.count_ops(cc.ptx_opcodes(ptx), names))
        vl, dense = counts
        assert vl["ld.local"] == 0 and vl["st.local"] == 0, (name, vl)
        for op in ("ld.global.v4", "st.global.v4", "st.global.v2", "shfl.sync.bfly"):
            assert vl[op] == dense[op], (name, op, vl, dense)


def test_varlen_bwd_keys_and_defaults():
    with pytest.raises(ValueError, match="seqused"):
        compile_key("bf16", 128, True, False, False, BwdConfigSm90(), 128, seqused_q=True)
    plain = compile_key("bf16", 128, True, False, False, BwdConfigSm90(), 128)
    assert compile_key("bf16", 128, True, False, False, BwdConfigSm90(), 128, varlen=True) != plain
    # The varlen problem's default is the dense one's (dK/dV by TMA without GQA) but for its launch
    # order: 8 heads a scheduling group at hd128 (bwd_defaults.VARLEN_HEAD_SWIZZLE, session 18).
    p = varlen_problem(128, True)
    dense = dataclasses.replace(p, varlen=False, varlen_mean_q=0, varlen_mean_k=0)
    assert default_config(p) == dataclasses.replace(default_config(dense), head_swizzle=VARLEN_HEAD_SWIZZLE)
    assert default_config(p).dkv_store == "tma" and default_config(dense).head_swizzle != VARLEN_HEAD_SWIZZLE
    # The varlen-only refusals (compiled spills): tile_m 128 with per-element dS^T stores, and exp_pin
    # (hd128 causal: 371 local loads a thread; 3.5x slower on the H200, session 16).
    hd64 = varlen_problem(64, False, det=True)
    sts = BwdConfigSm90(tile_m=128, stages=1, ds_stages=1, ds_store="sts", dq_split="rows", dv_operand="smem")
    assert any("varlen at tile_m 128" in v for v in violations(sts, hd64))
    assert not violations(sts, dataclasses.replace(hd64, varlen=False, varlen_mean_q=0, varlen_mean_k=0))
    for hd in (64, 128, 192, 256):
        p = varlen_problem(hd, True)
        pinned = dataclasses.replace(default_config(p), exp_pin=True)
        assert [str(v) for v in violations(pinned, p)] == ["exp_pin with varlen spills (hd128: 371 local loads a thread)"], hd
        dense = dataclasses.replace(p, varlen=False, varlen_mean_q=0, varlen_mean_k=0)
        assert not violations(dataclasses.replace(default_config(dense), exp_pin=True), dense), hd
        soft = dataclasses.replace(dense, softcap=30.0)
        assert bool(violations(dataclasses.replace(default_config(soft), exp_pin=True), soft)) == (hd == 128), hd
    # Every default varlen backward config is feasible, GQA or not.
    for hd in (64, 128, 192, 256):
        for gqa in (False, True):
            for det in (False, True):
                p = varlen_problem(hd, True, gqa, det)
                assert not violations(default_config(p), p), (hd, gqa, det)
