"""The measured defaults of our Hopper backward: per problem, the feasible config measured best.
fa4.sm90.bwd_config declares the knobs and says which configs are infeasible; this module builds on
it (one way: the declaration never imports its defaults). Each constant carries the measurements it
rests on; a choice not measured says so.
"""

from __future__ import annotations

import dataclasses

from fa4.arch import SM90, Arch
from fa4.problem import Problem
from fa4.sm90.bwd_config import ROWS_PER_WG, SPLIT_HEAD_DIMS, TILE_N, BwdConfigSm90, q_starts_applies, violations

# gqa_reduce 'loop' launches group-factor times fewer CTAs (one per key tile, K/V head and batch),
# each one CTA an SM (its shared memory and registers). Below two waves of the H100 SXM / H200's
# 132 SMs, causal CTAs of unequal length leave SMs idle at the tail: default_config keeps
# 'atomic' there (more, shorter CTAs).
GQA_LOOP_MIN_CTAS = 2 * 132
# ... and only where the query range is short against the keys. Measured on the H200 (session 10,
# bench/bench_gqa_loop.py, causal hd128, loop / atomic): Sq = Sk: Llama-3-8B 8k 0.945, Qwen2.5-7B 4k
# 0.758 (a key tile sees many query tiles: 'atomic''s many short CTAs balance better, and its fp32
# dK/dV traffic is small per step); Sq 2k / Sk 8k 1.040; Sq 128 / Sk 8k (B8) 2.83 (a key tile sees
# one or two query tiles: 'atomic' pays its dK/dV zeroing, fp32 adds and postprocess per head for
# almost no work). Deterministic alike: 0.90 / 0.74 / 1.42 / 3.21.
GQA_LOOP_MAX_Q_OVER_K = 0.5
# (Session 12 made deterministic masked hd64 'loop' at any query range, because deterministic
# 'atomic' could not run tile_m 128 there. Since it can (the stmatrix dS^T store, below), 'atomic'
# at 128 beats 'loop' at 128 at Sq = Sk: H200, session 13, bench/bench_gqa_loop.py, causal, two
# runs, TFLOP/s: Llama-3.2-1B 8k 438 / 427 and 447 / 425 against 405 / 405; B2 4k 376 / 387 and
# 375 / 385 against 375 / 373. The rule above holds again at hd64.)
# One wave of the 132 SMs (one backward CTA an SM): default_launch_order's scheduling groups of a
# short sequence hold about this many CTAs (wave_head_swizzle).
WAVE_CTAS = 132
WAVE_MAX_HEADS = 16  # the most measured
# Deterministic causal hd64 takes wave-sized groups up to this many key tiles a head (S 2k at
# tile_n 128); measured at 8 and 16 (session 32), at 32 it lost.
DET_WAVE_MAX_KEY_TILES = 16
# dk_before_dq by default (session 27, H200, causal S8k, its knob doc): hd256 +19-22%, where one Q/dO
# stage leaves Q's load exposed; at 192 (two stages) within 2%.
DK_BEFORE_DQ_HEAD_DIMS = (256,)
# qm_tile_n 96 by default at head_dim 192 (fa4.sm90.bwd_qm, the reference's tiling there). H200, session
# 27, S8k B2 H10, one run of two interleaved rounds, ours/ref against the keys-on-M default: hd192 causal
# 0.900 -> 0.971 (Q 2 / dO 1 / one P-dS buffer), 0.989 with dk_before_dq; non-causal 0.893 -> 1.004 /
# 1.003; hd192/128 causal 0.906 -> 1.010 (dO one slot), 1.020 (two), 1.013 (one, dk_before_dq). Its GPU
# tests: 136 passed. At 256 the 48-key tile lost to the exchange (1.052 against 1.185 causal, 1.022
# against 1.054 non-causal): off there.
QM_DEFAULT = {192: 96}
# ds_early by default where it won: the H200, session 14, bench/bwd_order.py --variants, two runs,
# ours/ref without -> with: Llama-3.2-1B 8k (hd64, GQA 4) 0.963 -> 0.993 and 0.957 -> 0.971, GPT-2
# 1k (hd64, B16) 0.918 -> 0.937 and 0.918 -> 0.931. At hd128 it lost at every masked shape (causal
# 8k -1 / -2%, Llama-3-8B 8k -4 / -3%, Qwen2.5-7B 4k -3 / -2%, window -2 / -2%; varlen, non-causal
# and Sq 2k / Sk 8k within noise): there the stores ahead of the dV GEMM delay its issue by more
# than the fence's wait they save.
DS_EARLY_HEAD_DIMS = (64,)
# The varlen padded grid walks (sequence, group of head_swizzle heads, key tile), and the key tiles
# past a document's end exit at once but hold an SM slot each (why larger groups help: a reading,
# not measured; the window grid, which has no such tiles, did not move). Measured on the H200 (session 18,
# bench/bwd_order.py --orders default,0:8,0:16,0:32 --shapes varlen-causal, four runs, ours/ref):
# 4 heads a group 0.957 / 0.942 / 0.949 / 0.957, 8 heads 0.969 / 0.968 / 0.963 / 0.969 (+1.2-2.8%),
# 16 heads 0.962 / 0.980 / 0.965 / 0.969, 32 heads 0.959 / 0.956 / 0.955 (three runs). Deterministic
# (shortest first) 8 against 1: 1.044 / 1.038 of the reference's deterministic, one run: kept at 1.
VARLEN_HEAD_SWIZZLE = 8
# q_starts 16 by default where its runs coincide (q_starts_applies) at the head dims measured. H200,
# session 30, bench/bwd_order.py (default / q_starts 16 / 64 of the reference, three runs at hd256):
# hd256 non-causal 1.045 -> 1.152 / 1.147, 1.053 -> 1.157 / 1.155, 1.053 -> 1.174 (16); hd128
# non-causal 0.930 -> 0.952 / 0.954, 0.926 -> 0.941 / 0.940, 0.926 -> 0.951; Sq 2k / Sk 8k causal (GQA
# 'loop') 0.943 -> 0.955 / 0.961, 0.937 -> 0.954 / 0.954, 0.959 -> 0.961. hd64, 96 and 192 and varlen
# unmeasured (varlen's GPU tests pass with it). Query ranges below Q_STARTS_MIN_Q (the shortest
# measured, Sq 2k) keep the plain walk. At Sq 128 / Sk 8k (hd128 GQA 'loop') that is neutral: q_starts
# 1 / 4 / 16 ran 2.609 / 2.598 / 2.632x the reference's backward (H100, session 44, device_s40.sh q).
# Session 43's 2.22 ms fwd+bwd there, which this split answered, came from the nearest-shape rule
# serving an 8k/8k config (store/best.py carry_config), not from q_starts.
Q_STARTS_DEFAULT = 16
Q_STARTS_HEAD_DIMS = (128, 256)
Q_STARTS_MIN_Q = 2048
# walk_down with the longest key tiles first and 16 heads a group by default for the deterministic
# causal backward where it won (det_walk_down_pays). H200, session 30, bench/det_ratio.py, our
# deterministic / our non-deterministic, two runs, today's default (shortest first, walking up, one
# head a group) -> walking down with 8 / 16 / 32 heads a group: causal 8k (B2 H16 hd128) 0.941 ->
# 1.010 / 0.983 and 0.931 -> 0.951 / 0.972 / 0.969; Llama-3-8B 8k (GQA 4:1 'atomic') 0.898 -> 0.912 /
# 0.933 and 0.908 -> 0.915 / 0.937 / 0.909. It lost where a head has fewer key tiles, so that the
# one dQ hand-off per CTA of a wave weighs more against a CTA's walk: Qwen2.5-7B 4k (32 key tiles)
# 0.909 -> 0.858 / 0.863, 0.915 -> 0.861 / 0.869 / 0.821; GPT-2 1k 0.933 -> 0.783 / 0.797 (one run);
# hd64 8k (B2 H32) even: 0.941 -> 0.914 / 0.942 / 0.943 (one run). One head a group walking down lost
# everywhere (causal 8k 0.816). Under GQA 'loop' with seqlen_q < seqlen_k (session 31, three interleaved
# rounds each): Sq 2k / Sk 8k (H64/KV8, each CTA walks the 8 query heads of its K/V head in turn)
# 0.939 -> 0.953 (16 heads a group) / 0.955 (8), 0.967 -> 0.987 / 0.974, one head a group 0.910; an
# H100 0.908 -> 0.933. hd64 under GQA 'atomic', Llama-3.2-1B 8k (H32/KV8): H200 0.899 -> 0.902, 0.891
# -> 0.931, H100 0.876 -> 0.916 (16 heads a group; 8 lost: 0.866, 0.871); hd64 MHA was even (above).
DET_WALK_DOWN_SWIZZLE = 16
# gqa_finish 'last_cta' by default where it won: deterministic GQA 'atomic' at head_dim 128. H100, session
# 33, bench/det_ratio.py --det-variants, two runs, deterministic TFLOP/s with the postprocess -> last_cta:
# Llama-3-8B 8k 496.8 -> 506.0 and 494.6 -> 505.3 (+1.9%, +2.2%), Qwen2.5-7B 4k 439.7 -> 447.1 and 437.7 ->
# 444.8 (+1.7%, +1.6%); at hd64 it lost, Llama-3.2-1B 8k 459.5 -> 443.0 and 450.0 -> 440.9 (-3.6%, -2.0%).
# Non-deterministic it lost everywhere (bench/bwd_order.py, ours/ref, two runs): Llama-3-8B 0.991 -> 0.962
# and 0.981 -> 0.948, Qwen2.5-7B 0.969 -> 0.945 and 0.972 -> 0.946, Llama-3.2-1B 0.989 -> 0.976 and 0.974
# -> 0.969. A reading, not measured apart: the waits it adds (the CTAs between for the first's store, the
# last for all the others) cost more than the memset and the two postprocess passes it saves, where the
# group's CTAs on a key tile finish together; the deterministic turns wait in head order anyway. hd96 and
# the wide head dims are unmeasured.
GQA_FINISH_DET_HEAD_DIMS = (128,)
# ... except with at most this many key tiles a head, where deterministic 'bulk' adds (the postprocess
# path) beat it in every run (H100, session 39, bench/det_ratio.py --det-variants, deterministic
# TFLOP/s last_cta -> bulk): Qwen2.5-7B 4k (32 key tiles) +2.6%, +1.5%, +2.0%, +2.1%; hd128 2k GQA 4:1
# (16) +3.9%, +3.2%. At 64 (Llama-3-8B 8k) even: -0.6%, +0.4%, -1.3%.
DET_BULK_MAX_KEY_TILES = 32
DET_WALK_DOWN_MIN_KEY_TILES = 64
DET_WALK_DOWN_LOOP_MIN_Q = 2048  # 'loop': measured at Sq 2k only


