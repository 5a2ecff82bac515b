"""gqa_reduce 'loop' on the host (CPU only): the (head, m_block) walk of a CTA, its dQ turns, the
knob's feasibility and default rule, and the launch plan's buffers.

The walk is modelled from the functions the kernel traces (fa4.common.bwd_schedule: the query
tile segments, group_step, dq_turn) with the loops of fa4.sm90.bwd written out in Python: the
producer's head-major loads, the consumers' three segment loops per head with their step index
m - step_base, and the two dQ writer warps taking alternate steps. Against a brute-force scan of
the mask: every (head, m_block) pair whose query rows see a key of the tile is visited exactly
once, by all three in the same order and ring slot; and the deterministic dQ turns, with CTAs
walking several heads, complete on a machine with fewer SMs than CTAs (no deadlock).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from fa4.common.bwd_schedule import dq_turn, group_step, m_block_segments, step_index, walk_down_tile, walk_runs
from fa4.problem import Problem
from fa4.sm90.bwd_config import BwdConfigSm90, violations
from fa4.sm90.bwd_defaults import DET_WALK_DOWN_SWIZZLE, GQA_LOOP_MIN_CTAS, default_config, default_gqa_reduce, det_walk_down_pays, loop_ctas


def visible(i, j, sq, sk, causal, left=-1, right=-1):
    o = sk - sq
    if not (j < sk and i < sq):
        return False
    hi = i + o + (0 if causal else right) if (causal or right >= 0) else sk
    lo = i + o - left if left >= 0 else 0
    return lo <= j <= hi


def segments(n, tile_m, tile_n, sq, sk, causal, left, right):
    return m_block_segments(n, tile_m, tile_n, sq, sk, causal, left >= 0, right >= 0 and not causal,
                            max(left, 0), max(right, 0))


def tile_at(m, seg, down):
    """fa4.sm90.bwd walk(): the query tile at walk position m (walk_down: mirrored)."""
    return walk_down_tile(m, seg[0], seg[3]) if down else m


def producer_walk(group, seg, down=False):
    """fa4.sm90.bwd producer: for each head of the group, the walk positions [m_start, m_end)
    mapped to their query tiles; the ring slot advances once per load."""
    m_start, _, _, m_end = seg
    out, slot = [], 0
    for hl in range(group):
        for m in range(m_start, m_end):
            out.append((hl, tile_at(m, seg, down), slot))
            slot += 1
    return out


def consumer_walk(group, seg, has_left, down=False):
    """fa4.sm90.bwd consumer: per head the loops of walk_runs (masked, unmasked and, with a left
    bound, masked again; mirrored and reversed walking down); the step index (ring slot, ds
    buffer, dQ writer parity) is m - base, base moved with the mirrored tile as walked() does."""
    m_start, _, _, m_end = seg
    out = []
    for hl in range(group):
        step_base = m_start - hl * (m_end - m_start)
        for lo, hi, masked in walk_runs(seg, down, has_left):
            for p in range(lo, hi):
                m = tile_at(p, seg, down)
                base = step_base + (m - p)
                out.append((hl, m, m - base, masked))
    return out


def writer_walk(group, seg, parity, down=False):
    """fa4.sm90.bwd dq_writer of one parity: steps parity, parity + 2, ... of the walk."""
    m_start, _, _, m_end = seg
    out = []
    for t in range(parity, group * (m_end - m_start), 2):
        hl, m = group_step(t, m_start, m_end)
        out.append((hl, tile_at(m, seg, down), t))
    return out


SEQS = [(1, 1), (64, 64), (200, 200), (333, 777), (777, 333), (128, 512), (300, 1000), (65, 1)]
WINDOWS = [(-1, -1), (100, -1), (-1, 37), (250, 70)]


@pytest.mark.parametrize("sq,sk", SEQS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left,right", WINDOWS)
@pytest.mark.parametrize("tile_m,tile_n", [(64, 128), (128, 128), (64, 64)])
@pytest.mark.parametrize("down", [False, True], ids=["up", "walk_down"])
def test_walk_visits_each_visible_pair_once_in_one_order(sq, sk, causal, left, right, tile_m, tile_n, down):
    for n in range(-(-sk // tile_n)):
        seg = segments(n, tile_m, tile_n, sq, sk, causal, left, right)
        keys = range(n * tile_n, (n + 1) * tile_n)
        # Brute force, once per key tile: the query tiles with a visible pair, and those where a
        # real row has a hidden key (they must run masked).
        seen, hidden = set(), set()
        for m in range(-(-sq // tile_m)):
            rows = range(m * tile_m, (m + 1) * tile_m)
            if any(visible(i, j, sq, sk, causal, left, right) for i in rows for j in keys):
                seen.add(m)
            if any(i < sq and not visible(i, j, sq, sk, causal, left, right) for i in rows for j in keys):
                hidden.add(m)
        for group in (1, 2, 7):
            prod = producer_walk(group, seg, down)
            cons = consumer_walk(group, seg, left >= 0, down)
            # The same (head, m_block) sequence, each pair once, in the same ring slot.
            assert [(h, m) for h, m, _ in prod] == [(h, m) for h, m, _, _ in cons]
            assert [s for _, _, s in prod] == [s for _, _, s, _ in cons] == list(range(len(prod)))
            assert len({(h, m) for h, m, _ in prod}) == len(prod)
            # The writers' steps interleave to the same walk, and step_index inverts group_step.
            writers = sorted(writer_walk(group, seg, 0, down) + writer_walk(group, seg, 1, down), key=lambda x: x[2])
            assert [(h, m) for h, m, _ in writers] == [(h, m) for h, m, _ in prod]
            assert all(step_index(h, tile_at(m, seg, down), seg[0], seg[3]) == t for h, m, t in writers)
            # Every visible query tile for every head of the group; hidden pairs only in masked steps.
            for m in seen:
                assert sorted(h for h, mm, *_ in cons if mm == m) == list(range(group)), (n, m)
            assert all(masked for _, m, _, masked in cons if m in hidden), n


def launch_order(num_n, heads, batch, swizzle, spt):
    """fa4.common.scheduling.decode_tile over the 'loop' grid (heads = K/V heads): the CTAs'
    (n_block, head_kv, batch) in launch order."""
    num_bh = heads * batch
    out = []
    for idx in range(num_n * num_bh):
        per_group = num_n * swizzle
        g, rem = divmod(idx, per_group)
        here = min(swizzle, num_bh - g * swizzle)
        m_idx = rem // here
        bh = g * swizzle + rem - m_idx * here
        out.append((num_n - 1 - m_idx if spt else m_idx, bh % heads, bh // heads))
    return out


def run_turns(walks, sms, turn_of):
    """Simulate deterministic dQ adds on ``sms`` SMs: ``walks`` lists each CTA's (key tile, batch,
    [(query head, m_block), ...]) in launch order; CTAs become resident in that order as SMs free,
    and a resident CTA takes its next step only when ``turn_of(m_block, key tile)`` is the tile's
    next turn. Asserts that no state has every resident CTA waiting (a deadlock) and that each dQ
    tile received exactly its contributors' adds."""
    next_turn: dict = {}
    pos = [0] * len(walks)
    resident, launched, done = [], 0, 0
    while done < len(walks):
        while len(resident) < sms and launched < len(walks):
            resident.append(launched)
            launched += 1
        progressed = False
        for c in list(resident):
            n, b, steps = walks[c]
            if pos[c] < len(steps):
                h, m = steps[pos[c]]
                turn = turn_of(m, n)
                if next_turn.get((b, h, m), 0) == turn:
                    next_turn[(b, h, m)] = turn + 1
                    pos[c] += 1
                    progressed = True
            if pos[c] == len(steps):
                resident.remove(c)
                done += 1
                progressed = True
        assert progressed, "deadlock: every resident CTA waits for a turn"
    for (b, h, m), k in next_turn.items():
        assert k == sum(1 for n, bb, steps in walks if bb == b and (h, m) in steps)


