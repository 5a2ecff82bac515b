"""The knobs of our Hopper backward kernel: one declaration, one feasibility function.

Layout of the main kernel (fa4.sm90.bwd): one CTA per (key tile, head, batch), a producer
warpgroup and two consumer warpgroups looping over the query tiles (under GQA with gqa_reduce
'loop': per K/V head, looping over the group's query heads too). S^T and dP^T are computed
with the keys on the WGMMA M axis. With dkv_split 'keys' each consumer owns 64 key rows of a
128-row tile, and P^T and dS^T come out of the accumulators already in the register layout the
dV and dK WGMMAs take as their A operand (no shared-memory round trip for those two). With
dkv_split 'head_dim' (fa4.sm90.bwd_split; head_dim 192 and 256, where a thread cannot hold dK
and dV over all of head_dim) the two consumers share a 64-row key tile and split the columns.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from fa4.arch import SM90, Arch
from fa4.common.constants import THREADS_PER_WG
from fa4.knobs import RuntimeKnobNames, Violation, knob
from fa4.problem import Problem

HEAD_DIMS = (64, 96, 128, 192, 256)
# head_dim_v != head_dim: as the forward (fa4.sm90.fwd_config.HEAD_DIMS_V), 192 with 128.
HEAD_DIMS_V = {192: (192, 128)}
ROWS_PER_WG = 64
CONSUMER_WGS = 2
TILE_N = CONSUMER_WGS * ROWS_PER_WG
# dkv_split 'head_dim' is built for the head dims where 'keys' cannot hold dK and dV: at 64-128
# it would trade the register operands of dV and dK for shared-memory ones at half the WGMMA N.
SPLIT_HEAD_DIMS = (192, 256)
# Register budget of a consumer thread: setmaxnreg gives the consumers 240 (the producer
# warpgroup keeps 32). Measured with ptxas 13.0 on this kernel, the register allocation of the
# consumer branch does use up to that many (SASS of the hd128 kernel reaches R237 while the
# launch bound is 168). The live state is the WGMMA fragments (see consumer_registers) plus
# addresses, loop and lock state; the overhead per dQ path is what the compile-only sweep
# needed: every configuration within the budget compiles without spills or C7512, and the
# ones just outside it (hd128 with the per-thread dQ reductions: 248) spill.
# This holds only because the swizzled dS^T/P^T store addresses are recomputed in the loop
# (fa4.common.regs.opaque): hoisted, they held 16 registers and hd128 spilled.
CONSUMER_REG_BUDGET = 240
PATH_OVERHEAD = {"bulk": 24, "red_v2": 56, "red": 56}
# The pieces of the smem model (struct order of fa4.sm90.bwd): mbarriers round up to the first
# 1024-byte aligned tile; the row statistics are 128-byte aligned.
# setmaxnreg (consumer, producer): the CTA owns 168 x 384 = 64,512 registers from its launch,
# and setmaxnreg.inc can only hand out what the producer's .dec gave back into that pool:
# 2 x 240 + 24 = 504 per lane-slot x 128 = 64,512. The first version kept 32 for the producer
# (65,536 in all) and hung on the H200: the consumers waited forever for 1,024 registers
# (fa4.common.regs.reg_split_violation; a CPU test checks both kernels' splits).
REG_SPLIT = (240, 24)
SMEM_RESERVED = 2048
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
# Sequence padding of the backward's fp32 side buffers (LSE, D, dQ/dK/dV accumulators; varlen: of
# each sequence's region): a multiple of every tile size, so the main kernel reads and reduces
# whole tiles without bounds checks.
SEQ_PAD = 128
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
# unmeasured (varlen's GPU tests pass with it).
Q_STARTS_DEFAULT = 16
Q_STARTS_HEAD_DIMS = (128, 256)
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


@dataclass(frozen=True)
class BwdConfigSm90:
    tile_m: int = knob(
        (64, 128), 64,
        "Query rows per step of the mainloop (N of S^T = K Q^T, K of dV += P^T dO, M of dQ = dS K). "
        "128 fits the consumer registers only at head_dim 64 with dv_operand 'smem'.",
    )
    stages: int = knob(
        (1, 2, 3), 2,
        "Depth of the Q and dO shared-memory rings (one pipeline state for both: TMA runs this many "
        "query tiles ahead of the consumers).",
    )
    ds_stages: int = knob(
        (1, 2), 2,
        "Shared-memory buffers of dS (the A operand of dQ = dS K, both consumers' halves). With 2, step m+1 "
        "writes the other buffer while step m's dQ WGMMA may still read this one, so one consumer barrier "
        "per step suffices; with 1 the consumers also wait for each other's dQ GEMM before overwriting.",
    )
    ds_store: str = knob(
        ("sts", "stmatrix"), "stmatrix",
        "How each consumer writes its dS^T tile (bf16) into the dQ GEMM's shared operand: 'sts' one 4-byte "
        "store per pair of elements (16 per thread and step at tile_m 64), 'stmatrix' stmatrix.x4, "
        "four 8x8 blocks per instruction (4 per thread and step), as the reference's Hopper backward does "
        "(measured +1.5-2.8% on the four S=8192 shapes).",
    )
    ds_early: bool = knob(
        (False, True), False,
        "dkv_split 'keys': store dS^T into shared memory before the dV GEMM is issued (converted first, then "
        "P^T) instead of after it. The fence and the consumer barrier that follow wait for those stores to "
        "land: issued just before them (False) they were the consumers' top stall after the load waits in "
        "Nsight Compute (hd128 causal, session 13: 3.4% at the fence, 2.6% at the barrier; the reference "
        "issues its dS stores inside the pointwise loop and waits 0.3% there). default_config turns it on at "
        "DS_EARLY_HEAD_DIMS (hd64, where it won 1.5-3% on the H200); at hd128 it lost 1-4% at masked shapes.",
    )
    exp_pin: bool = knob(
        (False, True), False,
        "Keep the exp2 (and softcap tanh) loop ahead of the dP^T GEMM's wait: a never-taken branch before "
        "the wait is a basic-block boundary ptxas does not schedule across. Without it ptxas moves most "
        "MUFU.EX2 below the wait (hd128 causal: 27 of 32 per thread and step in the unmasked loop) to "
        "interleave them with the dS^T arithmetic, so the exponentials no longer run under the GEMM. On the "
        "H200 (session 16) no faster: -1 to -2.5% at five of seven hd64/hd128 shapes. Spills with varlen and "
        "in the hd128 kernel with softcap (violations()).",
    )
    dq_accum: str = knob(
        ("bulk", "red_v2", "red"), "bulk",
        "How dQ tiles reach the fp32 accumulator in global memory: 'bulk' stages the tile in shared "
        "memory and one warp of the producer warpgroup adds it with cp.reduce.async.bulk (it also owns "
        "the deterministic lock wait); 'red_v2' / 'red': each consumer thread issues red.global.add "
        "(.v2.f32 on pairs of adjacent columns, or .f32 per element) and the consumers take the lock.",
    )
    dq_split: str = knob(
        ("head_dim", "rows"), "head_dim",
        "How the two consumer warpgroups share dQ = dS K: 'head_dim' each computes every query row of "
        "half the head_dim columns (WGMMA N = d/2), 'rows' each computes 64 query rows over all of "
        "head_dim (N = d; needs tile_m 128). With 'rows' each warpgroup reads only its own half of dS "
        "from shared memory, and K^T once per 64 rows in wider instructions.",
    )
    dkv_store: str = knob(
        ("direct", "tma"), "direct",
        "How a CTA's dK and dV tiles (bf16/fp16; no GQA, or GQA with gqa_reduce 'loop') reach global memory: 'direct' element by element "
        "from the WGMMA fragment (2-byte stores spread over 8 rows per warp), 'tma' through the K and V "
        "shared tiles (stmatrix, free once both consumers' last GEMMs are done) and one TMA store each.",
    )
    gqa_reduce: str = knob(
        ("atomic", "loop"), "atomic",
        "GQA: how dK and dV are summed over the query heads of a K/V head. 'atomic': one CTA per "
        "(key tile, query head, batch), each adding its fp32 dK/dV tile into zeroed global accumulators "
        "(red.global.add; deterministic: in head order behind a semaphore) that a postprocess converts. "
        "'loop': one CTA per (key tile, K/V head, batch) walks the group's query heads (head-major, then "
        "the query tiles), keeps dK/dV in registers across the whole group and stores them once in the "
        "output dtype: no fp32 accumulators, zeroing, locks or postprocess for dK/dV, K/V loaded once "
        "per group, deterministic by construction. It pays where the loop grid, group factor times "
        "fewer CTAs, still fills the machine (default_config takes it from GQA_LOOP_MIN_CTAS CTAs); "
        "'atomic' spreads a small grid over more SMs. Not a knob without GQA (one head per group).",
        applies=lambda problem: problem.heads_q != problem.heads_kv,
    )
    gqa_finish: str = knob(
        ("postprocess", "last_cta"), "postprocess",
        "GQA with gqa_reduce 'atomic': who turns the fp32 dK/dV sums into the output. 'postprocess': the "
        "accumulators are zeroed before the main kernel (a memset of batch x heads_kv x seqlen_k x (d + dv) x 4 "
        "B), every CTA of a group adds its tile, and two postprocess kernels convert them. 'last_cta': per "
        "(key tile, K/V head) the first CTA of the group to finish stores its tile (no zeroing), the later ones "
        "add theirs, and the last reads the sum, adds its own in registers and writes dK/dV in the output dtype: "
        "no memset, no postprocess, no launches for them. Non-deterministic: the order is the CTAs' arrival "
        "(one int32 ticket counter a tile, zeroed); deterministic: the head order of the semaphore turns. "
        "A CTA waits only for CTAs that took a ticket (or turn) before it, so it cannot wait on one that "
        "has not launched. Not with qm_tile_n (transposed accumulators) or varlen (not built). The default "
        "for deterministic GQA 'atomic' at head_dim 128, where it won 1.6-2.2%; non-deterministic it lost 0.5-3.4% "
        "(GQA_FINISH_DET_HEAD_DIMS).",
        applies=lambda problem: problem.heads_q != problem.heads_kv,
        # gqa_reduce 'loop' stores finished tiles: no sums to finish (a default's 'last_cta' carried
        # over to 'loop' stays feasible, the same kernel).
        inert=lambda config: config.gqa_reduce == "loop",
    )
    dkv_split: str = knob(
        ("keys", "head_dim"), "keys",
        "How the two consumer warpgroups share the dK and dV GEMMs: 'keys' each owns 64 rows of a 128-key "
        "tile and computes dK/dV over all of head_dim with P^T and dS^T from its registers; 'head_dim' both "
        "work on one 64-key tile, each computes S^T/dP^T for half the query tile and dK/dV for half the "
        "columns, with P^T and dS^T exchanged through shared memory (fa4.sm90.bwd_split): half the dK/dV "
        "registers, for head_dim 192 and 256 (needs dv_operand 'smem').",
    )
    dv_operand: str = knob(
        ("rmem", "smem"), "rmem",
        "Where the dV WGMMA reads P^T: 'rmem' straight from the registers it was computed in, 'smem' "
        "from a shared-memory copy (a store and a warpgroup barrier per step, 16-bit P^T not live "
        "beside S^T and dP^T: fewer registers).",
    )
    cluster_exchange: bool = knob(
        (False, True), False,
        "dkv_split 'head_dim' (head_dim 192/256) only: launch the CTAs of key tiles 2p and 2p+1 as a cluster "
        "of two walking the same query tiles in lockstep; each copies its dS tile into its peer's shared "
        "memory (distributed shared memory, one bulk copy per step, cluster-scope mbarriers), and CTA r "
        "computes dQ for the columns [r d/2, (r+1) d/2) over both key tiles (K reduction 128, the peer's "
        "K columns loaded once): half the fp32 dQ reductions per CTA (fa4.common.bwd_pair). It pays where "
        "those reductions bound the step: head_dim 256 (64 KiB per step at tile_m 64), +14% non-causal and "
        "+17% causal on the H200, the default there (default_config); at 192 and 192/128 it loses 6-9% "
        "(the peer's K slice and dS buffers take the second dS buffer's room). Not with varlen, "
        "gqa_reduce 'loop', deterministic mode, a window or softcap (cluster_violations).",
    )
    stat_shuffle: bool = knob(
        (False, True), False,
        "tile_m 128 (head_dim 64): how a thread gets the LSE and D of its 32 query columns each step. False: "
        "one shared-memory load per column pair, issued after the GEMM waits (32 registers a statistic "
        "would not fit beside S^T and dP^T: prefetched they spilled, and 16 of them lost 8% on the H200). "
        "True: the 8 lanes of a warp that share their columns split them, each loading 4 LSE while the "
        "S^T GEMM runs and 4 D while dP^T runs, and take the rest by warp shuffles (the reference's hd64 "
        "layout: 64 SHFL a step instead of 32 late loads). At tile_m 64 the 16 columns are prefetched "
        "whole either way. default_config turns it on where tile_m is 128 and the backward is not "
        "deterministic: H100, session 37, bench/bwd_order.py --variants, ours/ref off -> on, two runs of three "
        "rounds: GPT-2 1k 0.958 -> 0.971, 0.955 -> 0.970; Llama-3.2-1B 8k 1.014 -> 1.023, 0.982 -> 1.024; hd64 "
        "8k B2 H32 0.993 -> 1.032, 0.977 -> 1.004; hd64 2k 0.990 -> 0.998, 0.990 -> 1.011. Deterministic "
        "(bench/det_ratio.py --det-variants) it did not pay reliably: Llama-3.2-1B -2.3%, -1.5%; hd64 8k "
        "-3.2%, +2.8%; GPT-2 +1.0%, 0.0%.",
        applies=lambda problem: problem.head_dim == 64,
        # Declared after the knobs that decide the layout: tile_m 128 runs only with 'bulk' dQ adds,
        # dkv_split 'keys' and no exchange (head_dim 64: violations()), so the other value is
        # enumerated only there (the declaration walk of tests/fa4/test_knob_applies.py grows by 1/24).
        requires=lambda k: (k["tile_m"] == 128 and k["dq_accum"] == "bulk" and k["dkv_split"] == "keys"
                            and not k["cluster_exchange"]),
    )
    dp_first: bool = knob(
        (False, True), False,
        "dkv_split 'head_dim' (head_dim 192/256): issue dP^T = V dO^T before S^T = K Q^T, and load a step's dO "
        "before its Q. With one Q/dO stage (hd256: shared memory is full) Q's slot frees only at the end of a "
        "step, and the next step's first GEMM needed it at once: its load (32 KB at hd256) was the consumers' "
        "largest stall in Nsight Compute (session 25). First, dP^T runs while Q arrives; the exponentials then "
        "wait for both GEMMs instead of running under dP^T (small at these head dims).",
        applies=lambda problem: problem.head_dim in SPLIT_HEAD_DIMS,
    )
    dk_before_dq: bool = knob(
        (False, True), False,
        "dkv_split 'head_dim' (head_dim 192/256): issue dK += dS^T Q before dQ = dS K (after dV), so Q's slot "
        "frees once dV and dK are done and the next Q loads under the dQ GEMM (with cluster_exchange dK also "
        "runs before the wait for the peer's dS). dQ then leaves for its accumulator after its own GEMM, "
        "not under dK's. On the H200 (session 27, causal S8k, two runs, ours/ref): hd256 0.990 -> 1.181 and "
        "0.989 -> 1.206 (dp_first 1.088 / 1.081, both 1.189 / 1.193): the default there (DK_BEFORE_DQ_HEAD_DIMS); "
        "hd192 0.886 -> 0.890 and 0.879 -> 0.876, hd192/128 0.893 -> 0.911 and 0.884 -> 0.902 (two Q/dO "
        "stages there: no exposed load to hide).",
        applies=lambda problem: problem.head_dim in SPLIT_HEAD_DIMS,
    )
    qm_tile_n: int = knob(
        (0, 48, 64, 96), 0,
        "dkv_split 'head_dim' (head_dim 192/256): 0 computes S^T = K Q^T with the keys on the WGMMA M (a 64-key "
        "tile, fa4.sm90.bwd_split); 48/64/96 is the reference's wide-head tiling (fa4.sm90.bwd_qm): S = Q K^T with "
        "the 64 queries on M and the two consumers side by side on this many keys, dK^T += Q^T dS and dV^T += "
        "dO^T P with the head dim on M (swap-AB: a CTA holds dK/dV of tile_n keys over all of head_dim in "
        "tile_n (d + dv) / 256 registers a thread), dQ = dS K as before. A CTA then loads each Q/dO tile for "
        "1.5x the keys at 96, which moves the step from shared-memory bound to tensor bound (session 15's "
        "arithmetic).",
        applies=lambda problem: problem.head_dim in SPLIT_HEAD_DIMS,
        requires=lambda k: (k["dkv_split"] == "head_dim" and k["dv_operand"] == "smem" and k["tile_m"] == ROWS_PER_WG
                            and not k["cluster_exchange"]),
    )
    do_single: bool = knob(
        (False, True), False,
        "qm_tile_n only: one dO slot while Q has `stages` (the reference's hd192/256 rings: Q 2, dO 1): dO is "
        "released after the dV and dQ GEMMs and first needed by the second GEMM of the next step, so its "
        "load hides where Q's would not; the room pays for Q's second slot.",
        applies=lambda problem: problem.head_dim in SPLIT_HEAD_DIMS,
        inert=lambda config: config.stages == 1,
        requires=lambda k: k["qm_tile_n"] > 0,
    )
    gqa_add: str = knob(
        ("red", "bulk"), "red",
        "GQA 'atomic' with gqa_finish 'postprocess': how a CTA adds its fp32 dK/dV tiles into the group's sums. "
        "'red': each consumer thread adds its fragment with red.global.add (column pairs), into row-major "
        "sums: tile_n x d / 2 reductions per tensor, 8 rows under every warp instruction. 'bulk': the "
        "consumers stage both tiles in shared memory that the last GEMMs have freed (dK over K and V, dV "
        "over the Q/dO rings, or over K and V after dK's reduction where the rings are smaller) in the dQ "
        "accumulator's fragment order, and one thread adds each with one "
        "cp.reduce.async.bulk (the reference's way, and our dQ's); the sums are then fragment-ordered "
        "tiles and the dQ postprocess converts them; deterministic, one thread takes the tile's turn and "
        "stores (first head) or adds both tiles, and passes the turn once they are performed. Not varlen, "
        "dkv_split 'head_dim' or head_dim_v != head_dim (not built).",
        applies=lambda problem: problem.heads_q != problem.heads_kv,
        inert=lambda config: config.gqa_reduce == "loop" or config.gqa_finish != "postprocess",
        # Declared after the knobs it depends on, so its other value is enumerated only where it is built.
        requires=lambda k: (k["gqa_reduce"] == "atomic" and k["gqa_finish"] == "postprocess"
                            and k["dkv_split"] == "keys" and k["qm_tile_n"] == 0),
    )
    varlen_grid: str = knob(
        ("padded", "compact"), "padded",
        "Varlen only: how key tiles map to CTAs. 'padded' launches sequences x the longest sequence's key "
        "tiles x heads, and the CTAs past a shorter sequence's end exit at once (half the grid for 8 documents "
        "of 512-4096 keys, each still an SM slot: the backward runs one CTA an SM). 'compact' launches "
        "(total_k // tile_n + sequences) x heads: sequence b's tiles start at (cu_seqlens_k[b] + b tile_n) // "
        "tile_n, and a CTA finds its sequence by a binary search over cu_seqlens_k (fa4.common.varlen.tile_sequence), "
        "at most one spare CTA a sequence and head.",
        applies=lambda problem: getattr(problem, "varlen", False),
    )
    spt_order: bool = knob(
        (True, False), True,
        "Masked (causal, a window's right bound): launch the shortest key tiles (highest n_block) first and "
        "give them the first dQ turns (shortest processing time first), so deterministic lock waits stay "
        "short; False launches the longest first, the shorter tail the non-deterministic kernels want "
        "(default_launch_order). Without a mask every key tile does the same work.",
        runtime=int,  # the kernel's spt flag
    )
    mask_bits: bool = knob(
        (False, True), False,
        "Causal and windowed problems: each key row's verdicts over its query columns in a masked step as "
        "32-bit words (the visible queries of a key are a run in the accumulator's column order, its length "
        "arithmetic on the diagonal) tested bit by bit, which ptxas turns into R2P, seven predicates an "
        "instruction, instead of one compare per element. Measured on the H200 (session 23): "
        "0.98-1.00x of the default at five causal and windowed shapes, so off (fa4.common.masking).",
        applies=lambda problem: problem.causal or problem.has_window,
    )
    q_starts: int = knob(
        (1, 4, 16, 64), 1,
        "Non-deterministic: where each CTA begins the run of unmasked query tiles it walks. Where those runs "
        "coincide (no causal or window bound; with one, the key tiles left of the diagonal when seqlen_q < "
        "seqlen_k) the CTAs that run together (a wave holds one to two heads' key tiles) add their dQ tiles "
        "into the same accumulator tile at the same step with 1; with s, key tile n (cluster_exchange: its "
        "pair) starts (n mod s) / s of the way into its run and wraps (fa4.common.bwd_schedule.walk_tile), so "
        "the adds of a step land on s tiles; masked tiles keep their places. Elsewhere a causal or window "
        "bound spreads the runs already. Deterministic dQ turns follow the launch order, which a shifted "
        "start would serialize: not there. default_config takes 16 at head_dim 128 and 256 (H200: hd256 "
        "non-causal +10-11%, hd128 +1.6-2.7%, Sq 2k / Sk 8k causal +0.2-1.8%; Q_STARTS_DEFAULT).",
        applies=lambda problem: q_starts_applies(problem),
    )
    walk_down: bool = knob(
        (False, True), False,
        "Causal or windowed: each CTA walks its query tiles from the last down to the first (the diagonal's "
        "masked tiles last) instead of up from the diagonal. Meant for the deterministic backward with the "
        "longest key tiles first (spt_order False): its dQ turns follow the launch order (fa4.common."
        "bwd_schedule.dq_turn), and walking down every key tile of a head reaches a query tile at the same "
        "walk position; walking up, a shorter key tile reaches it steps before the longer ones whose turns "
        "come first, and waits (so today's deterministic default launches the shortest first, 4-6% slower "
        "than longest-first in the non-deterministic kernels). Not with q_starts, which permutes the walk too. "
        "default_config walks down, longest first with 16 heads a group, where it won on the H200 "
        "(det_walk_down_pays: deterministic causal with >= 64 key tiles a head at hd128 or hd64 under GQA "
        "'atomic' with seqlen_q = seqlen_k, and hd128 'loop' with seqlen_q < seqlen_k; +2-5%); with fewer "
        "key tiles the one dQ hand-off per CTA of a wave weighs more and it lost (Qwen2.5-7B 4k -5%).",
        applies=lambda problem: problem.causal or problem.has_window,
        requires=lambda k: k["q_starts"] == 1,
    )
    head_swizzle: int = knob(
        (1, 2, 4, 8, 16, 32), 1,
        "Heads per scheduling group: consecutive CTAs walk the key tiles of this many heads together so "
        "their Q/dO stay resident in L2. A group launches key tile by key tile, so spt_order's order holds "
        "within it: with few key tiles a head default_config takes a group of about a wave "
        "(wave_head_swizzle; GPT-2 1k +3-4%).",
        runtime=True,
    )

    RUNTIME_KNOBS = RuntimeKnobNames()
    # Fields of older declarations that were not knobs; stored rows and REST posts that still
    # name them are read without them (store migration 0005 rewrote the stored ones).
    RETIRED_KNOBS: ClassVar[dict[str, str]] = {
        "deterministic": "restated the problem: the problem's deterministic flag decides",
        "sdp_swap_ab": "single-valued (True): S^T and dP^T are always computed with the keys on M",
        "tile_n": f"single-valued ({TILE_N}), now derived: 128 with dkv_split 'keys', 64 with 'head_dim'",
    }

    @property
    def tile_n(self) -> int:
        """Key rows per CTA: 64 per consumer warpgroup (the WGMMA M of S^T, dV and dK) with
        dkv_split 'keys', one shared 64-row tile with 'head_dim', qm_tile_n where that is on."""
        if self.qm_tile_n:
            return self.qm_tile_n
        return TILE_N if self.dkv_split == "keys" else ROWS_PER_WG

    @property
    def do_stages(self) -> int:
        """Depth of the dO ring: the Q ring's (stages), or one with do_single."""
        return 1 if self.do_single else self.stages