def det_walk_down_pays(problem: Problem, gqa_reduce: str) -> bool:
    """Where the deterministic backward walks down with the longest key tiles first (the comment at
    DET_WALK_DOWN_SWIZZLE): causal, no window, not varlen, at least DET_WALK_DOWN_MIN_KEY_TILES key
    tiles a head, and the layouts it was measured to win with: one CTA a query head at seqlen_q =
    seqlen_k at head_dim 128 (MHA, GQA 'atomic') or 64 under GQA (MHA was even), or gqa_reduce 'loop'
    at DET_WALK_DOWN_LOOP_MIN_Q <= seqlen_q < seqlen_k at head_dim 128 (Sq 2k / Sk 8k). 'loop' at
    seqlen_q = seqlen_k, below 2k queries or at hd64 is unmeasured."""
    d, gqa = (problem.head_dim if problem.head_dim == problem.head_dim_v else 0), problem.heads_q != problem.heads_kv
    if gqa_reduce == "loop":  # (a short query range, e.g. Sq 128 / Sk 8k, is unmeasured)
        measured = d == 128 and DET_WALK_DOWN_LOOP_MIN_Q <= problem.seqlen_q < problem.seqlen_k
    else:
        measured = (d == 128 or (d == 64 and gqa)) and problem.seqlen_q == problem.seqlen_k
    return (problem.deterministic and problem.causal and not problem.has_window and measured
            and not getattr(problem, "varlen", False)
            and problem.seqlen_k // TILE_N >= DET_WALK_DOWN_MIN_KEY_TILES)


def _measured_walks(config: BwdConfigSm90, problem: Problem, arch: Arch) -> BwdConfigSm90:
    """The walk orders measured to pay, on top of a default config, where feasible: q_starts
    (Q_STARTS_DEFAULT, from Q_STARTS_MIN_Q queries) and the deterministic walk down
    (det_walk_down_pays)."""
    if (q_starts_applies(problem) and problem.head_dim in Q_STARTS_HEAD_DIMS
            and problem.seqlen_q >= Q_STARTS_MIN_Q and not getattr(problem, "varlen", False)):
        cand = dataclasses.replace(config, q_starts=Q_STARTS_DEFAULT)
        if not violations(cand, problem, arch):
            config = cand
    if det_walk_down_pays(problem, config.gqa_reduce):
        cand = dataclasses.replace(config, walk_down=True, spt_order=False, head_swizzle=DET_WALK_DOWN_SWIZZLE)
        if not violations(cand, problem, arch):
            config = cand
    return config


def default_config(problem: Problem, arch: Arch = SM90, *, queries_on_m: bool = True) -> BwdConfigSm90:
    """The problem's default: the tiles, rings and launch order of _default_layout, then the walk
    orders measured to pay (_measured_walks) and the GQA finish (_measured_finish)."""
    config = _measured_walks(_default_layout(problem, arch, queries_on_m), problem, arch)
    return _measured_finish(config, problem, arch)


# gqa_add 'bulk' by default where it was measured (non-deterministic GQA 'atomic' with the postprocess,
# dkv_split 'keys', head_dim_v == head_dim, not varlen). H100, session 38, bench/bwd_order.py --variants,
# three rounds a run, ours/ref red -> bulk: Qwen2.5-7B 4k 0.968 -> 0.983, 0.971 -> 0.985, 0.968 -> 0.976;
# hd128 2k GQA 4:1 (B8 H32/KV8) 0.948 -> 0.970; Llama-3.2-1B 8k 1.009 -> 1.025, 1.033 -> 1.025, 1.010 ->
# 1.025; Llama-3-8B 8k 1.014 -> 1.007, 0.990 -> 0.989, 0.984 -> 0.984 (even). Deterministic it is built
# but not the default: mixed (H100, session 39, bench/det_ratio.py --det-variants, deterministic TFLOP/s,
# today's default -> postprocess with 'bulk'): Qwen2.5-7B 4k (last_cta) +2.6%, +1.5%, +2.0%, +2.1%; hd128
# 2k GQA 4:1 (last_cta) +3.9%, +3.2%; Llama-3-8B 8k (last_cta) -0.6%, +0.4%, -1.3%; Llama-3.2-1B 8k
# (postprocess, 'red') -0.3%, -1.0%, -2.6% (bench/RESULTS.md, session 39).
def _measured_finish(config: BwdConfigSm90, problem: Problem, arch: Arch) -> BwdConfigSm90:
    """gqa_finish 'last_cta' where it was measured to pay and is built (GQA_FINISH_DET_HEAD_DIMS);
    elsewhere under GQA 'atomic' the postprocess path's sums, added in bulk where that is built
    (measured above)."""
    gqa_atomic = problem.heads_q != problem.heads_kv and config.gqa_reduce == "atomic"
    det_hd = problem.deterministic and gqa_atomic and problem.head_dim in GQA_FINISH_DET_HEAD_DIMS
    if det_hd and key_tiles(problem, config.tile_n) <= DET_BULK_MAX_KEY_TILES:
        cand = dataclasses.replace(config, gqa_add="bulk")
        if not violations(cand, problem, arch):
            return cand
    if det_hd:
        cand = dataclasses.replace(config, gqa_finish="last_cta")
        if not violations(cand, problem, arch):
            return cand
    if gqa_atomic and config.gqa_finish == "postprocess" and not problem.deterministic:
        cand = dataclasses.replace(config, gqa_add="bulk")
        if not violations(cand, problem, arch):
            return cand
    return config


def _default_layout(problem: Problem, arch: Arch = SM90, queries_on_m: bool = True) -> BwdConfigSm90:
    """Two-deep Q/dO ring, P^T from registers, dS^T by stmatrix, bulk dQ adds, dK/dV out by TMA
    where a CTA stores finished tiles (no GQA, or GQA with gqa_reduce 'loop', which
    default_gqa_reduce picks where its grid fills the machine); query tile 128 at
    hd64 where it fits (not deterministic GQA), its dQ GEMM split by rows, else tile 64; the
    launch order of default_launch_order.

    Measured on the H200 (S=8192, bench/RESULTS.md): at hd64 tile_m 128 with P^T from registers is
    +7.5% (non-causal) / +6% (causal) over 64 (deterministic at tile_m 64 would be 0.84 of the
    tile-128 non-deterministic kernel); dq_split 'rows' +1.4-2.3% / +3.5-3.8% over 'head_dim' at
    that tile; stages 1 loses 12-25% and 3 is within noise; ds_stages 1 is within noise; dq_accum
    'red_v2' loses 8-22%; dkv_store 'tma' over 'direct': +0.2% / +3.7% / +3.3% / +4.8% (hd64, hd64
    causal, hd128, hd128 causal; deterministic alike). At tile_m 128, not deterministic, the row
    statistics by warp shuffles (stat_shuffle: +1-4% at four hd64 shapes on the H100).
    """
    if problem.head_dim in SPLIT_HEAD_DIMS:
        return _default_split(problem, arch, queries_on_m)
    reduce = default_gqa_reduce(problem, TILE_N)
    spt, swizzle = default_launch_order(problem, reduce)
    # Deterministic 'atomic' under GQA takes tile 128 where measured (masked, session 13, above
    # GQA_LOOP_MAX_Q_OVER_K); unmasked it stays at 64 until measured.
    unmeasured = (problem.deterministic and problem.heads_q != problem.heads_kv and reduce == "atomic"
                  and not right_bounded(problem))
    for tm in ((128, 64) if problem.head_dim == 64 and not unmeasured else (64, 128)):
        for st in (2, 1):
            for split in ("rows", "head_dim"):  # 'rows' where violations() allows it (tile_m 128)
                for dkv in ("tma", "direct"):  # 'tma' where violations() allows it (not GQA 'atomic')
                    cand = BwdConfigSm90(
                        tile_m=tm, stages=st, dq_split=split, dkv_store=dkv, head_swizzle=swizzle,
                        gqa_reduce=reduce, spt_order=spt, ds_early=problem.head_dim in DS_EARLY_HEAD_DIMS,
                        stat_shuffle=tm == 128 and not problem.deterministic,
                    )
                    if not violations(cand, problem, arch):
                        return cand
    return BwdConfigSm90(head_swizzle=swizzle, gqa_reduce=reduce, spt_order=spt,
                         ds_early=problem.head_dim in DS_EARLY_HEAD_DIMS)


def key_tiles(problem: Problem, tile_n: int) -> int:
    """Key tiles a head: the CTAs of one head in the 'atomic' grid."""
    return -(-problem.seqlen_k // tile_n)


def loop_ctas(problem: Problem, tile_n: int) -> int:
    """CTAs of the gqa_reduce 'loop' grid: key tiles x K/V heads x batch."""
    return key_tiles(problem, tile_n) * problem.heads_kv * problem.batch


def right_bounded(problem: Problem) -> bool:
    """A right bound cuts the key tiles (causal, or a window's right side): the CTAs' work then
    varies with their key tile, and the launch order decides the tail."""
    return problem.causal or problem.window_right >= 0


def default_launch_order(problem: Problem, gqa_reduce: str) -> tuple[bool, int]:
    """(spt_order, head_swizzle) of the default config.

    Non-deterministic and masked (causal or a window's right bound): the longest key tiles first
    (spt_order False) with 4 heads per scheduling group at head_dim 128, 2 at 64 and 96, 1 with
    dkv_split 'head_dim' (192/256) and under gqa_reduce 'loop' (its groups are K/V heads, each a
    group factor times the work). Measured on the H200 (bench/RESULTS.md, session 11, two runs,
    against spt_order True / head_swizzle 1): causal S8k +4%, Llama-3-8B 8k +4%, Qwen2.5-7B 4k
    +6%, sink +4%, window +1-2%, varlen causal +0.5-1.5% at hd128; hd64 +2%; hd192/256 +3-4%
    (spt alone); Sq 2k / Sk 8k 'loop' loses 3.5% with 4 heads per group. The session 8 finding
    that this was noise (and head_swizzle 4 a 7-14% loss) was an older kernel's. hd96 causal (B2 H21
    S8k, ours / the reference, session 31, three interleaved rounds each): 4 heads a group 0.938 /
    0.953 (H200) / 0.946 (H100), 2 heads 0.966 / 0.957 / 0.953, 1 head 0.962 / 0.961 (the last two).
    Causal with few key tiles a head (not varlen): at least wave_head_swizzle heads, a group of about
    a wave (its docstring has the session 32 measurements: GPT-2 1k +3-4%, hd64 2k +5%).

    Deterministic, 'loop' included: shortest key tiles first (its dQ turns then never wait: the
    first turn of each tile goes to the CTA launched first, while longest-first makes key tile n
    wait ~2n steps per head for key tile 0's adds); non-causal, where every key tile of a head adds
    into the same dQ tiles in turn, 4 (hd64) or 8 (hd >= 96) heads per group (hd64 0.89 -> 0.99 of
    the non-deterministic kernel, hd128 0.947 -> 0.974), causal 1 (8 lost 10% at hd128). Causal hd64
    without GQA at up to DET_WAVE_MAX_KEY_TILES key tiles a head: wave_head_swizzle heads (session 32,
    H200, deterministic / our non-deterministic default, three rounds a run: GPT-2 1k 0.938 -> 0.958,
    0.936 -> 0.955 with 16 heads, and the tuner's study +1.9%; hd64 2k (B8 H16) 0.956 -> 0.975, 0.960 ->
    0.970 with 8). Not at hd96/128 (1k, 2k: +0.1-0.8%) nor at 32 key tiles (hd64 4k, 4 heads: -1.3%),
    and GQA is unmeasured.

    Varlen, non-deterministic, masked, hd128: VARLEN_HEAD_SWIZZLE heads a group (its comment has the
    session 18 measurements).

    Non-deterministic, unmasked: the order only moves L2 reuse; more heads per group lost 1.5-2.5%
    non-causal at S8k: (True, 1), as before (spt_order has no effect there).
    """
    varlen = getattr(problem, "varlen", False)
    if problem.deterministic:
        if problem.causal:
            if (problem.head_dim == 64 and problem.heads_q == problem.heads_kv and not varlen
                    and key_tiles(problem, TILE_N) <= DET_WAVE_MAX_KEY_TILES):
                return True, wave_head_swizzle(problem, TILE_N)
            return True, 1
        return True, (4 if problem.head_dim == 64 else 8)
    if not right_bounded(problem):
        return True, 1
    if gqa_reduce == "loop" or problem.head_dim in SPLIT_HEAD_DIMS:
        return False, 1
    if varlen and problem.head_dim == 128:
        return False, VARLEN_HEAD_SWIZZLE
    heads = 2 if problem.head_dim in (64, 96) else 4
    if problem.causal and not varlen:
        heads = max(heads, wave_head_swizzle(problem, TILE_N))
    return False, heads


def wave_head_swizzle(problem: Problem, tile_n: int) -> int:
    """The most heads, a power of two (and a head_swizzle choice), whose key tiles fit one wave
    (WAVE_CTAS): 16 at 8 key tiles a head, 8 at 16, 4 at 32, 2 at 64.

    A scheduling group launches its CTAs key tile by key tile, so the launch order (longest first,
    or shortest first when deterministic) holds within a group only. With a few key tiles a head,
    groups of 2-4 heads interleave long and short CTAs over the whole grid and the last wave ends
    on the long ones; a group of about a wave orders each wave as a whole. Measured on the H200
    (session 32, ours / the reference, three interleaved rounds a run) against the old 2 heads at
    hd64/96 and 4 at hd128: GPT-2 1k (B16 H12 hd64) +3.9, +3.2, +2.9, +3.1% (16 heads); hd64 2k
    (B8 H16) +4.9, +5.0% (8); hd64 4k (B4 H16) +4.8% (4); hd96 1k (B16 H16) +3.1, +1.8% (16);
    hd128 1k +1.5, +0.4% (16); hd128 2k +1.8%, and GQA 4:1 +0.5% (8). At 64 key tiles a head it
    gives 2, no more than before; below 8 key tiles it stays at WAVE_MAX_HEADS (32 measured as 16 at
    8 key tiles: 0.968 / 0.961 against 0.970 / 0.964)."""
    heads = max(1, WAVE_CTAS // key_tiles(problem, tile_n))
    return min(1 << (heads.bit_length() - 1), WAVE_MAX_HEADS)


def default_gqa_reduce(problem: Problem, tile_n: int) -> str:
    """'loop' under GQA where the query range is at most GQA_LOOP_MAX_Q_OVER_K of the keys and the
    grid has at least GQA_LOOP_MIN_CTAS CTAs, else 'atomic' (also the only value without GQA, and
    varlen's)."""
    if (problem.heads_q == problem.heads_kv or getattr(problem, "varlen", False)
            or problem.seqlen_q > GQA_LOOP_MAX_Q_OVER_K * problem.seqlen_k
            or loop_ctas(problem, tile_n) < GQA_LOOP_MIN_CTAS):
        return "atomic"
    return "loop"


def _default_split(problem: Problem, arch: Arch, queries_on_m: bool = True) -> BwdConfigSm90:
    """head_dim 192: the queries-on-M tiling (QM_DEFAULT). Otherwise (256, or where it does not fit):
    dkv_split 'head_dim' at tile_m 64 (the registers allow no more), the
    deepest Q/dO ring and dS/P^T double buffer the shared memory allows with bulk dQ adds, then
    with per-thread ones: at 192 (and 192/128) that is the full 2/2/bulk kernel; at 256 a
    two-deep ring leaves no room for the 64 KB dQ staging tile, and a two-deep ring with 'red_v2'
    is taken over a one-deep one with 'bulk' (at 64/128 a one-deep ring lost 12-25%, 'red_v2'
    8-22%; not yet measured here)."""
    reduce = default_gqa_reduce(problem, ROWS_PER_WG)
    spt, swizzle = default_launch_order(problem, reduce)
    # (Varlen keeps the 64-key split until the tiling's packed-sequence path has run on a GPU.)
    # (queries_on_m=False: the 64-key split's own default, the exchange's baseline; bench/check_bwd.py.)
    tile = None if getattr(problem, "varlen", False) or not queries_on_m else QM_DEFAULT.get(problem.head_dim)
    if tile:
        # The queries-on-M tiling with the reference's rings: Q two slots, dO one where two do not fit
        # (hd192), one P/dS buffer; dK before dQ where it measured best (hd192: +1.8%).
        same_v = problem.head_dim_v == problem.head_dim
        for dkv in ("tma", "direct"):
            cand = BwdConfigSm90(
                tile_m=64, stages=2, ds_stages=1, dq_accum="bulk", dkv_split="head_dim", dv_operand="smem",
                dkv_store=dkv, head_swizzle=swizzle, gqa_reduce=reduce, spt_order=spt, qm_tile_n=tile,
                do_single=same_v, dk_before_dq=same_v,
            )
            if not violations(cand, problem, arch):
                return cand
    rings = ((2, 2, "bulk"), (2, 1, "bulk"), (2, 2, "red_v2"), (2, 1, "red_v2"), (1, 2, "bulk"), (1, 1, "bulk"))
    # head_dim 256: the 2-CTA dS exchange first where cluster_violations() allows it (session 12,
    # H200, S8k: 293 -> 335 TFLOP/s non-causal, 303 -> 356 causal, the same ring otherwise).
    for exchange in ((True, False) if problem.head_dim == 256 else (False,)):
        for st, ds, acc in rings:
            for dkv in ("tma", "direct"):
                cand = BwdConfigSm90(
                    tile_m=64, stages=st, ds_stages=ds, dq_accum=acc, dkv_split="head_dim", dv_operand="smem",
                    dkv_store=dkv, head_swizzle=swizzle, gqa_reduce=reduce, spt_order=spt,
                    cluster_exchange=exchange, dk_before_dq=problem.head_dim in DK_BEFORE_DQ_HEAD_DIMS,
                )
                if not violations(cand, problem, arch):
                    return cand
    return BwdConfigSm90(tile_m=64, stages=1, ds_stages=1, dkv_split="head_dim", dv_operand="smem",
                         head_swizzle=swizzle, gqa_reduce=reduce, spt_order=spt,
                         dk_before_dq=problem.head_dim in DK_BEFORE_DQ_HEAD_DIMS)
