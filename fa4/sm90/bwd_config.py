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
# Sequence padding of the backward's fp32 side buffers (LSE, D, dQ/dK/dV accumulators; varlen: of
# each sequence's region): a multiple of every tile size, so the main kernel reads and reduces
# whole tiles without bounds checks.
SEQ_PAD = 128


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
        "issues its dS stores inside the pointwise loop and waits 0.3% there). bwd_defaults.default_config turns it on at "
        "bwd_defaults.DS_EARLY_HEAD_DIMS (hd64, where it won 1.5-3% on the H200); at hd128 it lost 1-4% at masked shapes.",
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
        "fewer CTAs, still fills the machine (bwd_defaults.default_config takes it from bwd_defaults.GQA_LOOP_MIN_CTAS CTAs); "
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
        "(bwd_defaults.GQA_FINISH_DET_HEAD_DIMS).",
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
        "+17% causal on the H200, the default there (bwd_defaults.default_config); at 192 and 192/128 it loses 6-9% "
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
        "whole either way. bwd_defaults.default_config turns it on where tile_m is 128 and the backward is not "
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
        "0.989 -> 1.206 (dp_first 1.088 / 1.081, both 1.189 / 1.193): the default there (bwd_defaults.DK_BEFORE_DQ_HEAD_DIMS); "
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
        "(bwd_defaults.default_launch_order). Without a mask every key tile does the same work.",
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
        "start would serialize: not there. bwd_defaults.default_config takes 16 at head_dim 128 and 256 from "
        "2k queries (H200: hd256 non-causal +10-11%, hd128 +1.6-2.7%, Sq 2k / Sk 8k causal +0.2-1.8%; "
        "bwd_defaults.Q_STARTS_DEFAULT, Q_STARTS_MIN_Q).",
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
        "bwd_defaults.default_config walks down, longest first with 16 heads a group, where it won on the H200 "
        "(bwd_defaults.det_walk_down_pays: deterministic causal with >= 64 key tiles a head at hd128 or hd64 under GQA "
        "'atomic' with seqlen_q = seqlen_k, and hd128 'loop' with seqlen_q < seqlen_k; +2-5%); with fewer "
        "key tiles the one dQ hand-off per CTA of a wave weighs more and it lost (Qwen2.5-7B 4k -5%).",
        applies=lambda problem: problem.causal or problem.has_window,
        requires=lambda k: k["q_starts"] == 1,
    )
    head_swizzle: int = knob(
        (1, 2, 4, 8, 16, 32), 1,
        "Heads per scheduling group: consecutive CTAs walk the key tiles of this many heads together so "
        "their Q/dO stay resident in L2. A group launches key tile by key tile, so spt_order's order holds "
        "within it: with few key tiles a head bwd_defaults.default_config takes a group of about a wave "
        "(bwd_defaults.wave_head_swizzle; GPT-2 1k +3-4%).",
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