@pytest.mark.parametrize("sq,sk", [(333, 777), (777, 333), (1000, 1000), (128, 1024), (200, 200)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spt", [0, 1])
@pytest.mark.parametrize("left,right", [(-1, -1), (250, -1)])
@pytest.mark.parametrize("sms", [1, 3])
@pytest.mark.parametrize("down", [False, True], ids=["up", "walk_down"])
def test_deterministic_turns_complete_with_few_sms(sq, sk, causal, spt, left, right, sms, down):
    """Each CTA walks its group's heads in order and adds each dQ tile at its key tile's turn
    (dq_turn, by key tile only: one contributor per key tile and query head). Simulated on
    `sms` SMs, CTAs resident in launch order: every turn is taken (no CTA waits on a later
    launched one), each dQ tile's adds come in turn order, and all CTAs finish."""
    tile_m, tile_n, group, heads_kv, batch = 64, 128, 3, 2, 1
    num_n = -(-sk // tile_n)
    wl, wr = left >= 0, False
    order = launch_order(num_n, heads_kv, batch, 1, spt)
    walks = []
    for n, hkv, b in order:
        seg = segments(n, tile_m, tile_n, sq, sk, causal, left, right)
        steps = [(hkv * group + hl, m) for hl, m, _ in producer_walk(group, seg, down)]
        walks.append((n, b, steps))
    run_turns(walks, sms, lambda m, n: dq_turn(m, n, tile_m, tile_n, num_n, sq, sk, causal, spt, wl, wr,
                                               max(left, 0), 0))


@pytest.mark.parametrize("sq,sk", [(1000, 1000), (2048, 2048), (333, 777)])
@pytest.mark.parametrize("swizzle", [1, 4, 16])
@pytest.mark.parametrize("sms", [1, 3, 132])
def test_deterministic_atomic_turns_complete_in_wave_sized_groups(sq, sk, swizzle, sms):
    """The deterministic 'atomic' grid (one CTA per key tile, head and batch) with the scheduling
    groups default_launch_order takes for short causal sequences (wave_head_swizzle: up to 16 heads,
    launched key tile by key tile, shortest first): simulated on `sms` SMs, CTAs resident in launch
    order, every dQ turn is taken, in turn order, and every CTA finishes."""
    tile_m, tile_n, heads, batch = 128, 128, 12, 2
    num_n = -(-sk // tile_n)
    walks = []
    for n, h, b in launch_order(num_n, heads, batch, swizzle, 1):
        seg = segments(n, tile_m, tile_n, sq, sk, True, -1, -1)
        walks.append((n, b, [(h, m) for _, m, _ in producer_walk(1, seg)]))
    run_turns(walks, sms, lambda m, n: dq_turn(m, n, tile_m, tile_n, num_n, sq, sk, True, 1))


def gqa(b, sq, sk, hq, hkv, hd=128, causal=True, det=False) -> Problem:
    return Problem(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=hd, head_dim_v=hd,
                   causal=causal, deterministic=det, pass_="bwd", dtype="bf16")


def test_loop_violations():
    mha, grp = gqa(1, 1024, 1024, 8, 8), gqa(1, 1024, 1024, 8, 2)
    loop = BwdConfigSm90(gqa_reduce="loop")
    assert any("gqa_reduce 'loop'" in v and v.kind == "knob combination" for v in violations(loop, mha))
    assert not violations(loop, grp)
    # TMA stores of dK/dV: finished tiles only (not 'atomic' GQA's fp32 sums).
    assert any("dkv_store 'tma'" in v for v in violations(BwdConfigSm90(dkv_store="tma"), grp))
    assert not violations(BwdConfigSm90(dkv_store="tma", gqa_reduce="loop"), grp)
    # The hd64 query tile 128 limits of the deterministic GQA dK/dV locks do not apply to 'loop' (no locks).
    det64 = gqa(1, 1024, 1024, 8, 2, hd=64, det=True)
    t128 = dict(tile_m=128, dq_split="rows", dkv_store="tma")
    sts = dict(tile_m=128, dq_split="head_dim", ds_store="sts")
    assert any("locks" in v for v in violations(BwdConfigSm90(**sts), det64))
    assert not violations(BwdConfigSm90(gqa_reduce="loop", **t128), det64)
    assert not violations(BwdConfigSm90(gqa_reduce="loop", **sts), det64)
    # 'atomic' with the stmatrix dS^T store compiles clean at tile 128 (session 12): feasible, the
    # default where masked (measured in session 13), tile 64 unmasked (not measured).
    atomic128 = BwdConfigSm90(tile_m=128, dq_split="rows")
    assert not violations(atomic128, det64)
    small = gqa(1, 1024, 1024, 8, 2, hd=64, det=True)  # causal, 16 loop CTAs: 'atomic' by the grid floor
    assert default_config(small).gqa_reduce == "atomic" and default_config(small).tile_m == 128
    assert default_config(dataclasses.replace(small, causal=False)).tile_m == 64
    assert default_config(dataclasses.replace(small, deterministic=False, causal=False)).tile_m == 128
    # At Sq = Sk with a grid that fills the machine, deterministic and masked: 'atomic' at 128
    # (Llama-3.2-1B 8k), not 'loop'; Sq << Sk still 'loop'.
    big = gqa(1, 8192, 8192, 32, 8, hd=64, det=True)
    assert (default_config(big).gqa_reduce, default_config(big).tile_m) == ("atomic", 128)
    assert default_config(gqa(1, 2048, 8192, 32, 8, hd=64, det=True)).gqa_reduce == "loop"


ISSUE_SHAPES = {  # (b, sq, sk, hq, hkv): loop CTAs at tile_n 128
    "llama3-8b-8k": ((1, 8192, 8192, 32, 8), 512),
    "qwen2.5-7b-4k": ((2, 4096, 4096, 28, 4), 256),
    "sq2k-sk8k": ((1, 2048, 8192, 64, 8), 512),
    "sq128-sk8k": ((8, 128, 8192, 32, 8), 4096),
}


@pytest.mark.parametrize("name", ISSUE_SHAPES)
@pytest.mark.parametrize("det", [False, True])
def test_default_rule_at_the_issue_shapes(name, det):
    shape, ctas = ISSUE_SHAPES[name]
    prob = gqa(*shape, det=det)
    assert loop_ctas(prob, 128) == ctas
    # The H200's measurements: 'loop' wins where the query range is short against the keys.
    want = "loop" if ctas >= GQA_LOOP_MIN_CTAS and 2 * prob.seqlen_q <= prob.seqlen_k else "atomic"
    assert default_gqa_reduce(prob, 128) == want
    cfg = default_config(prob)
    assert cfg.gqa_reduce == want and not violations(cfg, prob)
    assert cfg.dkv_store == ("tma" if want == "loop" else "direct")
    # Causal: the longest key tiles first unless deterministic (default_launch_order), 'loop' with
    # one K/V head per scheduling group.
    # Deterministic: walking down, longest first with DET_WALK_DOWN_SWIZZLE heads a group where
    # det_walk_down_pays (Llama-3-8B 8k), else shortest first walking up.
    down = det_walk_down_pays(prob, want)
    assert cfg.walk_down == down
    assert cfg.spt_order == (det and not down)
    assert cfg.head_swizzle == (DET_WALK_DOWN_SWIZZLE if down else 1 if det or want == "loop" else 4)


def test_default_rule_is_a_pure_function_of_the_grid():
    assert GQA_LOOP_MIN_CTAS == 264
    for b, sk, hq, hkv in itertools.product((1, 2, 8), (128, 1000, 4096, 8192), (8, 32), (1, 4, 8)):
        prob = gqa(b, 1024, sk, hq, hkv)
        n = -(-sk // 128) * hkv * b
        want = "loop" if hq != hkv and n >= 264 and 2 * 1024 <= sk else "atomic"
        assert default_gqa_reduce(prob, 128) == want
        assert default_config(prob).gqa_reduce == want
        assert not default_config(prob).spt_order  # causal, non-deterministic: longest first
        assert default_config(dataclasses.replace(prob, causal=False)).spt_order  # no effect: the default
    # The split path (hd192/256) counts its 64-row key tiles.
    prob = gqa(1, 1024, 4096, 16, 4, hd=256)
    assert loop_ctas(prob, 64) == 256 and default_config(prob).gqa_reduce == "atomic"
    prob = gqa(2, 1024, 4096, 16, 4, hd=256)
    assert default_config(prob).gqa_reduce == "loop" and not violations(default_config(prob), prob)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(1, 8192, 8192, 32, 8), (2, 4096, 4096, 32, 8), (1, 4096, 4096, 14, 2)])
def test_deterministic_hd64_gqa_tile_where_masked(shape, causal):
    """Deterministic, head_dim 64, GQA at Sq = Sk: 'atomic' (the Sq = Sk rule), at the 128-row
    query tile where masked (the H200, session 13: Llama-3.2-1B 8k 427-447 TFLOP/s against 'loop'
    at 128's 405; 'loop' at 128 had replaced 'atomic' at 64, 379-381, in session 12), at 64
    unmasked (not measured)."""
    prob = gqa(*shape, hd=64, causal=causal, det=True)
    cfg = default_config(prob)
    assert not violations(cfg, prob)
    assert cfg.gqa_reduce == "atomic"
    if causal:
        assert (cfg.tile_m, cfg.dq_split, cfg.ds_store, cfg.dkv_store) == (128, "rows", "stmatrix", "direct")
        # The deterministic order as measured: walking down, longest first with 16 heads a group where
        # a head has 64 key tiles (Llama-3.2-1B 8k, session 31), else shortest first walking up.
        down = prob.seqlen_k >= 8192
        assert det_walk_down_pays(prob, "atomic") == down
        assert (cfg.walk_down, cfg.spt_order, cfg.head_swizzle) == ((True, False, 16) if down else (False, True, 1))
    else:
        assert cfg.tile_m == 64
    assert default_config(gqa(*shape, hd=64, causal=causal)).gqa_reduce == "atomic"  # non-deterministic
    assert default_config(gqa(*shape, hd=128, causal=causal, det=True)).gqa_reduce == "atomic"  # hd128


@pytest.mark.parametrize("det", [False, True])
def test_launch_with_loop_has_no_dkv_accumulators_or_postprocess(bwd_launches, det):
    """launch_bwd with the kernels replaced by recorders (the GPU faked): under 'loop' the main
    kernel gets dK/dV in k's and v's shape and dtype and no dK/dV semaphores, and no dK/dV
    postprocess runs; under 'atomic' it gets the zeroed fp32 accumulators (padded), then the
    postprocess converts them."""
    import torch

    from fa4.sm90 import bwd_launch

    b, sq, sk, hq, hkv, d = 2, 70, 90, 8, 2, 64
    q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(b, hq, sq)
    for reduce in ("atomic", "loop"):
        bwd_launches.calls.clear()
        cfg = BwdConfigSm90(gqa_reduce=reduce)
        dq, dk, dv = bwd_launch.launch_bwd(dout, q, k, v, out, lse, 0.125, True, det, cfg)
        names = bwd_launches.names()
        (main,) = bwd_launches.args("main")
        dk_main, dv_main, sem_q, sem_kv = main[7], main[8], main[9], main[10]
        assert (sem_q is not None) == det
        if reduce == "loop":
            assert names == ["bwd_pre", "main", "bwd_post_dq"]
            assert dk_main is dk and dv_main is dv and dk.dtype == torch.bfloat16 and dk.shape == k.shape
            assert sem_kv is None
        else:
            assert names == ["bwd_pre", "main", "bwd_post_dq", "bwd_post", "bwd_post"]
            assert dk_main.dtype == torch.float32 and dk_main.shape == (b, hkv, 128, d)
            assert (sem_kv is not None) == det


def test_bench_harness_on_cpu(monkeypatch):
    """bench/bench_gqa_loop.py's bench_shape with the GPU faked (tests/fa4/cpu_kernels' forward,
    the backward by its equations, do_bench a single call): each variant is run with the config it
    names, the two reductions compared, 'loop' deterministic checked bitwise, and a row that shows
    the default rule's choice; the reference's failure is reported, not raised."""

    from fa4.sm90 import bwd_launch
    from tests.fa4 import cpu_kernels

    cpu_kernels.install(monkeypatch)
    seen = []

    def fake_bwd(dout, q, k, v, out, lse, softmax_scale=None, causal=False, deterministic=False, config=None):
        seen.append((config.gqa_reduce, config.dkv_store, deterministic))
        scale = softmax_scale or q.shape[3] ** -0.5
        return cpu_kernels.backward_math(dout, q, k, v, scale, causal)

    monkeypatch.setattr(bwd_launch, "flash_attn_bwd", fake_bwd)
    mod = cpu_kernels.bench_module(monkeypatch, "bench_gqa_loop")
    row = mod.bench_shape("tiny", (1, 40, 300, 8, 2, 64), True, device="cpu")
    assert {(r, s) for r, s, _ in seen} == {("atomic", "direct"), ("loop", "tma"), ("loop", "direct")}
    assert {det for *_, det in seen} == {False, True}
    assert row["default"] == "atomic"  # 3 key tiles x 2 K/V heads: far under two waves
    assert row["max_rel_diff_loop_vs_atomic"] == 0.0 and row["loop_det_bitwise"] is True
    flops = Problem(1, 40, 300, 8, 2, 64, 64, causal=True, pass_="bwd").flops
    assert row["loop"] == pytest.approx(flops / 1e9) and "ref" not in row


def lockstep_waits(sq, sk, causal, left, spt, down, tile_m=64, tile_n=128):
    """Steps lost to dQ turns when every CTA of one head starts together and a step's add is
    handed on within the step (in launch order): the CTAs advance one tile a tick, a CTA whose
    turn on its tile has not come waits the tick. The sum over CTAs of the ticks spent waiting (the kernel's model:
    bench/RESULTS.md, session 30)."""
    num_n = -(-sk // tile_n)
    walks = [producer_walk(1, segments(n, tile_m, tile_n, sq, sk, causal, left, -1), down) for n in range(num_n)]
    pos, next_turn, waits = [0] * num_n, {}, 0
    while any(pos[n] < len(walks[n]) for n in range(num_n)):
        taken = {}
        for n in (reversed(range(num_n)) if spt else range(num_n)):  # launch order
            if pos[n] == len(walks[n]):
                continue
            m = walks[n][pos[n]][1]
            turn = dq_turn(m, n, tile_m, tile_n, num_n, sq, sk, causal, spt, left >= 0, False, max(left, 0), 0)
            # Turns already taken this tick count: the previous turn's add is handed on in-step.
            if next_turn.get(m, 0) + taken.get(m, 0) == turn:
                taken[m] = taken.get(m, 0) + 1
                pos[n] += 1
            else:
                waits += 1
        for m, k in taken.items():
            next_turn[m] = next_turn.get(m, 0) + k
    return waits


@pytest.mark.parametrize("sq,sk", [(1024, 1024), (512, 2048), (2048, 1024), (1000, 1000)])
@pytest.mark.parametrize("left", [-1, 300])
def test_walking_down_lets_longest_first_take_its_turns_without_waiting(sq, sk, left):
    """walk_down's reason (bwd_config): the dQ turns follow the launch order. Longest key tiles first
    (spt 0) walking down, every CTA of a head reaches each query tile no earlier than the CTAs whose
    turns come first, as shortest-first (spt 1) walking up does: no step waits. Longest-first
    walking up, the shorter tiles reach each tile first and wait (the reason today's deterministic
    default launches the shortest first)."""
    assert lockstep_waits(sq, sk, True, left, spt=0, down=True) == 0
    assert lockstep_waits(sq, sk, True, left, spt=1, down=False) == 0
    assert lockstep_waits(sq, sk, True, left, spt=0, down=False) > 0