def q_starts_applies(problem: Problem) -> bool:
    """Whether CTAs' runs of unmasked query tiles coincide (q_starts' case): not deterministic, no
    left window bound, and no right bound (causal included) or seqlen_q < seqlen_k, where every key
    tile left of the diagonal sees all query tiles. (A right bound at seqlen_q = seqlen_k starts
    each key tile's run at its own diagonal tile.)"""
    if problem.deterministic or problem.window_left >= 0:
        return False
    return not (problem.causal or problem.window_right >= 0) or problem.seqlen_q < problem.seqlen_k


def smem_bytes(config: BwdConfigSm90, problem: Problem) -> int:
    elt = 2
    d = problem.head_dim
    q = config.stages * config.tile_m * d * elt
    do = config.do_stages * config.tile_m * problem.head_dim_v * elt
    stats = (config.stages + config.do_stages) * config.tile_m * 4  # LSE and D rows beside Q and dO
    kv = config.tile_n * (d + problem.head_dim_v) * elt
    ds = config.ds_stages * config.tile_m * config.tile_n * elt
    # cluster_exchange: a CTA stages and adds only its half of dQ's columns.
    dq_cols = d // 2 if config.cluster_exchange else d
    dq = config.tile_m * dq_cols * 4 if config.dq_accum == "bulk" else 0
    # P^T: one buffer per dS buffer under dkv_split 'head_dim' (both consumers read all of it).
    p_bufs = config.ds_stages if config.dkv_split == "head_dim" else 1
    p = p_bufs * config.tile_m * config.tile_n * elt if config.dv_operand == "smem" else 0
    # cluster_exchange: the peer's K tile in this CTA's dQ columns (the B operand of the peer
    # half of the reduction, loaded once) and the peer's dS tiles, one per dS buffer.
    peer = 0
    if config.cluster_exchange:
        peer = config.tile_n * (d // 2) * elt + config.ds_stages * config.tile_m * config.tile_n * elt
    return q + do + kv + ds + dq + p + peer + stats + SMEM_RESERVED


def consumer_registers(config: BwdConfigSm90, problem: Problem) -> int:
    """Registers a consumer thread needs at the peak of a mainloop step.

    Fragments (fp32-register units): the dK and dV accumulators (64 key rows x head_dim each)
    beside S^T (P^T in fp32, kept for dS) and dP^T (64 x tile_m each): the peak, during the two
    pointwise loops. P^T and dS^T are converted to 16 bits only after both loops, when the fp32
    tiles die, and the dQ accumulator comes later still, so none of them adds to the peak. Plus
    the overhead of the dQ path: 'red_v2'/'red' keep global addresses (and, deterministic, the
    lock) in the consumers, 'bulk' hands both to the writer warps.
    """
    per_thread = ROWS_PER_WG / THREADS_PER_WG
    consumers = CONSUMER_WGS * THREADS_PER_WG
    if config.qm_tile_n:
        # qm_tile_n (fa4.sm90.bwd_qm): dK^T and dV^T (head_dim x tile_n each) over the 256
        # consumers, beside S and dP (tile_m x tile_n each) in the pointwise loops, or beside the
        # dQ accumulator (tile_m x d) after them.
        dkv = config.tile_n * (problem.head_dim + problem.head_dim_v) / consumers
        sdp = 2 * config.tile_m * config.tile_n / consumers
        dq = config.tile_m * problem.head_dim / consumers
        return int(math.ceil(dkv + max(sdp, dq))) + PATH_OVERHEAD[config.dq_accum]
    if config.dkv_split == "head_dim":
        # Each consumer: dK and dV over half the columns, S^T and dP^T over half the queries. The
        # dQ accumulator (tile_m x d over 256 threads) beside dK/dV can then be the larger peak.
        dkv = per_thread * (problem.head_dim + problem.head_dim_v) / 2
        sdp = per_thread * config.tile_m
        # (cluster_exchange: over half the columns, the other half is the peer CTA's.)
        dq_cols = problem.head_dim / 2 if config.cluster_exchange else problem.head_dim
        dq = config.tile_m * dq_cols / (2 * THREADS_PER_WG)
        return int(math.ceil(dkv + max(sdp, dq))) + PATH_OVERHEAD[config.dq_accum]
    dkv = per_thread * (problem.head_dim + problem.head_dim_v)
    sdp = 2 * per_thread * config.tile_m
    return int(math.ceil(dkv + sdp)) + PATH_OVERHEAD[config.dq_accum]


def violations(config: BwdConfigSm90, problem: Problem, arch: Arch = SM90) -> list[str]:
    """Why this config cannot run this problem on this arch (empty list = feasible)."""
    out: list[str] = []
    if arch.name != "sm90":
        out.append(Violation("problem", f"BwdConfigSm90 targets sm90, not {arch.name}"))
    if problem.pass_ != "bwd":
        out.append(Violation("problem", "BwdConfigSm90 tunes the backward pass only"))
    if problem.head_dim not in HEAD_DIMS:
        out.append(Violation("problem", f"head_dim {problem.head_dim} not supported (supported: {HEAD_DIMS})"))
    dvs = HEAD_DIMS_V.get(problem.head_dim, (problem.head_dim,))
    if problem.head_dim_v not in dvs:
        out.append(Violation("problem", f"head_dim_v {problem.head_dim_v} not supported with head_dim "
                             f"{problem.head_dim} (supported: {dvs})"))
    if config.ds_early and config.dkv_split != "keys":
        out.append(Violation("knob combination",
                             "ds_early orders the dS^T store of dkv_split 'keys'; 'head_dim' publishes P^T and "
                             "dS^T together before its GEMMs (fa4.sm90.bwd_split)"))
    if config.dkv_split == "head_dim":
        if problem.head_dim not in SPLIT_HEAD_DIMS:
            out.append(Violation("knob combination",
                                 f"dkv_split 'head_dim' is built for head_dim {SPLIT_HEAD_DIMS}, not {problem.head_dim} "
                                 "('keys' holds dK/dV there with P^T and dS^T as register operands)"))
        if config.dv_operand != "smem":
            out.append(Violation("knob combination",
                                 "dkv_split 'head_dim' reads P^T from shared memory (both consumers need all of it): "
                                 "dv_operand 'smem'"))
    for name in ("dp_first", "dk_before_dq"):
        if getattr(config, name) and config.dkv_split != "head_dim":
            out.append(Violation("knob combination",
                                 f"{name} orders the GEMMs of dkv_split 'head_dim' (head_dim 192/256), where one "
                                 "Q/dO stage leaves Q's load exposed; not built for 'keys'"))
    if config.stat_shuffle and (config.tile_m != 128 or problem.head_dim != 64):
        out.append(Violation("knob combination", "stat_shuffle splits the 32 query columns of tile_m 128, which "
                             "fits head_dim 64 only; at tile_m 64 the statistics are prefetched whole"))
    elif config.stat_shuffle and not (config.ds_store == "stmatrix" and config.ds_early and config.dv_operand == "rmem"
                                      and config.stages == 2 and config.ds_stages == 2
                                      and config.gqa_finish == "postprocess" and not config.mask_bits):
        # Its 8 share registers beside tile_m 128's: session 37's compile cover spilled 1-6 registers with
        # P^T through shared memory and 'sts' stores, a one-deep dS ring under the in-kernel GQA finish,
        # and a three-deep Q/dO ring (deterministic); and with the dS^T store after the dV GEMM (ds_early
        # off: 1-2 registers, or WGMMA serialized), and with mask_bits (ptxas serialized the WGMMA: C7512).
        # Only the default's layout (ds_early on, mask_bits off) was compiled clean over causal, GQA,
        # deterministic, dq_split, dkv_store, exp_pin and the features.
        out.append(Violation("registers", "stat_shuffle is built with the stmatrix dS^T store issued early (ds_early), "
                             "P^T from registers, two-deep Q/dO and dS rings, gqa_finish 'postprocess' and mask_bits "
                             "off only (elsewhere it spills or ptxas serializes the WGMMA)"))
    if config.dp_first and config.exp_pin:
        out.append(Violation("knob combination",
                             "exp_pin keeps the exponentials under the dP^T GEMM; with dp_first they wait for "
                             "S^T, the later GEMM, and nothing runs under either"))
    out += qm_violations(config, problem)
    out += cluster_violations(config, problem)
    if config.tile_m % ROWS_PER_WG:
        out.append(Violation("tile shape", f"tile_m {config.tile_m} must be a multiple of 64 (the WGMMA M of dQ = dS K)"))
    need = smem_bytes(config, problem)
    if need > arch.smem_per_cta:
        out.append(Violation(
            "shared memory",
            f"shared memory {need} B (Q, dO {config.stages}x {config.tile_m}x"
            f"{problem.head_dim}, K/V {config.tile_n}x{problem.head_dim}, dS) exceeds {arch.smem_per_cta} B")
        )
    gqa = problem.heads_q != problem.heads_kv
    if config.dkv_store == "tma" and gqa and config.gqa_reduce == "atomic":
        out.append(Violation("knob combination",
            "dkv_store 'tma' stores finished dK/dV tiles: under GQA with gqa_reduce 'atomic' they are fp32 "
                   "sums over the query heads, added with reductions (gqa_reduce 'loop' stores them)"))
    if config.gqa_finish != "postprocess" and not gqa:
        out.append(Violation("knob combination",
                             f"gqa_finish '{config.gqa_finish}' finishes the fp32 dK/dV sums of GQA; without GQA "
                             "there are none"))
    if config.gqa_finish != "postprocess" and gqa and config.gqa_reduce == "atomic":
        if config.qm_tile_n:
            out.append(Violation("knob combination",
                                 f"gqa_finish '{config.gqa_finish}' with qm_tile_n: not built (its dK^T/dV^T fragments "
                                 "and partial key tiles take the postprocess)"))
        if getattr(problem, "varlen", False):
            out.append(Violation("knob combination", f"gqa_finish '{config.gqa_finish}' with varlen: not built"))
        if problem.head_dim == 128 and config.ds_stages == 1 and config.ds_store == "sts":
            # Session 37's compile cover (ptxas 13.0): hd128 non-causal GQA 'last_cta', tile_m 64, the
            # per-element dS^T stores into a one-deep dS ring, 'direct': 1 register spilled (stages 2 with
            # exp_pin, and stages 3).
            out.append(Violation("registers", f"gqa_finish '{config.gqa_finish}' at head_dim 128 with a one-deep dS ring "
                                 "and the per-element dS^T stores spills (use ds_store 'stmatrix' or ds_stages 2)"))
        if config.dkv_split == "head_dim" and config.dq_accum != "bulk":
            # The compile sweep (ptxas 13.0, session 33): hd256 with the per-thread dQ reductions spilled
            # 1 register in 3 of its 3 kernels (the finish's branches beside the reduction addresses).
            out.append(Violation("registers", f"gqa_finish '{config.gqa_finish}' with dkv_split 'head_dim' and dq_accum "
                                 f"'{config.dq_accum}' spills (use dq_accum 'bulk')"))
    if config.gqa_add == "bulk":
        built = {
            "GQA": gqa, "gqa_finish 'postprocess'": config.gqa_finish == "postprocess",
            "dkv_split 'keys'": config.dkv_split == "keys" and not config.qm_tile_n,
            "not varlen": not getattr(problem, "varlen", False),
            "head_dim_v == head_dim": problem.head_dim_v == problem.head_dim,
        }
        missing = [k for k, ok in built.items() if not ok]
        # Inert (the same kernel) where GQA's sums are not the postprocess path's: 'loop' or 'last_cta'.
        if missing and not (gqa and (config.gqa_reduce == "loop" or config.gqa_finish != "postprocess")):
            out.append(Violation("knob combination", "gqa_add 'bulk' stages the fp32 dK/dV tiles of GQA 'atomic' in shared "
                                 "memory for one bulk reduction each; built for " + ", ".join(built) + " only (here not: "
                                 + ", ".join(missing) + ")"))
    if config.gqa_reduce == "loop" and not gqa:
        out.append(Violation("knob combination",
            "gqa_reduce 'loop' walks the query heads of a K/V head: without GQA there is one ('atomic' "
                   "is the same kernel)"))
    if config.dq_split == "rows" and config.tile_m != 2 * ROWS_PER_WG:
        out.append(Violation("knob combination", f"dq_split 'rows' gives each consumer warpgroup 64 query rows: needs tile_m 128, not {config.tile_m}"))
    if config.tile_m == 128:
        # At 128 query columns the consumers run within a few registers of the budget, and
        # ptxas spills 1-8 of them for some combinations. The combinations allowed here are
        # those the full compile sweep (hd64 x every dv_operand, ds_stages, stages,
        # deterministic, GQA, causal; ptxas 13.0) found clean in every case.
        why = None
        if config.dq_accum != "bulk":
            why = f"dq_accum '{config.dq_accum}' keeps per-thread reduction addresses (needs 'bulk')"
        elif config.dv_operand == "rmem":
            if config.dq_split == "rows" and config.ds_store == "sts":
                # The sweep of dq_split 'rows' (50 kernels): 11 of the 18 with per-element dS^T
                # stores spilled 1-2 registers (their swizzled addresses), none with stmatrix.
                why = "P^T from registers, dq_split 'rows' and the per-element dS^T stores (use ds_store 'stmatrix')"
            elif config.ds_store == "sts" and config.dkv_store == "tma":
                # The sweep of dkv_store 'tma' (404 kernels): 3 of these 12 spilled 1-2 registers.
                why = "P^T from registers, the per-element dS^T stores and dkv_store 'tma' (use ds_store 'stmatrix')"
            elif problem.deterministic and gqa and config.gqa_reduce == "atomic" and config.ds_store == "sts":
                # Session 12's compile (ptxas of nvidia-cutlass-dsl 4.8.1, hd64 GQA): with the
                # stmatrix dS^T store all 8 plain kernels and those with a window, sink or varlen
                # are clean; with 'sts' 6 of 8 spill 1-3 registers.
                why = "P^T from registers, the per-element dS^T stores and the deterministic GQA dK/dV locks (use ds_store 'stmatrix')"
            elif config.stages < 2:
                why = "P^T from registers with a one-deep Q/dO ring"
            elif problem.deterministic and config.ds_store == "sts" and config.stages > 2:
                # Session 33's CI (the cover moved with the new knob): hd64 MHA, non-causal, stages 3,
                # ds_stages 1, 'sts', dq_split 'head_dim', 'direct': 1 register spilled.
                why = "P^T from registers, deterministic, the per-element dS^T stores and a three-deep ring"
        elif config.ds_stages != 1 or config.stages != 1:
            why = "P^T through shared memory needs ds_stages 1 and stages 1 (the second buffers' offsets)"
        elif problem.deterministic and config.ds_store == "sts" and config.ds_early:
            # Session 33's CI: hd64 MHA causal, dq_split 'rows', dkv_store 'tma': 24-26 registers spilled.
            why = "P^T through shared memory, deterministic, and the per-element dS^T stores issued early (ds_early)"
        elif config.ds_store == "stmatrix" and problem.deterministic and gqa and config.gqa_reduce == "atomic":
            # The one combination of the sweep with ds_store (756 kernels) that spills: 2 loads, 1 store.
            why = "the stmatrix dS store with P^T through shared memory and the deterministic GQA dK/dV locks"
        if why:
            out.append(Violation("registers", f"tile_m 128: {why} spills at this tile"))
    if getattr(problem, "varlen", False) and config.gqa_reduce == "loop":
        # A 'loop' CTA walks a group's heads over one (key tile, K/V head, batch); the varlen
        # kernel's CTA is (key tile, head, sequence) with per-sequence offsets: not built together.
        out.append(Violation("knob combination", "gqa_reduce 'loop' with varlen: not built (varlen takes 'atomic')"))
    if config.mask_bits and not (problem.causal or problem.has_window):
        out.append(Violation("knob combination",
            "mask_bits applies to causal and windowed problems only (elsewhere no bound moves per row)"))
    if config.q_starts != 1 and not q_starts_applies(problem):
        why = ("deterministic dQ turns follow the launch order, which shifted starts would serialize"
               if problem.deterministic else "the causal or window bound spreads the walks' unmasked runs already "
               "(q_starts applies without a bound, or under a right bound alone with seqlen_q < seqlen_k)")
        out.append(Violation("knob combination", f"q_starts {config.q_starts}: {why} (use 1)"))
    if config.q_starts != 1 and config.gqa_reduce == "loop" and problem.head_dim in SPLIT_HEAD_DIMS:
        # Compiled (session 28's CI, ptxas 13.0): hd256 non-causal GQA 'loop' with qm_tile_n 48 and
        # q_starts 4 spilled 1 register (the shifted run beside the group's head loop); the head-dim
        # split layouts run within a few registers of the budget, so 'loop' there keeps the plain walk.
        out.append(Violation("registers", f"q_starts {config.q_starts} with gqa_reduce 'loop' at head_dim "
                             f"{problem.head_dim} spills (hd256, qm_tile_n 48: 1 register)"))
    if config.walk_down and not (problem.causal or problem.has_window):
        out.append(Violation("knob combination",
            "walk_down applies to causal and windowed problems only (unmasked walks are alike either way)"))
    if config.walk_down and config.q_starts != 1:
        out.append(Violation("knob combination", f"walk_down with q_starts {config.q_starts}: both order the walk "
                             "(use one)"))
    if config.varlen_grid != "padded" and not getattr(problem, "varlen", False):
        out.append(Violation("knob combination", "varlen_grid 'compact' is for varlen problems"))
    if getattr(problem, "varlen", False) and config.exp_pin:
        # Compiled (ptxas 13.0): hd128 causal varlen with the fence spills 371 local loads a thread
        # (the dense kernel none); on the H200 the varlen backward ran 3.5x slower with it.
        out.append(Violation("registers", "exp_pin with varlen spills (hd128: 371 local loads a thread)"))
    if config.exp_pin and problem.softcap and problem.head_dim == 128:
        # Compiled: the pinned tanh and exp2 values beside the hd128 dP^T accumulator spill 41-43
        # local loads a thread (causal and not); hd64/96/192/256 with softcap and hd128 with a
        # window or sink compiled clean.
        out.append(Violation("registers", "exp_pin with softcap at hd128 spills (~42 local loads a thread)"))
    if getattr(problem, "varlen", False) and config.tile_m == 128 and config.ds_store == "sts":
        # The varlen compile sweep (ptxas 13.0): hd64, P^T through shared memory, deterministic,
        # dq_split 'rows', dkv_store 'tma' spilled 1 register with the sequence's offsets beside
        # the per-element dS^T store addresses; the dense sweep found 'sts' marginal at this tile too.
        out.append(Violation("registers", "varlen at tile_m 128 with the per-element dS^T stores spills "
                             "(use ds_store 'stmatrix')"))
    # A sliding window (issue 18) holds mask limits through the mainloop as causal does.
    windowed = getattr(problem, "window_left", -1) >= 0 or getattr(problem, "window_right", -1) >= 0
    masked = "causal" if problem.causal else "a sliding window"
    if problem.head_dim == 128 and config.dv_operand == "rmem" and (problem.causal or windowed) and config.tile_m == 64:
        # Measured (ptxas 13.0, every distinct kernel compiled): beside the causal mask limits,
        # the ring position of a 3-deep ring (a division by 3, not a shift) spills 2 registers,
        # and so does a 1-deep ring in deterministic mode; the same with P^T through shared
        # memory compiles clean. With a window's two bounds (non-causal) the 3-deep ring spills 2.
        if config.stages == 3:
            out.append(Violation("registers",
            f"head_dim 128, {masked}, stages 3 with P^T from registers spills (use dv_operand 'smem')"))
        elif config.stages == 1 and problem.deterministic:
            out.append(Violation("registers",
            f"head_dim 128, {masked}, deterministic, stages 1 with P^T from registers spills "
                       "(use dv_operand 'smem' or stages 2)"))
    if (problem.head_dim == 128 and gqa and config.gqa_reduce == "loop" and config.tile_m == 64
            and config.stages == 1 and (config.ds_stages == 1 or problem.deterministic)
            and config.ds_store == "sts" and config.dv_operand == "rmem"):
        # Compiled (sessions 22-23, ptxas 13.0): hd128 non-causal GQA spills 1 register (LDL/STL 1)
        # with the one-deep Q/dO ring, the per-element dS^T stores and the looped dK/dV over the
        # group: deterministic with either dS ring, not deterministic with the one-deep dS ring
        # (its two-deep one is the compile suite's case, clean). ds_store 'stmatrix', stages 2 or
        # gqa_reduce 'atomic' compile clean. A mask's limits only add to the live state, so masked
        # problems are refused alike.
        ring = "" if problem.deterministic else ", ds_stages 1"
        out.append(Violation("registers",
                             f"head_dim 128, GQA with gqa_reduce 'loop', stages 1{ring} and the per-element "
                             "dS^T stores spill with P^T from registers (use ds_store 'stmatrix' or stages 2)"))
    if getattr(problem, "softcap", 0.0) and config.tile_m == 128:
        # Softcap keeps t = tanh(S^T) in the S^T registers and fuses P and dS^T into one loop
        # after dP^T: at 32 query columns a thread the LSE and D values no longer fit beside
        # them (hd64, the default kernel otherwise: 16 loads / 12 stores of spills, ptxas 13.0).
        out.append(Violation("registers", "tile_m 128 with softcap spills (the fused P/dS^T loop; use tile_m 64)"))
    regs = consumer_registers(config, problem)
    if regs > CONSUMER_REG_BUDGET:
        out.append(Violation(
            "registers",
            f"consumer state needs ~{regs} registers per thread (tile_m {config.tile_m}, head_dim "
            f"{problem.head_dim}, dq_accum '{config.dq_accum}') > {CONSUMER_REG_BUDGET}: measured spills "
            "and WGMMA serialization (C7512)")
        )
    return out


def qm_violations(config: BwdConfigSm90, problem: Problem) -> list[Violation]:
    """Why qm_tile_n / do_single cannot run this problem (fa4.sm90.bwd_qm)."""
    out: list[Violation] = []
    if config.do_single and not config.qm_tile_n:
        out.append(Violation("knob combination",
                             "do_single splits the Q and dO ring depths of qm_tile_n's kernel; with the keys on M "
                             "(qm_tile_n 0) Q and dO share one ring state"))
    if not config.qm_tile_n:
        return out
    if problem.head_dim not in SPLIT_HEAD_DIMS:
        out.append(Violation("knob combination",
                             f"qm_tile_n is built for head_dim {SPLIT_HEAD_DIMS}, not {problem.head_dim}"))
    if config.dkv_split != "head_dim":
        out.append(Violation("knob combination",
                             "qm_tile_n publishes P and dS through shared memory as dkv_split 'head_dim' does: "
                             "needs dkv_split 'head_dim'"))
    if config.tile_m != ROWS_PER_WG:
        out.append(Violation("tile shape",
                             f"qm_tile_n puts the queries on one 64-row WGMMA M: tile_m 64, not {config.tile_m}"))
    if config.cluster_exchange:
        out.append(Violation("knob combination", "cluster_exchange with qm_tile_n: not built"))
    if config.qm_tile_n == 48 and problem.head_dim == 192:
        # Compiled (ptxas 13.0, hd192 causal): 2 local loads and 10 stores a thread, against none at
        # 64 and 96 (each warpgroup's dK^T/dV^T N of 24 keys over three 64-row head-dim atoms).
        out.append(Violation("registers", "qm_tile_n 48 at head_dim 192 spills (use 64 or 96)"))
    if config.ds_store == "stmatrix" and (config.qm_tile_n // 2) % 16:
        # A warpgroup's S columns (tile_n / 2 keys) are not whole stmatrix.x4 tiles (16 columns):
        # the DSL aborts building the partition (compiled, nvidia-cutlass-dsl 4.8.1, qm_tile_n 48).
        out.append(Violation("tile shape",
                             f"ds_store 'stmatrix' stores 16 keys a warpgroup at a time; qm_tile_n {config.qm_tile_n} "
                             f"gives each {config.qm_tile_n // 2} (use ds_store 'sts')"))
    return out


def cluster_violations(config: BwdConfigSm90, problem: Problem) -> list[Violation]:
    """Why cluster_exchange cannot run this problem (fa4.common.bwd_pair, fa4.sm90.bwd_cluster).
    Odd numbers of key tiles need no refusal: the last pair's second CTA is fully masked. A
    learnable sink needs nothing either: the main kernel is the one without it (the forward's LSE
    holds the sink, its gradient is reduced on the host from D)."""
    if not config.cluster_exchange:
        return []
    out: list[Violation] = []
    if config.dkv_split != "head_dim":
        out.append(Violation("knob combination",
                             "cluster_exchange pairs 64-key tiles of dkv_split 'head_dim' (head_dim 192/256): "
                             "with 'keys' a CTA's 128 keys already halve the dQ adds per key"))
    if config.dq_split != "head_dim":
        out.append(Violation("knob combination",
                             "cluster_exchange splits dQ's columns across the pair and then across the "
                             "warpgroups: dq_split 'head_dim'"))
    if config.gqa_reduce == "loop":
        # A 'loop' CTA walks its group's heads: the pair would have to walk them in lockstep.
        out.append(Violation("knob combination", "cluster_exchange with gqa_reduce 'loop': not built"))
    if getattr(problem, "varlen", False):
        # A pair's two key tiles would need the same sequence, and the odd tail one per sequence.
        out.append(Violation("knob combination", "cluster_exchange with varlen: not built"))
    if problem.deterministic:
        # The two halves of a dQ tile are disjoint, so they could each take turns of their own
        # (a semaphore per (tile, half), turns in pair order), but that is not built.
        out.append(Violation("knob combination",
                             "cluster_exchange with deterministic dQ adds: the per-half semaphore order is "
                             "not built"))
    windowed = getattr(problem, "window_left", -1) >= 0 or getattr(problem, "window_right", -1) >= 0
    if windowed:
        # The pair walks its 128 keys' query range; a window's skipped middle would differ per half.
        out.append(Violation("knob combination",
                             "cluster_exchange with a sliding window: the pair's window segments are not built"))
    if getattr(problem, "softcap", 0.0):
        out.append(Violation("knob combination", "cluster_exchange with softcap: not built"))
    return out


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
    (Q_STARTS_DEFAULT) and the deterministic walk down (det_walk_down_pays)."""
    if (q_starts_applies(problem) and problem.head_dim in Q_STARTS_HEAD_DIMS
            and not getattr(problem, "varlen", False)):
        cand = dataclasses.replace(config, q_starts=Q_STARTS_DEFAULT)
        if not violations(cand, problem, arch):
            config = cand
    if det_walk_down_pays(problem, config.gqa_reduce):
        cand = dataclasses.replace(config, walk_down=True, spt_order=False, head_swizzle=DET_WALK_DOWN_SWIZZLE)
        if not violations(cand, problem, arch):
            config = cand
    return config


def dkv_sums(config: BwdConfigSm90, gqa: bool) -> str:
    """How dK and dV leave the main kernel: one answer for the kernel (fa4.sm90.bwd), its compile
    (fa4.sm90.bwd_compile) and its launch (fa4.sm90.bwd_launch), which must agree on the buffers and
    on what converts them. 'store': finished tiles in the output dtype (no GQA, or gqa_reduce 'loop');
    'last_cta': fp32 sums the group's last CTA finishes; 'bulk': fp32 sums in the dQ accumulator's
    fragment order, converted by the dQ postprocess; 'red': row-major fp32 sums, converted by the
    dK/dV postprocess."""
    if not gqa or config.gqa_reduce == "loop":
        return "store"
    if config.gqa_finish == "last_cta":
        return "last_cta"
    return "bulk" if config.gqa_add == "bulk" else "red"


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
