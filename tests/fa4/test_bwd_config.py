"""The backward's knob declaration, feasibility function and tile schedule (CPU only).

The schedule functions (fa4.common.bwd_schedule) are the ones the kernel traces; here they
run on Python ints and are checked against a brute-force scan of the causal mask, and the
deterministic turns against the launch order (a CTA may only wait for CTAs launched before
it, or the lock could deadlock while CTAs wait for free SMs).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from fa4.arch import SM90, SM100
from fa4.common.bwd_schedule import dq_turn, m_block_range, walk_tile
from fa4.knobs import config_from_dict, config_to_dict, iter_configs, json_schema, knob_specs, random_configs
from fa4.problem import Problem
from fa4.sm90.bwd_config import TILE_N, BwdConfigSm90, consumer_registers, smem_bytes, violations
from fa4.sm90.bwd_defaults import VARLEN_HEAD_SWIZZLE, WAVE_CTAS, WAVE_MAX_HEADS, default_config, key_tiles, wave_head_swizzle
from fa4.sm90.fwd_config import FwdConfigSm90

ISSUE_SHAPES = [(8192, hd, causal) for hd in (64, 128) for causal in (False, True)]


def bwd(seqlen, hd, causal=False, det=False, **kw) -> Problem:
    return Problem.standard(seqlen, hd, causal=causal, deterministic=det, pass_="bwd", **kw)


@pytest.mark.parametrize("seqlen,hd,causal", ISSUE_SHAPES)
@pytest.mark.parametrize("det", [False, True])
def test_default_config_is_feasible(seqlen, hd, causal, det):
    prob = bwd(seqlen, hd, causal, det)
    cfg = default_config(prob)
    assert violations(cfg, prob) == []


def test_violations_name_the_problem():
    cfg = BwdConfigSm90()
    assert any("backward pass only" in v for v in violations(cfg, Problem.standard(1024, 128)))
    assert any("sm90" in v for v in violations(cfg, bwd(1024, 128), SM100))
    assert any("head_dim 80" in v for v in violations(cfg, bwd(1024, 80)))
    # Deterministic is the problem's: the same config serves both modes.
    assert violations(cfg, bwd(1024, 128, det=True)) == violations(cfg, bwd(1024, 128)) == []
    prob = bwd(1024, 128)
    big = BwdConfigSm90(tile_m=128, stages=2)
    assert smem_bytes(big, prob) > SM90.smem_per_cta
    assert any("shared memory" in v for v in violations(big, prob))
    # Fits in shared memory, but the consumer state does not fit its registers (it spills).
    regs = BwdConfigSm90(tile_m=128, stages=1, ds_stages=1, dq_accum="red_v2", dv_operand="smem")
    assert smem_bytes(regs, prob) <= SM90.smem_per_cta
    assert any("registers" in v for v in violations(regs, prob))


def test_ds_early_orders_the_keys_split_only():
    """ds_early moves dkv_split 'keys''s dS^T store ahead of the dV GEMM; the 'head_dim' split has
    its own publish step (no second kernel for the same code)."""
    assert not violations(BwdConfigSm90(ds_early=True), bwd(1024, 128))
    assert not violations(BwdConfigSm90(ds_early=True, tile_m=128, dq_split="rows"), bwd(1024, 64))
    split = BwdConfigSm90(ds_early=True, dkv_split="head_dim", dv_operand="smem", stages=1)
    assert any("ds_early" in v and v.kind == "knob combination" for v in violations(split, bwd(1024, 256)))
    assert not any("ds_early" in v for v in violations(dataclasses.replace(split, ds_early=False), bwd(1024, 256)))
    # Not the default until measured on the GPU.
    assert not BwdConfigSm90().ds_early


def test_dq_split_by_rows_needs_two_64_row_halves():
    prob = bwd(1024, 64)
    assert not violations(BwdConfigSm90(tile_m=128, dq_split="rows"), prob)
    assert any("dq_split 'rows'" in v and "tile_m 128" in v for v in violations(BwdConfigSm90(dq_split="rows"), prob))


def test_dkv_tma_store_is_for_one_kv_head_per_query_head():
    assert not violations(BwdConfigSm90(dkv_store="tma"), bwd(1024, 128))
    gqa = Problem.standard(1024, 128, pass_="bwd", heads_kv=4)
    assert any("dkv_store 'tma'" in v and "GQA" in v for v in violations(BwdConfigSm90(dkv_store="tma"), gqa))


@pytest.mark.parametrize("det", [False, True])
def test_the_looped_gqa_reduce_with_a_one_deep_ring_and_sts_stores_is_refused_at_hd128(det):
    """Sessions 22-23 compiled hd128 non-causal GQA with gqa_reduce 'loop', stages 1, ds_store 'sts'
    and P^T from registers: 1 register spilled with ds_stages 1, deterministic or not, and
    deterministic with ds_stages 2; the neighbours that compile clean stay feasible."""
    gqa = Problem.standard(4096, 128, pass_="bwd", heads_kv=4, deterministic=det)
    base = dict(tile_m=64, ds_stages=1, dkv_store="direct", gqa_reduce="loop", dkv_split="keys", dv_operand="rmem")
    spill = BwdConfigSm90(**base, stages=1, ds_store="sts")
    assert any(v.kind == "registers" and "gqa_reduce 'loop'" in v for v in violations(spill, gqa))
    clean = [{"stages": 2}, {"ds_store": "stmatrix"}, {"gqa_reduce": "atomic"}] + ([] if det else [{"ds_stages": 2}])
    for change in clean:
        near = dataclasses.replace(spill, **change)
        assert not [v for v in violations(near, gqa) if "gqa_reduce 'loop'" in v], change
    # Deterministic, the two-deep dS ring spills too (session 22, each knob moved back alone).
    assert any("gqa_reduce 'loop'" in v for v in violations(dataclasses.replace(spill, ds_stages=2), gqa)) == det
    # The defaults never take it.
    assert not violations(default_config(gqa), gqa)


@pytest.mark.parametrize("cls", [BwdConfigSm90, FwdConfigSm90])
def test_every_knob_is_a_choice_the_problem_does_not_make(cls):
    """A knob has two or more choices and is not a field of the problem (which the problem decides)."""
    problem_fields = {f.name for f in dataclasses.fields(Problem)}
    for spec in knob_specs(cls):
        assert len(spec.choices) >= 2, f"{cls.__name__}.{spec.name} is single-valued: {spec.choices}"
        assert spec.name not in problem_fields, f"{cls.__name__}.{spec.name} restates the problem"


def test_rows_of_the_retired_knobs_still_read():
    """Configs stored (or posted) before deterministic, sdp_swap_ab and tile_n left the declaration
    read as the same config without them (cluster_exchange, retired while it was only ever False,
    is a knob again, its False the default); unknown names are still refused."""
    old = {"tile_m": 128, "tile_n": 128, "sdp_swap_ab": True, "deterministic": True, "cluster_exchange": False,
           "dq_split": "rows"}
    assert config_from_dict(BwdConfigSm90, old) == BwdConfigSm90(tile_m=128, dq_split="rows")
    assert set(BwdConfigSm90.RETIRED_KNOBS) == {"deterministic", "sdp_swap_ab", "tile_n"}
    assert BwdConfigSm90().tile_n == 128
    with pytest.raises(ValueError, match="unknown knob"):
        config_from_dict(BwdConfigSm90, {"tile_mm": 64})


def test_register_model_matches_measurements():
    """The compile-only sweeps (ptxas 13.0): these fit without spills or C7512, those do not."""
    gqa64 = Problem.standard(1024, 64, pass_="bwd", deterministic=True, heads_kv=4)
    fits = [(64, BwdConfigSm90()), (128, BwdConfigSm90()), (64, BwdConfigSm90(dq_accum="red")),
            (128, BwdConfigSm90(dv_operand="smem")),
            # P^T converted after the pointwise loops: the reference's hd64 tile fits.
            (64, BwdConfigSm90(tile_m=128)), (64, BwdConfigSm90(tile_m=128, ds_stages=1, stages=3)),
            (64, BwdConfigSm90(tile_m=128, dv_operand="smem", ds_stages=1, stages=1))]
    spills = [(128, BwdConfigSm90(tile_m=128, dv_operand="smem")),
              (64, BwdConfigSm90(tile_m=128, dq_accum="red_v2")),
              (64, BwdConfigSm90(tile_m=128, stages=1)),
              (64, BwdConfigSm90(tile_m=128, dv_operand="smem", ds_stages=2, stages=1)),
              (64, BwdConfigSm90(tile_m=128, dv_operand="smem", ds_stages=1, stages=2)),
              (128, BwdConfigSm90(dq_accum="red", ds_stages=1, stages=3)), (128, BwdConfigSm90(dq_accum="red_v2"))]
    for hd, c in fits:
        assert not [v for v in violations(c, bwd(1024, hd)) if "registers" in v or "spill" in v], (hd, c)
    for hd, c in spills:
        assert [v for v in violations(c, bwd(1024, hd)) if "registers" in v or "spill" in v], (hd, c)
    # The deterministic GQA dK/dV locks at tile 128: clean with the stmatrix dS^T store (session 12's
    # compile), spilling with the per-element one.
    det_gqa = BwdConfigSm90(tile_m=128)
    assert not violations(det_gqa, gqa64)
    assert any("GQA" in v for v in violations(BwdConfigSm90(tile_m=128, ds_store="sts"), gqa64))
    assert not violations(det_gqa, Problem.standard(1024, 64, pass_="bwd", deterministic=True))


def test_knobs_roundtrip_and_schema():
    # 20,000 configs drawn from the space (3.5M; walking it all took minutes), every value of
    # every knob among them.
    seen = set()
    for c in random_configs(BwdConfigSm90, 20000):
        assert config_from_dict(BwdConfigSm90, config_to_dict(c)) == c
        seen.update(dataclasses.asdict(c).items())
    assert seen == {(s.name, v) for s in knob_specs(BwdConfigSm90) for v in s.choices}
    names = set(json_schema(BwdConfigSm90)["properties"])
    assert names == {f.name for f in dataclasses.fields(BwdConfigSm90)}


def test_some_config_feasible_for_every_supported_problem():
    for hd, causal, det, gqa in itertools.product((64, 128), (False, True), (False, True), (False, True)):
        prob = bwd(4096, hd, causal, det, heads_kv=4 if gqa else None)
        assert any(not violations(c, prob) for c in iter_configs(BwdConfigSm90)), (hd, causal, det, gqa)


# ------------------------------------------------------------------------------------------ schedule

SEQS = [(1, 1), (65, 1), (1, 300), (128, 128), (333, 777), (777, 333), (1000, 1000), (257, 129), (64, 640)]


def visible(i, j, sq, sk, causal):
    return j < sk and i < sq and (not causal or j <= i + sk - sq)


@pytest.mark.parametrize("sq,sk", SEQS)
@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_m_block_range_matches_the_mask(sq, sk, tile_m, causal):
    tile_n = 128
    num_n = -(-sk // tile_n)
    for n in range(num_n):
        m_start, m_masked_end, m_end = m_block_range(n, tile_m, tile_n, sq, sk, causal)
        keys = range(n * tile_n, (n + 1) * tile_n)
        for m in range(-(-sq // tile_m)):
            rows = range(m * tile_m, (m + 1) * tile_m)
            any_visible = any(visible(i, j, sq, sk, causal) for i in rows for j in keys)
            # A pair that must be masked: a real query row and a key it may not see.
            any_masked = any(i < sq and not visible(i, j, sq, sk, causal) for i in rows for j in keys)
            visited = m_start <= m < m_end
            if any_visible:
                assert visited, (n, m)
            if visited and any_masked:
                assert m < m_masked_end, (n, m, "masked pairs in an unmasked tile")
        # Visiting more than the visible tiles is allowed only at the range ends, never skipped inside.
        assert 0 <= m_start <= m_masked_end <= m_end


@pytest.mark.parametrize("sq,sk", SEQS)
@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spt", [0, 1])
def test_dq_turns_are_a_launch_ordered_permutation(sq, sk, tile_m, causal, spt):
    tile_n = 128
    num_n = -(-sk // tile_n)
    # Launch position of key tile n within one head (fa4.common.scheduling.decode_tile: SPT
    # reverses the order, like LPT reverses m in the forward).
    launch = {n: (num_n - 1 - n if spt else n) for n in range(num_n)}
    for m in range(-(-sq // tile_m)):
        visitors = [n for n in range(num_n) if m_block_range(n, tile_m, tile_n, sq, sk, causal)[0] <= m
                    < m_block_range(n, tile_m, tile_n, sq, sk, causal)[2]]
        if not visitors:
            continue
        turns = {n: dq_turn(m, n, tile_m, tile_n, num_n, sq, sk, causal, spt) for n in visitors}
        assert sorted(turns.values()) == list(range(len(visitors))), (m, turns)
        by_turn = sorted(visitors, key=turns.get)
        assert [launch[n] for n in by_turn] == sorted(launch[n] for n in visitors), (m, turns)


def test_register_splits_fit_the_launch_allocation():
    from fa4.common.regs import launch_registers, reg_split_violation
    from fa4.sm90 import bwd_config, fwd_config

    assert launch_registers(384) == 168 and launch_registers(512) == 128
    assert reg_split_violation(2, *bwd_config.REG_SPLIT) is None
    for wgs, split in fwd_config.REG_SPLIT.items():
        assert reg_split_violation(wgs, *split) is None
    # The split the first backward used: 2 x 240 + 32 over 128 lanes = 65,536 > 168 x 384.
    assert "wait forever" in reg_split_violation(2, 240, 32)
    assert "multiple of 8" in reg_split_violation(2, 236, 24)


# -- the later head dims: 96 through dkv_split 'keys', 192, 192/128 and 256 through 'head_dim' --

NEW_DIMS = [(96, 96), (192, 192), (192, 128), (256, 256)]


@pytest.mark.parametrize("hd,hdv", NEW_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_default_config_of_the_later_head_dims(hd, hdv, causal, det, gqa):
    prob = bwd(8192, hd, causal, det, head_dim_v=hdv, heads_q=16, heads_kv=4 if gqa else 16)
    cfg = default_config(prob)
    assert violations(cfg, prob) == []
    assert cfg.dkv_split == ("keys" if hd == 96 else "head_dim")
    # hd192 (and 192/128): the queries-on-M tiling, 96 keys (QM_DEFAULT).
    assert cfg.tile_m == 64 and cfg.tile_n == {96: 128, 192: 96, 256: 64}[hd]
    # Sq = Sk: GQA keeps 'atomic' (loop lost 5-24% there on the H200), whose dK/dV are fp32 reductions.
    assert cfg.gqa_reduce == "atomic"
    assert cfg.dkv_store == ("direct" if gqa else "tma")
    # With a query range a quarter of the keys' the group walk is the default, storing finished tiles.
    short = bwd(2048, hd, causal, det, head_dim_v=hdv, heads_q=16, heads_kv=4, seqlen_k=8192)
    loop = default_config(short)
    assert loop.gqa_reduce == "loop" and loop.dkv_store == "tma" and violations(loop, short) == []


def test_dkv_split_register_and_smem_budgets():
    """'keys' cannot hold dK and dV over head_dim 192/256 (nor 192/128) in a consumer's 240
    registers; 'head_dim' halves them, and is offered only there; the dQ staging tile of hd256
    leaves no room for a two-deep Q/dO ring."""
    from fa4.sm90.bwd_config import CONSUMER_REG_BUDGET, consumer_registers

    keys = BwdConfigSm90(tile_m=64, stages=1, ds_stages=1, dv_operand="smem")
    split = BwdConfigSm90(tile_m=64, dkv_split="head_dim", dv_operand="smem")
    for hd, hdv in ((192, 192), (192, 128), (256, 256)):
        prob = bwd(1024, hd, head_dim_v=hdv)
        assert consumer_registers(keys, prob) > CONSUMER_REG_BUDGET
        assert any("registers" in v for v in violations(keys, prob))
        assert consumer_registers(split, prob) <= CONSUMER_REG_BUDGET
    # hd256: dK/dV 128 registers, the dQ accumulator (64 x 256 over 256 threads) 64 more at its peak.
    assert consumer_registers(split, bwd(1024, 256)) == 128 + 64 + 24
    assert consumer_registers(split, bwd(1024, 192, head_dim_v=128)) == 80 + 48 + 24
    # tile_m 128 at hd256: the dQ accumulator alone would be 128 registers beside dK/dV.
    assert any("registers" in v for v in violations(
        BwdConfigSm90(tile_m=128, stages=1, ds_stages=1, dkv_split="head_dim", dv_operand="smem"), bwd(1024, 256)))
    assert any("shared memory" in v for v in violations(split, bwd(1024, 256)))  # stages 2 + the dQ tile
    assert not violations(BwdConfigSm90(tile_m=64, stages=1, dkv_split="head_dim", dv_operand="smem"),
                          bwd(1024, 256))
    for hd in (64, 96, 128):
        assert any("dkv_split 'head_dim' is built for" in v for v in violations(split, bwd(1024, hd)))
    assert any("dv_operand 'smem'" in v for v in violations(
        BwdConfigSm90(dkv_split="head_dim", dv_operand="rmem"), bwd(1024, 192)))
    assert split.tile_n == 64 and keys.tile_n == 128


def test_head_dim_v_pairs():
    assert not violations(default_config(bwd(1024, 192, head_dim_v=128)), bwd(1024, 192, head_dim_v=128))
    bad = bwd(1024, 256, head_dim_v=128)
    assert any("head_dim_v 128 not supported with head_dim 256" in v for v in violations(default_config(bad), bad))
    # smem counts dO and V at head_dim_v: 192/128 fits what 192/192 only just fits.
    cfg = default_config(bwd(1024, 192))
    assert smem_bytes(cfg, bwd(1024, 192, head_dim_v=128)) < smem_bytes(cfg, bwd(1024, 192)) <= SM90.smem_per_cta


# -- sliding windows (issue 18): the ranges and turns with a left and/or right bound -------------

WINDOWS = [(-1, -1), (0, -1), (5, -1), (200, -1), (-1, 0), (-1, 3), (-1, 300), (0, 0), (7, 9), (127, 0),
           (1023, 0), (64, 64), (300, 1)]
WIN_SEQS = [(1, 1), (65, 1), (1, 300), (333, 777), (777, 333), (1000, 1000), (257, 129)]


def win_visible(i, j, sq, sk, causal, left, right):
    o = sk - sq
    if causal:
        right = 0
    return (j < sk and i < sq and (right < 0 and not causal or j <= i + o + right)
            and (left < 0 or j >= i + o - left))


@pytest.mark.parametrize("sq,sk", WIN_SEQS)
@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left,right", WINDOWS)
def test_window_ranges_match_the_mask(sq, sk, tile_m, causal, left, right):
    """Every tile pair with a visible pair is visited (by q_block_range and kv_block_range alike),
    none without is (fully masked tiles skipped), and every visited tile with a masked pair is in
    a masked run of m_block_segments."""
    from fa4.common.bwd_schedule import m_block_segments
    from fa4.common.masking_range import kv_block_range, q_block_range

    tile_n = 128
    hl, hr = left >= 0, right >= 0
    num_n, num_m = -(-sk // tile_n), -(-sq // tile_m)
    args = (sq, sk, causal, hl, hr, max(left, 0), max(right, 0))
    for n in range(num_n):
        m0, m1, m2, m3 = m_block_segments(n, tile_m, tile_n, *args)
        assert (m0, m3) == q_block_range(n, tile_m, tile_n, *args)
        assert 0 <= m0 <= m1 <= m2 <= m3 <= num_m
        keys = range(n * tile_n, (n + 1) * tile_n)
        for m in range(num_m):
            rows = range(m * tile_m, (m + 1) * tile_m)
            vis = any(win_visible(i, j, sq, sk, causal, left, right) for i in rows for j in keys)
            # Visible by tile extents (rows/keys past the sequence too): what both ranges test.
            ext = any(win_visible(i, j, 1 << 20, 1 << 20, causal, left, right) for i in
                      range(m * tile_m + (1 << 20) - sq, (m + 1) * tile_m + (1 << 20) - sq)
                      for j in range(n * tile_n + (1 << 20) - sk, (n + 1) * tile_n + (1 << 20) - sk))
            visited = m0 <= m < m3
            n_lo, n_hi = kv_block_range(m, tile_m, tile_n, *args)
            assert visited == (n_lo <= n < n_hi), (n, m)
            if vis:
                assert visited, (n, m)
            assert visited == ext, (n, m)
            masked = any(i < sq and not win_visible(i, j, sq, sk, causal, left, right) for i in rows for j in keys)
            if visited and masked:
                assert m < m1 or m >= m2, (n, m, "masked pairs in an unmasked tile")


@pytest.mark.parametrize("sq,sk", WIN_SEQS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spt", [0, 1])
@pytest.mark.parametrize("left,right", WINDOWS)
def test_window_dq_turns_are_a_launch_ordered_permutation(sq, sk, causal, spt, left, right):
    """With a window the contributors of a query tile are a run of key tiles not starting at 0:
    their turns are still 0..k-1 in launch order, so a deterministic CTA never waits for a key
    tile the window skips (it would wait forever)."""
    from fa4.common.bwd_schedule import m_block_segments

    tile_m, tile_n = 64, 128
    num_n = -(-sk // tile_n)
    args = (sq, sk, causal, left >= 0, right >= 0, max(left, 0), max(right, 0))
    launch = {n: (num_n - 1 - n if spt else n) for n in range(num_n)}
    for m in range(-(-sq // tile_m)):
        visitors = [n for n in range(num_n) if m_block_segments(n, tile_m, tile_n, *args)[0] <= m
                    < m_block_segments(n, tile_m, tile_n, *args)[3]]
        turns = {n: dq_turn(m, n, tile_m, tile_n, num_n, sq, sk, causal, spt, *args[3:]) for n in visitors}
        assert sorted(turns.values()) == list(range(len(visitors))), (m, turns)
        by_turn = sorted(visitors, key=turns.get)
        assert [launch[n] for n in by_turn] == sorted(launch[n] for n in visitors), (m, turns)


# (head_dim, causal, window_right, deterministic, heads_kv of 16 query heads) -> (spt_order,
# head_swizzle): the H200's session-11 launch-order sweep (bench/RESULTS.md) as the default rule.
LAUNCH_ORDER = [
    ((128, True, -1, False, 16), (False, 4)),  # causal S8k +4%, sink +4%
    ((128, True, -1, False, 4), (False, 4)),  # GQA 'atomic' (Sq = Sk): Llama +4%, Qwen +6%
    ((96, True, -1, False, 16), (False, 2)),  # hd96 +1-3% over 4 (session 31)
    ((64, True, -1, False, 16), (False, 2)),  # hd64 +2%
    ((192, True, -1, False, 16), (False, 1)),  # split head dims: spt alone +3-4%
    ((256, True, -1, False, 16), (False, 1)),
    ((128, False, 0, False, 16), (False, 4)),  # a window's right bound masks like causal
    ((128, False, -1, False, 16), (True, 1)),  # unmasked: more heads per group lost
    # deterministic: walking down, longest first with 16 heads a group at causal hd128 with 64 key
    # tiles (session 30, det_walk_down_pays), else shortest first walking up; either way its turns never wait
    ((128, True, -1, True, 16), (False, 16)),
    ((128, False, 0, True, 16), (True, 8)),  # a window: not walked down (unmeasured)
    ((96, True, -1, True, 16), (True, 1)),
    ((64, False, -1, True, 16), (True, 4)),
    ((128, False, -1, True, 16), (True, 8)),
]


# Short causal sequences: scheduling groups of about a wave (wave_head_swizzle, session 32):
# (head_dim, seqlen, heads_q, heads_kv, deterministic) -> (spt_order, head_swizzle).
SHORT_LAUNCH_ORDER = [
    ((64, 1024, 12, 12, False), (False, 16)),  # GPT-2 1k: 8 key tiles a head, +3-4% over 2
    ((64, 2048, 16, 16, False), (False, 8)),  # +5% over 2
    ((64, 4096, 16, 16, False), (False, 4)),  # +4.8% over 2
    ((64, 8192, 32, 8, False), (False, 2)),  # 64 key tiles: as before
    ((96, 1024, 16, 16, False), (False, 16)),
    ((128, 1024, 16, 16, False), (False, 16)),
    ((128, 2048, 32, 8, False), (False, 8)),  # GQA 'atomic'
    ((128, 4096, 28, 4, False), (False, 4)),  # Qwen2.5-7B: 32 key tiles, the hd128 base
    ((64, 512, 16, 16, False), (False, 16)),  # 4 key tiles: capped at the most measured
    ((64, 1024, 12, 12, True), (True, 16)),  # deterministic GPT-2: +2%, shortest first still
    ((64, 2048, 16, 16, True), (True, 8)),
    ((64, 4096, 16, 16, True), (True, 1)),  # 32 key tiles: 4 heads lost
    ((64, 1024, 16, 4, True), (True, 1)),  # deterministic GQA: unmeasured
    ((128, 1024, 16, 16, True), (True, 1)),  # hd128: +0.1-0.8%, not taken
]


@pytest.mark.parametrize("key,want", SHORT_LAUNCH_ORDER)
def test_short_causal_sequences_launch_a_wave_a_group(key, want):
    hd, s, hq, hkv, det = key
    prob = Problem(batch=8, seqlen_q=s, seqlen_k=s, heads_q=hq, heads_kv=hkv, head_dim=hd, head_dim_v=hd,
                   causal=True, deterministic=det, pass_="bwd", dtype="bf16")
    cfg = default_config(prob)
    assert (cfg.spt_order, cfg.head_swizzle) == want
    assert cfg.gqa_reduce == "atomic" and not cfg.walk_down
    assert not violations(cfg, prob)
    # Non-causal keeps its order: every key tile of a head does the same work.
    flat = default_config(dataclasses.replace(prob, causal=False))
    assert (flat.spt_order, flat.head_swizzle) == ((True, 1) if not det else (True, 4 if hd == 64 else 8))


def test_a_wave_a_group_counts_the_key_tiles_of_a_head():
    """16 heads of 8 key tiles, 8 of 16, ... 2 of 64: the most heads, a power of two, whose key tiles
    fit WAVE_CTAS; never above WAVE_MAX_HEADS, never below 1."""
    for s, want in [(128, 16), (1024, 16), (1025, 8), (2048, 8), (4096, 4), (8192, 2), (16384, 1), (65536, 1)]:
        prob = Problem(batch=1, seqlen_q=s, seqlen_k=s, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64,
                       causal=True, pass_="bwd", dtype="bf16")
        assert wave_head_swizzle(prob, TILE_N) == want, s
        assert want * key_tiles(prob, TILE_N) <= max(WAVE_CTAS, key_tiles(prob, TILE_N))
        assert want == WAVE_MAX_HEADS or 2 * want * key_tiles(prob, TILE_N) > WAVE_CTAS


def _walks(hd=128, causal=False, det=False, sq=8192, sk=8192, hq=16, hkv=16, varlen=False, **kw):
    prob = Problem(batch=2, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=hd, head_dim_v=hd,
                   causal=causal, deterministic=det, pass_="bwd", dtype="bf16", varlen=varlen,
                   varlen_mean_q=sq // 2 if varlen else 0, varlen_mean_k=sk // 2 if varlen else 0, **kw)
    cfg = default_config(prob)
    assert not violations(cfg, prob)
    return cfg.q_starts, cfg.walk_down


@pytest.mark.parametrize("kw,want", [
    # q_starts 16 where CTAs' unmasked runs coincide, at the head dims measured (hd128, hd256).
    (dict(), (16, False)), (dict(hd=256), (16, False)), (dict(hd=96), (1, False)), (dict(hd=64), (1, False)),
    (dict(hd=192), (1, False)),
    (dict(causal=True, sq=2048, hq=64, hkv=8), (16, False)),  # left of the diagonal (Sq 2k / Sk 8k)
    # Below the shortest query range measured (Q_STARTS_MIN_Q): with it, Sq 128 / Sk 8k fwd+bwd took 2.26x session 23's.
    (dict(causal=True, sq=128, hq=32, hkv=8), (1, False)), (dict(sq=1024, sk=1024), (1, False)),
    (dict(sq=2048, sk=2048), (16, False)),
    (dict(causal=True), (1, False)),  # the diagonal spreads the runs
    (dict(det=True), (1, False)),  # turns in launch order
    (dict(varlen=True), (1, False)),  # unmeasured
    (dict(window_left=1023, window_right=0), (1, False)),
    # walk_down for the deterministic causal hd128 backward with >= 64 key tiles a head: 'atomic' or MHA
    # at Sq = Sk, 'loop' at Sq < Sk.
    (dict(det=True, causal=True), (1, True)), (dict(det=True, causal=True, hq=32, hkv=8), (1, True)),
    (dict(det=True, causal=True, sq=4096, sk=4096, hq=28, hkv=4), (1, False)),  # Qwen 4k: it lost
    (dict(det=True, causal=True, hd=64), (1, False)),  # even at hd64 MHA
    (dict(det=True, causal=True, hd=64, hq=32, hkv=8), (1, True)),  # Llama-3.2-1B: +0.3-4.6%
    (dict(det=True, causal=True, sq=2048, hq=64, hkv=8), (1, True)),  # 'loop', Sq 2k / Sk 8k
    (dict(det=True, causal=True, sq=2048, sk=4096, hq=64, hkv=8), (1, False)),  # 32 key tiles a head
    (dict(det=True, causal=True, hd=64, sq=2048, hq=64, hkv=8), (1, False)),  # hd64 'loop': unmeasured
    (dict(det=True, causal=True, sq=128, hq=32, hkv=8), (1, False)),  # Sq 128 / Sk 8k 'loop': unmeasured
    (dict(det=True, window_left=1023, window_right=0), (1, False)),  # unmeasured
])
def test_measured_walk_defaults(kw, want):
    assert _walks(**kw) == want


def _finish(**kw):
    prob_kw = dict(kw)
    hd = prob_kw.pop("hd", 128)
    sq = prob_kw.pop("sq", 8192)
    sk = prob_kw.pop("sk", 8192)
    sq = min(sq, sk)
    varlen = prob_kw.pop("varlen", False)
    prob = Problem(batch=2, seqlen_q=sq, seqlen_k=sk, head_dim=hd, head_dim_v=hd, pass_="bwd", dtype="bf16",
                   varlen=varlen, varlen_mean_q=sq // 2 if varlen else 0, varlen_mean_k=4096 if varlen else 0,
                   **{"heads_q": 32, "heads_kv": 8, "causal": True, **prob_kw})
    cfg = default_config(prob)
    assert not violations(cfg, prob)
    # (Feasible wherever the default is not taking it: the rule, not violations(), keeps it off.)
    if prob.deterministic and cfg.gqa_finish == "postprocess" and hd == 128 and prob.heads_q != prob.heads_kv \
            and cfg.gqa_reduce == "atomic" and not varlen:
        assert cfg.gqa_add == "bulk", cfg
    return cfg.gqa_finish


@pytest.mark.parametrize("kw,want", [
    (dict(deterministic=True), "last_cta"),  # Llama-3-8B 8k: +1.9%, +2.2%
    (dict(deterministic=True, causal=False), "last_cta"),
    (dict(deterministic=True, heads_q=28, heads_kv=4), "last_cta"),  # Qwen2.5-7B at 8k: +1.7%, +1.6%
    # At most 32 key tiles a head: the postprocess path with bulk adds (Qwen2.5-7B 4k +1.5-2.6%).
    (dict(deterministic=True, heads_q=28, heads_kv=4, sk=4096), "postprocess"),
    (dict(deterministic=True, sk=2048), "postprocess"),
    (dict(deterministic=True, sk=4224), "last_cta"),  # 33 key tiles
    (dict(), "postprocess"),  # non-deterministic: -2.7% to -3.4% at hd128
    (dict(deterministic=True, hd=64), "postprocess"),  # Llama-3.2-1B: -3.6%, -2.0%
    (dict(deterministic=True, hd=96), "postprocess"),  # unmeasured
    (dict(deterministic=True, hd=256), "postprocess"),
    (dict(deterministic=True, heads_q=8), "postprocess"),  # no GQA: nothing to finish
    (dict(deterministic=True, sq=2048, heads_q=64), "postprocess"),  # 'loop' (Sq 2k / Sk 8k)
    (dict(deterministic=True, varlen=True), "postprocess"),  # not built
])
def test_measured_gqa_finish_defaults(kw, want):
    assert _finish(**kw) == want


@pytest.mark.parametrize("key,want", LAUNCH_ORDER)
def test_default_launch_order(key, want):
    hd, causal, right, det, hkv = key
    prob = Problem(batch=2, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=hkv, head_dim=hd, head_dim_v=hd,
                   causal=causal, deterministic=det, window_right=right, pass_="bwd", dtype="bf16")
    cfg = default_config(prob)
    assert (cfg.spt_order, cfg.head_swizzle) == want
    assert not violations(cfg, prob)


def test_default_launch_order_of_loop_and_varlen():
    # 'loop' (Sq << Sk under GQA) walks whole K/V heads: one per group, longest first (Sq 2k / Sk 8k
    # lost 3.5% with 4); varlen takes 'atomic' and, at hd128, 8 heads a group (its padded grid's
    # empty key tiles: +1.2-2.8% over 4 on the H200, session 18), the dense rule elsewhere.
    loop = Problem(batch=1, seqlen_q=2048, seqlen_k=8192, heads_q=64, heads_kv=8, head_dim=128, head_dim_v=128,
                   causal=True, pass_="bwd", dtype="bf16")
    cfg = default_config(loop)
    assert (cfg.gqa_reduce, cfg.spt_order, cfg.head_swizzle) == ("loop", False, 1)
    packed = dataclasses.replace(Problem(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16,
                                         head_dim=128, head_dim_v=128, causal=True, pass_="bwd", dtype="bf16"),
                                 varlen=True, varlen_mean_q=2048, varlen_mean_k=2048)
    cfg = default_config(packed)
    assert (cfg.gqa_reduce, cfg.spt_order, cfg.head_swizzle) == ("atomic", False, VARLEN_HEAD_SWIZZLE)
    assert not violations(cfg, packed)
    for change, want in [(dict(head_dim=64, head_dim_v=64), (False, 2)), (dict(deterministic=True), (True, 1)),
                         (dict(causal=False), (True, 1))]:
        cfg = default_config(dataclasses.replace(packed, **change))
        assert (cfg.spt_order, cfg.head_swizzle) == want, change


def test_step_orders_are_the_head_dim_splits():
    """dp_first and dk_before_dq order the GEMMs of dkv_split 'head_dim': feasible on hd192/256's
    defaults (hd256's with the exchange), refused with 'keys' and dp_first with exp_pin (nothing
    would run under dP^T)."""
    for hd, hdv in ((192, 192), (192, 128), (256, 256)):
        prob = Problem.standard(8192, hd, head_dim_v=hdv, causal=True, pass_="bwd")
        base = default_config(prob)
        assert base.dkv_split == "head_dim" and base.cluster_exchange == (hd == 256)
        for change in (dict(dp_first=True), dict(dk_before_dq=True), dict(dp_first=True, dk_before_dq=True)):
            assert not violations(dataclasses.replace(base, **change), prob), (hd, change)
        assert any("exp_pin" in v for v in violations(dataclasses.replace(base, dp_first=True, exp_pin=True), prob))
        assert not violations(dataclasses.replace(base, dk_before_dq=True, exp_pin=True), prob)
        # dk_before_dq is hd256's default and hd192's with the queries-on-M tiling (measured, session
        # 27); dp_first is off.
        assert not base.dp_first and base.dk_before_dq == (hdv in (192, 256))
    prob = Problem.standard(8192, 128, causal=True, pass_="bwd")
    for name in ("dp_first", "dk_before_dq"):
        out = violations(dataclasses.replace(default_config(prob), **{name: True}), prob)
        assert any(name in v and "'keys'" in v for v in out), out


def test_qm_tiling_declaration():
    """qm_tile_n (fa4.sm90.bwd_qm): the reference's wide-head tilings are feasible with its rings
    (hd192: 96 keys, Q 2 / dO 1 and one P/dS buffer in 224,000 B; hd192/128: Q and dO 2; hd256: 48
    keys, Q 2 / dO 1), the models count what they hold, and what is not built or does not fit is
    refused with its reason. Off by default until measured."""
    def prob(hd, hdv=None, **kw):
        return Problem.standard(8192, hd, head_dim_v=hdv, causal=True, pass_="bwd", **kw)

    p192 = prob(192)
    base = dataclasses.replace(default_config(p192), dp_first=False, dk_before_dq=False)
    qm = dataclasses.replace(base, qm_tile_n=96, stages=2, do_single=True, ds_stages=1, dq_accum="bulk")
    assert not violations(qm, p192)
    assert (qm.tile_n, qm.do_stages, qm.stages) == (96, 1, 2)
    # Q 2 x 64 x 192, dO 64 x 192, K/V 96 x 384, P and dS 64 x 96, the fp32 dQ tile, three stat rows.
    assert smem_bytes(qm, p192) == 2 * (2 * 64 * 192 + 64 * 192 + 96 * 384 + 2 * 64 * 96) + 64 * 192 * 4 + 3 * 64 * 4 + 2048
    # dK^T/dV^T 96 x 384 over 256 threads beside S and dP (2 x 64 x 96 / 256), plus the bulk path.
    assert consumer_registers(qm, p192) == 144 + 48 + 24
    assert any(v.kind == "shared memory" for v in violations(dataclasses.replace(qm, do_single=False), p192))
    assert any(v.kind == "registers" for v in violations(dataclasses.replace(qm, qm_tile_n=48, ds_store="sts"), p192))
    p192v = prob(192, 128)
    assert not violations(dataclasses.replace(qm, do_single=False), p192v)
    p256 = prob(256)
    qm256 = dataclasses.replace(default_config(p256), cluster_exchange=False, dk_before_dq=False, qm_tile_n=48,
                                stages=2, do_single=True, ds_stages=1, dq_accum="bulk", ds_store="sts")
    assert not violations(qm256, p256)
    refused = {
        "stmatrix": dataclasses.replace(qm256, ds_store="stmatrix"),
        "cluster_exchange": dataclasses.replace(qm256, cluster_exchange=True),
        "dkv_split 'head_dim'": dataclasses.replace(qm, dkv_split="keys", dv_operand="rmem"),
        "tile_m 64": dataclasses.replace(qm, tile_m=128),
    }
    for why, cfg in refused.items():
        assert any(why in v for v in violations(cfg, p256 if cfg.qm_tile_n == 48 else p192)), (why, cfg)
    p128 = prob(128)
    assert any("built for head_dim" in v for v in violations(dataclasses.replace(default_config(p128), qm_tile_n=96), p128))
    assert any("do_single" in v for v in violations(dataclasses.replace(base, qm_tile_n=0, do_single=True), p192))
    # The default at hd192 (measured, session 27): 96 keys, dO one slot beside hd192's V, two beside 128.
    assert default_config(p192) == dataclasses.replace(qm, dk_before_dq=True)
    assert default_config(p192v) == dataclasses.replace(qm, do_single=False)
    assert default_config(p256).qm_tile_n == 0 and not default_config(p256).do_single
    varlen = dataclasses.replace(p192, varlen=True, varlen_mean_q=2048, varlen_mean_k=2048)
    assert default_config(varlen).qm_tile_n == 0


@pytest.mark.parametrize("m_start,lo,hi,m_end", [(0, 0, 128, 128), (0, 0, 1, 1), (0, 0, 2, 2), (3, 3, 40, 40),
                                                  (5, 9, 68, 68), (0, 2, 2, 2), (0, 0, 30, 31), (4, 6, 20, 25)])
@pytest.mark.parametrize("starts", [1, 4, 16, 64])
def test_q_starts_walks_are_permutations_that_spread_a_wave(m_start, lo, hi, m_end, starts):
    """walk_tile (the kernel's q_starts walk): each key tile visits every query tile of its walk
    [m_start, m_end) once, the masked tiles outside the unmasked run [lo, hi) in their places; at 1
    the walk is the plain one; at s the key tiles of a wave (consecutive n) visit min(s, run) different
    tiles of the run at each of its steps, so a step's dQ adds land on that many accumulator tiles.
    The consumers' form (within=True, m in the run) is the same map."""
    count = hi - lo
    for n in range(200):
        walk = [walk_tile(m, lo, hi, n, starts) for m in range(m_start, m_end)]
        assert sorted(walk) == list(range(m_start, m_end)), (n, walk)
        assert all(walk[m - m_start] == m for m in range(m_start, m_end) if not lo <= m < hi)
        assert [walk_tile(m, lo, hi, n, starts, within=True) for m in range(lo, hi)] == walk[lo - m_start:hi - m_start]
        if starts == 1:
            assert walk == list(range(m_start, m_end))
    for step in range(count):
        at_step = {walk_tile(lo + step, lo, hi, n, starts) for n in range(132)}
        assert len(at_step) == min(starts, count), (step, at_step)


def test_q_starts_is_for_coinciding_non_deterministic_runs():
    """q_starts' other values run where CTAs' unmasked runs coincide and dQ adds are not ordered: no
    bound, or causal (a right bound) with seqlen_q < seqlen_k; refused causal at seqlen_q = seqlen_k,
    with a left window bound and deterministic, each with its reason; the default at head_dim 128 and
    256 only (Q_STARTS_HEAD_DIMS: where it was measured, test_measured_walk_defaults)."""
    free = Problem.standard(8192, 128, pass_="bwd")
    short_q = Problem(1, 2048, 8192, 64, 8, 128, 128, causal=True, pass_="bwd")
    for hd in (64, 96, 128, 192, 256):
        for prob in (Problem.standard(8192, hd, pass_="bwd"), dataclasses.replace(short_q, head_dim=hd, head_dim_v=hd)):
            # (hd256's short query range under GQA runs 'loop', which keeps the plain walk there.)
            loop = default_config(prob).gqa_reduce == "loop" and hd in (192, 256)
            assert default_config(prob).q_starts == (16 if hd in (128, 256) and not loop else 1)
            for s in (4, 16, 64):
                # (Under GQA the short query range's default walks the group's heads: 'loop', which at
                # the head-dim split layouts keeps the plain walk, its registers measured at the limit.)
                cfg = dataclasses.replace(default_config(prob), q_starts=s)
                out = violations(cfg, prob)
                if cfg.gqa_reduce == "loop" and hd in (192, 256):
                    assert [v.kind for v in out] == ["registers"] and "'loop'" in out[0], out
                    cfg = dataclasses.replace(cfg, gqa_reduce="atomic", dkv_store="direct")
                    out = violations(cfg, prob)
                assert not out, (hd, s, prob, out)
    for prob, why in ((Problem.standard(8192, 128, causal=True, pass_="bwd"), "spreads"),
                      (dataclasses.replace(free, window_left=256), "spreads"),
                      (dataclasses.replace(short_q, window_left=256), "spreads"),
                      (dataclasses.replace(free, deterministic=True), "deterministic"),
                      (dataclasses.replace(short_q, deterministic=True), "deterministic")):
        # (walk_down off: the deterministic short query range's default walks down, refused beside q_starts too.)
        out = violations(dataclasses.replace(default_config(prob), q_starts=16, walk_down=False), prob)
        assert [v.kind for v in out] == ["knob combination"] and why in out[0], out


@pytest.mark.parametrize("sq,sk", WIN_SEQS + [(1000, 100), (4096, 1024)])
@pytest.mark.parametrize("tile_m,tile_n", [(64, 128), (128, 128), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left,right", WINDOWS)
def test_deterministic_dq_sums_are_zeroed_where_no_first_turn_stores(sq, sk, tile_m, tile_n, causal, left, right):
    """The deterministic backward's first dQ turn of a query tile stores its tile, so the
    preprocess zeroes only the rows below dq_zero_rows: every query tile must be either wholly
    below them or stored by a visiting key tile (turn 0, either launch order), and a tile that
    sees a key is never zeroed when the rest of it is stored (the saving is the point)."""
    from fa4.common.bwd_schedule import dq_zero_rows, m_block_segments
    from fa4.sm90.bwd_launch import right_bound, window_flags

    args = (sq, sk, causal, left >= 0, right >= 0, max(left, 0), max(right, 0))
    # The bounds as the launch passes them (window_flags drops a bound that hides nothing).
    c, _, has_wr, _, wr = window_flags(causal, left, right, sq, sk)
    zero = dq_zero_rows(sq, sk, tile_m, right_bound(c, has_wr, wr))
    num_n = -(-sk // tile_n)
    for m in range(-(-sq // tile_m)):
        rows = range(m * tile_m, min((m + 1) * tile_m, sq))
        sees = any(win_visible(i, j, sq, sk, causal, left, right) for i in rows for j in range(sk))
        visitors = [n for n in range(num_n) if m_block_segments(n, tile_m, tile_n, *args)[0] <= m
                    < m_block_segments(n, tile_m, tile_n, *args)[3]]
        for spt in (0, 1):
            stored = any(dq_turn(m, n, tile_m, tile_n, num_n, sq, sk, causal, spt, *args[3:]) == 0 for n in visitors)
            assert stored or (m + 1) * tile_m <= zero, (m, spt, zero)
        if sees:
            assert visitors and zero <= m * tile_m, (m, zero)


def test_deterministic_dq_sums_are_all_zeroed_without_keys():
    """A varlen sequence with no keys gets no dQ turn: every row keeps the preprocess's zeros."""
    from fa4.common.bwd_schedule import dq_zero_rows

    for right in (-1, 0, 5):
        assert dq_zero_rows(300, 0, 64, right) == 300 and dq_zero_rows(0, 0, 64, right) == 0
