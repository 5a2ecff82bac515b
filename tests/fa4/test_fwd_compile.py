"""Compile-only checks of our Hopper forward kernel (no GPU: CUTE_DSL_ARCH=sm_90a, fake tensors).

For each compiled kernel of the feasible search space (configs that differ only in runtime
knobs share one kernel), the generated code must contain WGMMA, must not spill to local
memory, must not have its WGMMAs serialized by ptxas (warning C7512), and must contain
exactly the number of MUFU.EX2 the exp2 split asks for.

CI compiles a pairwise-covering subset per (head_dim, head_dim_v, causal): every value of every
compile-time knob appears, and every pair of values of two knobs appears together when
the pair is feasible. FA4_COMPILE_ALL=1 compiles every distinct kernel of the space
(29,000 kernels over the six head-dim pairs; ~2.5-5 s each, so hours: not for CI).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest

from fa4.knobs import iter_configs, knob_specs
from fa4.problem import Problem
from fa4.sm90.compile import compile_fwd, compile_key, ensure_target
from fa4.sm90.fwd_config import HEAD_DIMS, FwdConfigSm90, head_dims_v, violations
from tests.fa4.codegen_asserts import assert_clean_fwd, compile_and_read

COMPILE_KNOBS = [s.name for s in knob_specs(FwdConfigSm90) if s.name not in FwdConfigSm90.RUNTIME_KNOBS]
# Every (head_dim, head_dim_v) the forward declares.
HEAD_DIM_PAIRS = [(d, dv) for d in HEAD_DIMS for dv in head_dims_v(d)]


def distinct_kernels(head_dim: int, causal: bool, head_dim_v: int | None = None) -> list[FwdConfigSm90]:
    prob = Problem.standard(4096, head_dim, head_dim_v=head_dim_v, causal=causal)
    seen = {}
    # Runtime knobs at their defaults: their other values launch the same kernels (one compile key).
    for c in iter_configs(FwdConfigSm90, prob, vary_runtime=False):
        if violations(c, prob):
            continue
        seen.setdefault(compile_key("bf16", head_dim, causal, True, c, head_dim_v), c)
    return list(seen.values())


def pairwise_subset(configs: list[FwdConfigSm90]) -> list[FwdConfigSm90]:
    """Greedy cover of every feasible (knob_a=x, knob_b=y) pair among compile-time knobs.

    ctas_per_sm, where it has one value (past head_dim 64), is left out of the pairs by name. A
    knob with one value still pairs with every value of every other knob, which adds to each
    config's score the values it would cover first and so moves the greedy choice: kept in, it
    would replace 26 of the 38 hd128 causal covers, which compiled clean before the knob existed.
    No general rule gives the same covers: tanh_fma_frac (no softcap here) and mask_bits (not
    causal) have one value too but were in the pairs when the covers were chosen, and leaving out
    every one-valued knob, or every knob whose applies() is false, changes the covers at hd64
    full, hd96, hd128 and hd192/128."""
    varied = [n for n in COMPILE_KNOBS if n != "ctas_per_sm" or len({c.ctas_per_sm for c in configs}) > 1]

    def pairs(c):
        vals = [(n, getattr(c, n)) for n in varied]
        return set(itertools.combinations(vals, 2))

    uncovered = set().union(*(pairs(c) for c in configs))
    chosen = []
    while uncovered:
        best = max(configs, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def cases():
    out = []
    for hd, hdv in HEAD_DIM_PAIRS:
        for causal in (False, True):
            ks = distinct_kernels(hd, causal, hdv)
            if os.environ.get("FA4_COMPILE_ALL") != "1":
                ks = pairwise_subset(ks)
            dims = f"hd{hd}" if hdv == hd else f"hd{hd}v{hdv}"
            for c in ks:
                label = f"{dims}-{'causal' if causal else 'full'}-" + "-".join(str(getattr(c, n)) for n in COMPILE_KNOBS)
                out.append(pytest.param(hd, hdv, causal, c, id=label))
    return out


def test_pairwise_subset_covers_every_value():
    for hd, hdv in HEAD_DIM_PAIRS:
        ks = distinct_kernels(hd, False, hdv)
        sub = pairwise_subset(ks)
        for n in COMPILE_KNOBS:
            assert {getattr(c, n) for c in sub} == {getattr(c, n) for c in ks}, (hd, hdv, n)
        assert len(sub) < len(ks)


def test_every_head_dim_has_a_feasible_default():
    from fa4.sm90.fwd_config import default_config

    for hd, hdv in HEAD_DIM_PAIRS:
        for causal in (False, True):
            for dtype in ("bf16", "fp16"):
                prob = Problem.standard(8192, hd, head_dim_v=hdv, causal=causal, dtype=dtype)
                cfg = default_config(prob)
                assert not violations(cfg, prob), (prob, cfg, violations(cfg, prob))
                # The defaults carry the per-head-dim choice, not the generic fallback's.
                assert cfg.tau == 8.0, (hd, hdv, cfg)


def test_causal_defaults_group_heads_while_their_kv_fits_l2():
    """Session 25 (H200, two runs each): 8 heads a scheduling group gained +1.7-4.7% on causal
    forwards at hd64 4k-16k and hd128 1k-8k (8 heads' K/V at most 32 MiB of the 50 MB L2) and lost
    1.3-2.8% at hd128 16k (64 MiB) and 1.3-2.1% non-causal (hd64 8k)."""
    import dataclasses

    from fa4.sm90.fwd_config import default_config, swizzle_fits_l2

    for d, sk, want in ((128, 1024, 8), (128, 8192, 8), (128, 16384, 1), (64, 4096, 8), (64, 16384, 8),
                        (64, 32768, 1), (96, 4096, 1), (192, 8192, 1), (256, 8192, 1)):
        for causal in (True, False):
            p = Problem.standard(sk, d, causal=causal, seqlen_k=sk)
            cfg = default_config(p)
            expect = want if causal else 1
            if d == 192 and causal:
                expect = 1  # hd192's own rule (4 heads at head_dim_v 128, session 12)
            assert cfg.head_swizzle == expect, (d, sk, causal, cfg)
            if d in (64, 128):
                assert swizzle_fits_l2(p) == (causal and want == 8), (d, sk, causal)
            if causal:
                # A window or packed sequences keep their own defaults (not measured past 2k keys).
                for feat in ({"window_left": 255, "window_right": 0}, {"varlen": True, "varlen_mean_q": sk // 2,
                                                                       "varlen_mean_k": sk // 2}):
                    q = dataclasses.replace(p, **feat)
                    assert not swizzle_fits_l2(q)
                    if d == 128:
                        assert default_config(q).head_swizzle == 1, (feat, default_config(q))
    # Under GQA the rule counts each query head's K/V (an upper bound on what 8 heads stream).
    gqa = Problem(1, 8192, 8192, 32, 8, 128, 128, causal=True)
    assert default_config(gqa).head_swizzle == 8


def test_hd64_causal_defaults_by_walk_length():
    """The hd64 causal defaults by the length of the walk (each measured in two H200 runs):
    tile_m 128 where a 192-row tiling leaves a part-full last tile that the causal walk makes the
    longest (session 20: +3.5-5% at 512-1k rows, -6 to -10% at 1.5-2k), with the bit-word masks
    (session 23); 8 heads a scheduling group up to 2k keys and exp_pin on the 128-row tile (session
    24); two CTAs an SM up to 512 (session 24: +13% at 512, +25% at 256, within 2% at 768-1k, -10 to
    -16% at 2k). Keys count too: a short query range over a long key range walks far."""
    import dataclasses

    from fa4.sm90.fwd_config import SHORT_CAUSAL_HD64, SHORT_WALK_HD64, TWO_CTAS_HD64, default_config

    cases = ((256, 256, True, 128, 2), (TWO_CTAS_HD64, TWO_CTAS_HD64, True, 128, 2), (512, 2048, True, 128, 1),
             (768, 768, True, 128, 1), (SHORT_CAUSAL_HD64, SHORT_CAUSAL_HD64, True, 128, 1),
             (SHORT_CAUSAL_HD64 + 1, SHORT_CAUSAL_HD64 + 1, True, 192, 1), (SHORT_WALK_HD64, SHORT_WALK_HD64, True, 192, 1),
             (4096, 4096, True, 192, 1), (128, 8192, True, 128, 1), (1024, 1024, False, 192, 1), (512, 512, False, 192, 1))
    for sq, sk, causal, want, ctas in cases:
        for dtype in ("bf16", "fp16"):
            prob = Problem.standard(sq, 64, causal=causal, dtype=dtype, seqlen_k=sk)
            for feat in ({}, {"window_left": 255, "window_right": 0}, {"softcap": 30.0}, {"sink": True}):
                if feat and not causal:
                    continue
                p = dataclasses.replace(prob, **feat)
                cfg = default_config(p)
                case = (sq, sk, causal, feat, cfg)
                assert cfg.tile_m == want and cfg.pingpong == "mma_exp" and cfg.ctas_per_sm == ctas, case
                assert (cfg.tile_n, cfg.p_operand) == ((64, "smem") if ctas == 2 else (128, "rmem")), case
                assert cfg.mask_bits == (want == 128 and causal), case
                short_walk = causal and max(sq, sk) <= SHORT_WALK_HD64
                assert cfg.exp_pin == (short_walk and want == 128), case
                # Past 2k keys: 8 heads while their K/V fit 32 MiB (hd64: up to 16k keys), not windowed.
                fits = causal and "window_left" not in feat and 8 * sk * 128 * 2 <= 32 << 20
                assert cfg.head_swizzle == (8 if (short_walk or fits) and ctas == 1 else 1), case
                assert not violations(cfg, p), (p, cfg, violations(cfg, p))
    # Varlen keeps one CTA an SM and no exp_pin (it spills there).
    p = Problem.standard(512, 64, causal=True, varlen_mean_q=256)
    cfg = default_config(p)
    assert cfg.ctas_per_sm == 1 and not cfg.exp_pin and not violations(cfg, p), cfg


@pytest.mark.parametrize("change", [{}, {"tile_n": 80}, {"kv_stages": 3}, {"exp_pin": False, "mask_bits": False},
                                    {"pingpong": "off"}])
@pytest.mark.parametrize("causal", [False, True])
def test_two_ctas_per_sm_kernels_fit_their_registers(change, causal):
    """ctas_per_sm 2 launches with __launch_bounds__(384, 2): 80 registers a thread at launch and
    a 104 / 32 setmaxnreg split that the launch allocation can grant (2 x 104 + 32 = 3 x 80); the
    consumers' fragments (O 32 + S 32-40, P through shared memory) fit it without spills or
    serialized WGMMAs. The wider tile and P in registers do not, and violations() says so."""
    from fa4.common.regs import reg_split_violation
    from fa4.sm90.fwd_config import REG_SPLIT_TWO_CTAS, default_config

    assert reg_split_violation(2, *REG_SPLIT_TWO_CTAS, 2) is None
    assert "wait forever" in reg_split_violation(2, 112, 32, 2)
    prob = Problem.standard(512, 64, causal=True)
    base = default_config(prob)
    assert base.ctas_per_sm == 2
    if not causal:
        prob = dataclasses.replace(prob, causal=False)
        base = dataclasses.replace(base, mask_bits=False)
    config = dataclasses.replace(base, **change)
    assert not violations(config, prob), violations(config, prob)
    ptx, cubin, ops = compile_and_read(compile_fwd, compile_key("bf16", 64, causal, True, config), [])
    assert_clean_fwd(ptx, cubin, ops, config)
    for refused in ({"tile_n": 96}, {"p_operand": "rmem"}, {"tile_m": 192}, {"persistent": True}):
        bad = violations(dataclasses.replace(config, **refused), prob)
        assert any("ctas_per_sm 2" in str(v) for v in bad), (refused, bad)
    wide = Problem.standard(512, 128, causal=causal)
    assert violations(dataclasses.replace(config, exp_pin=False), wide)


@pytest.mark.parametrize("hd,causal", [(128, False), (128, True), (64, True)])
def test_exp_pin_keeps_the_exponentials_under_the_pv_gemm(hd, causal):
    """With exp_pin a step's exponentials (tile_n/2 a thread, and the two rows' rescale factors)
    issue between the wait for S(j) and the wait for PV(j-1), in each mainloop, so they run under
    the PV GEMM. Without it ptxas keeps only the rescale factors there (hd128: 2 of 66; session
    15) and moves the rest below the wait."""
    ensure_target()
    from fa4.common import codegen_check as cc
    from fa4.sm90.fwd_config import default_config

    prob = Problem.standard(4096, hd, causal=causal)
    counts = {}
    for pin in (False, True):
        config = dataclasses.replace(default_config(prob), exp_pin=pin)
        ptx, cubin, ops = compile_and_read(compile_fwd, compile_key("bf16", hd, causal, True, config, hd), [])
        assert_clean_fwd(ptx, cubin, ops, config)
        counts[pin] = cc.ops_between_waits(cc.disassemble(cubin), "MUFU.EX2")
    per_step = default_config(prob).tile_n // 2 + 2
    assert counts[True] and all(n == per_step for n in counts[True]), counts
    assert len(counts[False]) == len(counts[True]) and max(counts[False]) < per_step, counts


@pytest.mark.parametrize("hd,hdv,causal,config", cases())
def test_kernel_codegen(hd, hdv, causal, config):
    ensure_target()
    from fa4.common import codegen_check as cc
    from fa4.common.exp2 import emulated_indices

    ptx, cubin, ops = compile_and_read(
        compile_fwd, compile_key("bf16", hd, causal, True, config, hdv), ["MUFU.EX2", "WARPGROUP.ARRIVE"]
    )
    assert_clean_fwd(ptx, cubin, ops, config)
    # Each GEMM's chain of WGMMAs issues under the one wgmma.fence the kernel emits for it.
    # A fragment register written between the fence and a WGMMA (P packed from 16-bit halves
    # at issue) makes ptxas fence every WGMMA again: one WARPGROUP.ARRIVE per HGMMA.
    fences = cc.count_ops(cc.ptx_opcodes(ptx), ["wgmma.fence"])["wgmma.fence"]
    assert ops["WARPGROUP.ARRIVE"] == fences, (ops, fences)
    # exp2 split: each softmax code path (first tile, masked loop, unmasked loop) evaluates a
    # thread's 2 rows x tile_n/4 elements; ex2s not in those paths (the rescale factors, at
    # most 2 per step path) are counted by the remainder.
    per_row = config.tile_n // 4
    emulated = emulated_indices(per_row, config.exp2_emu_frac, config.exp2_emu_pattern)
    mufu_per_path = 2 * (per_row - len(emulated))
    paths = 3
    rescale = ops["MUFU.EX2"] - paths * mufu_per_path
    assert 0 <= rescale <= 2 * 2 * paths, (ops["MUFU.EX2"], mufu_per_path)
