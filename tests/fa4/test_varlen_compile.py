"""Compile-only checks of the packed varlen forward kernels (no GPU: sm_90a, fake tensors).

The issue's shape class (hd128 causal bf16), seqused on both sides with every feature at hd64, and
fp16 hd128 with a window and a sink: WGMMA present, no spills, no serialized WGMMAs, and the
ragged epilogue's predicated global stores present (the partial last tile of a sequence).
"""

from __future__ import annotations

import dataclasses

import pytest

from fa4.problem import Problem
from fa4.sm90.compile import compile_fwd, compile_key, ensure_target
from fa4.sm90.fwd_config import default_config, violations
from tests.fa4.codegen_asserts import assert_clean_fwd, compile_and_read

CASES = [
    pytest.param("bf16", 128, True, {}, False, id="bf16-hd128-causal"),
    pytest.param("bf16", 64, True, dict(window_left=255, softcap=30.0, sink=True), True, id="bf16-hd64-all-seqused"),
    pytest.param("fp16", 128, False, dict(window_left=127, window_right=31, sink=True), False, id="fp16-hd128-win-sink"),
]


@pytest.mark.parametrize("dtype,hd,causal,feat,seqused", CASES)
def test_varlen_kernel_codegen(dtype, hd, causal, feat, seqused):
    ensure_target()
    problem = Problem.standard(2048, hd, causal=causal, dtype=dtype, **feat)
    config = dataclasses.replace(default_config(problem), persistent=False)
    assert not violations(config, problem), violations(config, problem)
    key = compile_key(dtype, hd, causal, True, config, hd, **problem.kernel_flags(), varlen=True,
                      seqused_q=seqused, seqused_k=seqused)
    ptx, cubin, ops = compile_and_read(compile_fwd, key, ["STG.E", "UTMASTG"])
    assert_clean_fwd(ptx, cubin, ops, config)
    # Full tiles store O by TMA; a sequence's last partial tile by predicated 32-bit stores (pairs
    # of 16-bit outputs): 64 x hd / 128 threads / 2 per thread, plus the LSE's.
    assert ops["UTMASTG"] >= 1, ops
    assert ops["STG.E"] >= hd // 4, ops


def test_varlen_key_and_kernel_refuse_what_is_not_built():
    cfg = default_config(Problem.standard(2048, 128, causal=True))
    with pytest.raises(ValueError, match="seqused"):
        compile_key("bf16", 128, True, True, cfg, seqused_q=True)
    assert compile_key("bf16", 128, True, True, cfg, varlen=True) != compile_key("bf16", 128, True, True, cfg)
    # exp_pin spills in every varlen forward (compiled, each head dim's default: 48-334 local loads).
    for hd in (64, 96, 128, 192, 256):
        dense = Problem.standard(2048, hd, causal=True)
        vl = dataclasses.replace(dense, batch=4, varlen=True, varlen_mean_q=1024, varlen_mean_k=1024)
        pinned = dataclasses.replace(default_config(dense), exp_pin=True)
        assert not violations(pinned, dense), hd
        assert any("exp_pin with varlen spills" in str(v) for v in violations(pinned, vl)), hd
    from fa4.sm90.fwd import FlashFwdSm90

    with pytest.raises(ValueError, match="persistent"):
        FlashFwdSm90(None, 128, True, True, dataclasses.replace(cfg, persistent=True), varlen=True)
