"""The knobs of our Hopper forward kernel: one declaration, one feasibility function.

Everything that lists these knobs (the Optuna space, the DB schema, the REST
schema, the dashboard filters, the compile-only tests) derives it from
:class:`FwdConfigSm90` through :mod:`fa4.knobs`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fa4.arch import SM90, Arch
from fa4.common.constants import THREADS_PER_WG
from fa4.knobs import RuntimeKnobNames, Violation, knob
from fa4.problem import Problem

HEAD_DIMS = (64, 96, 128, 192, 256)
# head_dim_v per head_dim (the first is head_dim itself): the DeepSeek-style 192/128 split
# has its own, smaller O accumulator and V tile.
HEAD_DIMS_V = {192: (192, 128)}


def head_dims_v(head_dim: int) -> tuple[int, ...]:
    """The head_dim_v values the forward kernel takes with ``head_dim``."""
    # Compared, not hashed: under torch.compile's fake tensors head_dim may be a SymInt.
    return next((dvs for d, dvs in HEAD_DIMS_V.items() if d == head_dim), (head_dim,))


# Rows per consumer warpgroup: one WGMMA atom is 64 rows tall, and a warpgroup owns one
# Q tile, so two consumer warpgroups cover 128 query rows per CTA.
ROWS_PER_WG = 64
CONSUMER_WGS = (2, 3)
# setmaxnreg split (consumer, producer) per number of consumer warpgroups: the per-SM file of
# 65536 registers over 128-thread warpgroups.
REG_SPLIT = {2: (240, 24), 3: (160, 32)}
# ctas_per_sm 2 (two consumer warpgroups only): __launch_bounds__(384, 2) gives 80 registers a
# thread at launch, a pool of 3 x 80 per lane slot for the split: 2 x 104 + 32 = 240.
REG_SPLIT_TWO_CTAS = (104, 32)
# Register budget. ptxas allocates the consumer branch against its setmaxnreg count (240 or
# 160), the rest of the kernel against the launch bound (168 or 128). When the live WGMMA
# fragments plus the consumer's other values do not fit, ptxas serializes every wgmma
# (warning C7512) and spills. Besides O + S + P (fp32-register units, consumer_registers) a
# consumer holds about 21 registers at its peak, the row max of S(j) while PV(j-1) is in
# flight: the stack pointer, row max and sum (2 + 2), the k/v pipeline phases, named-barrier
# ids, the mask limits, and a few fmax chain temporaries. Measured with ptxas 13.0 (nvdisasm
# life ranges, in-flight WGMMA operands added): peak 149 of 160 at 3 warpgroups, hd64
# tile_n 128. Fits, measured on every kernel of the space: 3 warpgroups 128 (hd64 tile_n 128)
# fits, 136 (hd128 tile_n 96) and 140 (hd64 tile_n 144) serialize; 2 warpgroups 208 (hd128
# tile_n 192) fits, 232 (hd128 tile_n 224) serializes. (Before P was converted with packed
# cvt, fa4.common.convert, the budgets were 104 and 176.) The wider head dims fit the same
# budgets: 2 warpgroups 188 (hd256 tile_n 80), 180 (hd192 tile_n 112), 3 warpgroups 120 (hd96
# tile_n 96) compiled clean; 216 (hd96 tile_n 224, P live in the serial step) serializes.
FRAGMENT_REG_BUDGET = {2: 208, 3: 128}
# ctas_per_sm 2 (consumers at 104): hd64 tile_n 64 and 80 with P through shared memory (O + S =
# 64, 72) compiled clean; tile_n 96 with P in shared memory (80) and tile_n 64 with P in
# registers (O 32 + S 32 + P 16 = 80) serialize, the first also spills (ptxas 13.0).
FRAGMENT_REG_BUDGET_TWO_CTAS = 72
# Shared memory the kernel keeps besides Q/K/V tiles: mbarriers and alignment padding.
SMEM_RESERVED = 2048

# bf16/fp16 overflow guard for conditional rescaling: P = 2^(s - m_used) <= 2^tau must stay
# finite after conversion to the 16-bit type. fp16's largest finite value is 65504 < 2^16,
# so tau + 1 (rounding headroom) must stay below 16; bf16 shares fp32's exponent range.
LOG2_DTYPE_MAX = {"fp16": 15.0, "bf16": 127.0}


@dataclass(frozen=True)
class FwdConfigSm90:
    tile_m: int = knob(
        (128, 192), 128,
        "Query rows per CTA: one 64-row Q tile per consumer warpgroup (WGMMA M is 64); 128 = the two "
        "ping-pong warpgroups of FA4, 192 = three in a round robin (more softmax in flight, fewer registers).",
    )
    tile_n: int = knob(
        (64, 80, 96, 112, 128, 144, 160, 176, 192, 224), 128,
        "Key/value rows per mainloop step (N of S = QK^T, K of O += PV; multiple of 16 for the PV WGMMA). "
        "Wide head dims take narrow tiles: at 256 two K/V stages of 80 rows fill shared memory.",
    )
    kv_stages: int = knob(
        (2, 3), 2,
        "Depth of the K and V shared-memory rings (TMA runs this many tiles ahead of the WGMMAs).",
    )
    pingpong: str = knob(
        ("off", "mma", "mma_exp"), "mma",
        "Ping-pong of the two consumer warpgroups: 'mma' orders their WGMMA issue with named barriers so "
        "one warpgroup's softmax overlaps the other's GEMMs; 'mma_exp' also keeps their exp phases apart "
        "(MUFU contention); 'off' lets them run freely.",
    )
    intra_wg_overlap: bool = knob(
        (True, False), True,
        "Issue QK(j) and PV(j-1) back to back, then run the softmax of tile j while PV(j-1) is in flight.",
    )
    exp_pin: bool = knob(
        (False, True), False,
        "With intra_wg_overlap: keep the exp2 of S(j) ahead of the wait for PV(j-1), behind a never-taken "
        "branch (a basic-block boundary ptxas does not schedule across). Without it ptxas computes the row "
        "max under PV(j-1) but moves 62 of the 64 MUFU.EX2 of a step below the wait (hd128 default), so "
        "the exponentials run after the GEMM instead of under it. On the H200 (session 16): hd64 -7 to -9%, "
        "hd96 -1 to -2%, hd128 +-0, hd192/256 0 to +1.7%; the tuner keeps it. Spills with varlen.",
    )
    p_operand: str = knob(
        ("rmem", "smem"), "rmem",
        "Where the PV WGMMA reads P: 'rmem' from the registers it was converted into (no shared-memory "
        "traffic, but P stays live beside S and O while PV runs), 'smem' from a per-warpgroup shared "
        "copy (a store, a fence and a warpgroup barrier per tile; P's registers die right after the "
        "store, which leaves room for wider tiles).",
    )
    exp2_emu_frac: float = knob(
        (0.0, 0.125, 0.25, 0.375), 0.0,
        "Fraction of each thread's exp2 evaluated by the FMA-pipe polynomial (Cody-Waite + degree-3 "
        "Horner) instead of MUFU.EX2; chosen per element index at compile time, in 1/8 steps.",
    )
    exp2_emu_pattern: str = knob(
        ("block", "spread"), "block",
        "Which elements of each group of 8 take the polynomial: 'block' the first k, 'spread' k evenly "
        "spaced ones (FMA-pipe and MUFU work interleaved in program order). No effect at fraction 0.",
        inert=lambda config: config.exp2_emu_frac == 0,
    )
    tanh_fma_frac: float = knob(
        (0.0, 0.125, 0.25, 0.375, 0.5), 0.0,
        "Softcap problems only: fraction of each thread's score tanh evaluated on the FMA pipe (2^y by the "
        "exp2 polynomial, a Newton reciprocal, fa4.common.softcap) instead of MUFU.TANH, in 1/8 steps spread "
        "over each group of 8 elements; with softcap every score takes two MUFU ops (tanh and exp2).",
        applies=lambda problem: problem.softcap != 0,
    )
    tau: float = knob(
        (0.0, 4.0, 8.0), 0.0,
        "Conditional rescaling threshold in log2 units of the scaled score: O and the row sum are rescaled "
        "only when some row of the warp sees its max grow by more than tau (0 = rescale on every growth).",
        runtime=True,
    )
    sched_order: str = knob(
        ("lpt", "natural"), "lpt",
        "Order of (m_block, head, batch) tiles: 'lpt' launches the longest causal rows first "
        "(reverse m_block), 'natural' ascending m_block.",
        runtime=lambda order: 1 if order == "lpt" else 0,  # the kernel's lpt flag
    )
    head_swizzle: int = knob(
        (1, 2, 4, 8), 1,
        "Heads per scheduling group: consecutive CTAs walk the m_blocks of this many heads together, so the "
        "K/V of the heads in flight stay resident in L2.",
        runtime=True,
    )
    persistent: bool = knob(
        (False, True), False,
        "One CTA per tile (False), or one CTA per SM walking the tiles in the scheduler's order "
        "(True): the next tile's K/V loads overlap the current epilogue and no launch sits between tiles.",
    )
    ctas_per_sm: int = knob(
        (1, 2), 1,
        "CTAs resident on an SM: 1 gives each consumer thread 240 registers; 2 (two consumer warpgroups, "
        "at most half the shared memory each) launches with __launch_bounds__(384, 2) and splits 104 / 32, "
        "so one CTA's prologue, last softmax and epilogue run beside the other's GEMMs: short causal "
        "walks, where a CTA sees few key tiles, spend a large share of their time there. Fits head_dim 64 "
        "only (tile_n 64 or 80, P through shared memory); not with varlen (not run on a GPU there). On the "
        "H200 (session 24, hd64 causal): +13% at 512 keys, +25% at 256, the default there; within 2% at "
        "768-1k, -10 to -16% at 2k and -7% non-causal at 1k (the 64-wide GEMMs are shared-memory bound).",
        applies=lambda problem: problem.head_dim == 64 and not problem.varlen,
    )
    mask_bits: bool = knob(
        (False, True), False,
        "Causal and windowed problems: a masked tile's verdicts per row as 32-bit words (the kept elements "
        "of a row are a run in the accumulator's column order, so its length is arithmetic on the bound) "
        "tested bit by bit, which ptxas turns into R2P, seven predicates an instruction, instead of one "
        "compare per element (hd128 causal: 148 ISETP in the kernel, 28 with it). Measured on the H200 "
        "(session 23): +1.3-1.9% at hd64 causal 1k, where the default takes it; within noise at hd128 "
        "causal 4k/8k (fa4.common.masking).",
        applies=lambda problem: problem.causal or problem.has_window,
    )

    # Knobs that only change runtime arguments, not the compiled kernel (marked runtime above).
    RUNTIME_KNOBS = RuntimeKnobNames()


def reg_split(config: FwdConfigSm90) -> tuple[int, int]:
    """setmaxnreg counts (consumer, producer thread) of the kernel a config compiles to."""
    return REG_SPLIT_TWO_CTAS if config.ctas_per_sm == 2 else REG_SPLIT[config.tile_m // ROWS_PER_WG]


def smem_bytes(config: FwdConfigSm90, problem: Problem) -> int:
    elt = 2
    q = config.tile_m * problem.head_dim * elt
    k = config.kv_stages * config.tile_n * problem.head_dim * elt
    v = config.kv_stages * config.tile_n * problem.head_dim_v * elt
    p = config.tile_m * config.tile_n * elt if config.p_operand == "smem" else 0
    return q + k + v + p + SMEM_RESERVED


def consumer_registers(config: FwdConfigSm90, problem: Problem) -> int:
    """fp32-register units of the live fragments of a consumer thread: O, S and P (16-bit, packed)."""
    per_thread = ROWS_PER_WG / THREADS_PER_WG
    o_acc = per_thread * problem.head_dim_v
    s_acc = per_thread * config.tile_n
    p_frag = s_acc / 2
    # Without intra-warpgroup overlap S is converted into P before the next QK is issued,
    # so the two are not live at the same time.
    overlap_p = config.intra_wg_overlap or config.tile_m // ROWS_PER_WG == 3
    # Measured: at 3 consumer warpgroups the non-overlapped path spills unless P fits beside S too.
    # P through shared memory: its registers die at the store, before the next QK is issued.
    if config.p_operand == "smem":
        overlap_p = False
    # Without overlap P(j-1) is still live too when P stays in registers: the serial step issues
    # PV(j-1), which reads it, and QK(j), which writes S, before it waits for either (compiled:
    # hd128 and hd96 at tile_n 224 serialize).
    if config.p_operand == "rmem":
        overlap_p = True
    live = o_acc + s_acc + (p_frag if overlap_p else 0)
    return int(math.ceil(live))


def violations(config: FwdConfigSm90, problem: Problem, arch: Arch = SM90) -> list[str]:
    """Why this config cannot run this problem on this arch (empty list = feasible)."""
    out: list[str] = []
    if arch.name != "sm90":
        out.append(Violation("problem", f"FwdConfigSm90 targets sm90, not {arch.name}"))
    if problem.head_dim not in HEAD_DIMS:
        out.append(Violation("problem", f"head_dim {problem.head_dim} not supported (supported: {HEAD_DIMS})"))
    elif problem.head_dim_v not in head_dims_v(problem.head_dim):
        out.append(Violation("problem", f"head_dim_v {problem.head_dim_v} not supported with head_dim "
                             f"{problem.head_dim} (supported: {head_dims_v(problem.head_dim)})"))
    if problem.pass_ != "fwd":
        out.append(Violation("problem", "FwdConfigSm90 tunes the forward pass only"))
    n_wg = config.tile_m // ROWS_PER_WG
    if config.tile_m % ROWS_PER_WG or n_wg not in CONSUMER_WGS:
        out.append(Violation("tile shape", f"tile_m {config.tile_m} must be 64 x {CONSUMER_WGS} consumer warpgroups"))
        n_wg = 2
    if config.tile_n % 16:
        out.append(Violation("tile shape", f"tile_n {config.tile_n} must be a multiple of 16 (K of the PV WGMMA)"))
    if config.tile_n > 256:
        out.append(Violation("tile shape", f"tile_n {config.tile_n} exceeds the WGMMA N limit and TMA box limit of 256"))
    need = smem_bytes(config, problem)
    if need > arch.smem_per_cta:
        out.append(Violation(
            "shared memory",
            f"shared memory {need} B (Q {config.tile_m}x{problem.head_dim}, K/V {config.kv_stages} stages of "
            f"{config.tile_n}x{problem.head_dim}) exceeds {arch.smem_per_cta} B per CTA")
        )
    regs = consumer_registers(config, problem)
    if config.ctas_per_sm == 2:
        if problem.varlen:
            out.append(Violation("knob combination",
                "ctas_per_sm 2 with varlen: its tile walk has not run on a GPU with two CTAs an SM"))
        if n_wg != 2 or config.persistent:
            out.append(Violation("knob combination",
                "ctas_per_sm 2 needs tile_m 128 (two consumer warpgroups) and persistent off (one CTA an SM)"))
        if 2 * (need + 1024) > arch.smem_per_sm:
            out.append(Violation("shared memory",
                f"ctas_per_sm 2: two CTAs of {need} B (and 1 KiB reserved each) exceed an SM's shared memory"))
        if regs > FRAGMENT_REG_BUDGET_TWO_CTAS:
            out.append(Violation("registers",
                f"ctas_per_sm 2: consumer fragments need {regs} registers per thread > {FRAGMENT_REG_BUDGET_TWO_CTAS} "
                f"({REG_SPLIT_TWO_CTAS[0]} a consumer thread): ptxas would serialize the WGMMAs"))
    elif regs > FRAGMENT_REG_BUDGET[n_wg]:
        out.append(Violation(
            "registers",
            f"consumer fragments need {regs} registers per thread (O {problem.head_dim_v // 2}, "
            f"S {config.tile_n // 2}{', P ' + str(config.tile_n // 4) if regs > (problem.head_dim_v + config.tile_n) // 2 else ''}) "
            f"> {FRAGMENT_REG_BUDGET[n_wg]} with {n_wg} consumer warpgroups: ptxas would serialize the WGMMAs")
        )
    if config.tau > 0 and config.tau + 1 > LOG2_DTYPE_MAX[problem.dtype]:
        out.append(Violation(
            "value range",
            f"tau {config.tau} lets unnormalized P reach 2^{config.tau}, beyond the {problem.dtype} range")
        )
    if config.tanh_fma_frac > 0 and problem.softcap == 0:
        out.append(Violation("knob combination",
            "tanh_fma_frac applies to softcap problems only (without softcap there is no tanh to split)"))
    if config.tanh_fma_frac > 0.125 and n_wg == 3:
        # Compiled (hd64 causal, softcap): 0.25 to 0.5 spill 2-3 registers at the 160 of three
        # consumer warpgroups (the Newton reciprocal's temporaries); 0.125 compiled clean.
        out.append(Violation("registers",
            f"tanh_fma_frac {config.tanh_fma_frac} with 3 consumer warpgroups spills (at most 0.125)"))
    if config.mask_bits and not (problem.causal or problem.has_window):
        out.append(Violation("knob combination",
            "mask_bits applies to causal and windowed problems only (elsewhere no bound moves per row)"))
    if config.persistent and problem.varlen:
        # The persistent walk would have to skip the tiles past each sequence's end in step
        # between producer and consumers (pipeline and Q-stage phases); not built.
        out.append(Violation("knob combination", "varlen runs one CTA per tile: persistent must be off"))
    if config.pingpong == "mma_exp" and not config.intra_wg_overlap:
        # Without overlap the exp phase of one warpgroup already sits between its own GEMMs,
        # which the 'mma' barrier orders; the extra barrier would only serialize further.
        out.append(Violation("knob combination",
            "pingpong 'mma_exp' needs intra_wg_overlap (the exp barrier brackets the overlapped softmax)"))
    if config.exp_pin and not config.intra_wg_overlap:
        # The serial step waits for both GEMMs before its softmax: nothing runs under them to pin.
        out.append(Violation("knob combination",
            "exp_pin keeps the exponentials under PV(j-1): it needs intra_wg_overlap"))
    if config.exp_pin and problem.varlen:
        # Compiled (ptxas 13.0, each head dim's default with exp_pin): the varlen kernels spill
        # 48-334 local loads a thread with the fence (hd128 causal 48, hd192 328), the dense ones none.
        out.append(Violation("registers", "exp_pin with varlen spills (48-334 local loads a thread)"))
    if (config.persistent and problem.causal and problem.head_dim == 128
            and (config.tile_n != 128 or config.p_operand != "rmem")):
        # The tile loop keeps the scheduler's values and pipeline phases live through the mainloop;
        # on top of the causal mask arithmetic at hd128 that spills (compiled: tile_n 96/160/176,
        # P through shared memory: 2-16 local loads/stores), while tile_n 128 with P in registers
        # compiled clean with and without overlap and with the exp2 split.
        out.append(Violation("registers",
            "persistent at head_dim 128, causal, needs tile_n 128 and p_operand 'rmem' (others spill)"))
    if config.persistent and problem.causal and problem.head_dim > 128:
        # Compiled: 5 of the 11 persistent causal kernels at hd192/256 spilled or serialized (P in
        # registers and in shared memory, every ping-pong mode); those that ran were 20-25% slower
        # than one CTA per tile (H200, S 8192: the wide tiles leave one CTA per SM either way).
        out.append(Violation("registers",
            f"persistent at head_dim {problem.head_dim}, causal, spills or loses (one CTA per tile)"))
    if config.persistent and problem.causal and problem.head_dim == 96 and config.tile_m == 128:
        # Compiled: 128x160 (P in registers) and 128x176 (P through shared memory) spilled; every
        # 192-row persistent causal kernel compiled clean.
        out.append(Violation("registers",
            "persistent at head_dim 96, causal, needs tile_m 192 (128-row tiles spill)"))
    if (config.persistent and problem.causal and problem.head_dim == 96 and config.p_operand == "smem"
            and config.exp2_emu_frac > 0):
        # Compiled (session 9, with the window-capable mask): 192x112 with P through shared memory
        # and the exp2 split spilled 20 bytes at 128 registers.
        out.append(Violation("registers",
            "persistent at head_dim 96, causal, with P through shared memory and the exp2 split spills"))
    return out


# hd64 causal: at most this many query rows take tile_m 128 (session 20, H200, knob_effects,
# two runs: S512 +3.5%, S1k +4.4-5.0%, S1.5k -10%, S2k -6%).
SHORT_CAUSAL_HD64 = 1024
SHORT_WALK_HD64 = 2048
TWO_CTAS_HD64 = 512
# Causal walks past SHORT_WALK_HD64 (and at hd128) take SWIZZLE_HEADS heads a scheduling group while
# the K/V those heads stream fit SWIZZLE_KV_BYTES, a share of the 50 MB L2 of the H100 SXM / H200:
# measured on the H200 (session 25, knob_effects, three rotated rounds, two runs each) +2.5-3.7% at
# hd64 4k, +2.5-2.7% at 8k, +1.7-2.3% at 16k (32 MiB); hd128 +2.4-3.3% at 1k-4k, +2.1-4.7% at 8k
# (32 MiB); and -1.3 to -2.8% at hd128 16k (64 MiB). Non-causal hd64 8k lost 1.3-2.1%: every CTA of a
# head walks all of its keys there, and the heads' K/V leave L2 anyway.
SWIZZLE_HEADS = 8
SWIZZLE_KV_BYTES = 32 << 20


def swizzle_fits_l2(problem: Problem) -> bool:
    """A causal problem whose SWIZZLE_HEADS heads' K/V (16-bit) fit SWIZZLE_KV_BYTES: its default
    groups that many heads. Not varlen or windowed (not measured past session 24's 2k walks)."""
    kv_bytes = SWIZZLE_HEADS * problem.seqlen_k * (problem.head_dim + problem.head_dim_v) * 2
    return problem.causal and not problem.varlen and not problem.has_window and kv_bytes <= SWIZZLE_KV_BYTES


def default_config(problem: Problem, arch: Arch = SM90) -> FwdConfigSm90:
    """Heuristic default, from the knob effects measured on the H200 (bench/RESULTS.md).

    hd128: two consumer warpgroups, tile_n 128 (112 loses 5-7%; 144/160, feasible since P is
    converted with packed cvt, are within noise: 0.997/0.991), tau 8 (+5%: most O rescales
    skipped; fp16-safe). hd64: three consumer warpgroups (tile_m 192, +12-14%: a third softmax
    in flight where exp is as costly as the MMAs), tile_n 128 (+2.9% non-causal, +2.0% causal
    over 96; it fits the 3-warpgroup register budget since the packed P conversion), tau 8 and
    exp phases kept apart (+5% together); causal up to 1,024 query rows two warpgroups (tile_m
    128: +4.4-5.0% at 1k, +3.5% at 512; 192 rows leave a part-full last row tile, the longest of
    a causal walk; at 1,536 rows, eight full 192-row tiles, 128 loses 10%), and there the masked
    tiles' verdicts as bit words (mask_bits: +1.3-1.9% at 1k in four alternations over two runs,
    session 23; a masked tile is ~1 in 4.5 of a CTA's there; within noise at 4k/8k hd128, so off
    elsewhere). Causal walks up to 2k keys take 8 heads a scheduling group (K/V of the heads in
    flight stay in L2: +0.9-4.2% at 512-1k, +1.3-5.7% at 2k, session 24), and so do longer ones,
    at hd64 and hd128, while 8 heads' K/V fit 32 MiB (swizzle_fits_l2: +1.7-4.7% at 1k-16k, session
    25; -1.3 to -2.8% at hd128 16k, 64 MiB), and on the 128-row tile
    exp_pin (+0.5-1.7% more); up to 512 keys two CTAs an SM (ctas_per_sm 2 with tile_n 64 and P
    through shared memory: +13% at 512, +25% at 256). MUFU-only exp2: the FMA-pipe polynomial
    lost 1-8% at every fraction tried (issue-slot bound).

    The wider head dims (H200, bf16, S 8192, B 2, H*d 2048; beside the reference FA4 in one
    process): hd96 three warpgroups, tile_n 96 with P in registers (O 48 + S 48 + P 24): 1.00-1.01 /
    1.01 of the reference non-causal / causal, where the reference's own 192x144 (and 192x128)
    with P through shared memory gave 0.91 here (the warpgroup barrier before each PV), 128-row
    tiles 0.92-0.94; hd192 tile_n 112 (1.02 / 0.99), 128 at head_dim_v 128 (the O accumulator a
    third smaller; 1.00 / 0.98 with 4 heads per scheduling group when causal, 0.94 without; 112
    and 96 lose 2-3%); hd256 tile_n 80 (two stages of 80 K/V rows fill shared memory, O alone is
    128 registers; 1.02 / 0.97). Past head_dim 128 the ping-pong barrier is off as in the
    reference (within 1% either way here).
    """
    d, dv = problem.head_dim, problem.head_dim_v
    if d == 64:
        short_causal = problem.causal and problem.seqlen_q <= SHORT_CAUSAL_HD64
        short_walk = problem.causal and problem.seqlen_q <= SHORT_WALK_HD64 and problem.seqlen_k <= SHORT_WALK_HD64
        # Up to 512 (a CTA walks at most eight 64-key tiles): two CTAs an SM, so one CTA's
        # prologue, last softmax and epilogue run beside the other's GEMMs (+13.3-13.6% at 512,
        # +25% at 256; 768-1k within 2%, 2k -10 to -16%: the narrow tile's smem-bound GEMMs).
        two_ctas = (problem.causal and not problem.varlen and problem.seqlen_q <= TWO_CTAS_HD64
                    and problem.seqlen_k <= TWO_CTAS_HD64)
        # Session 24 (GPT-2's B16 H12 and the 16k-token shapes, three rotated rounds, two runs):
        # causal walks up to 2k keys take 8 heads a scheduling group (+0.9-4.2% at 512-1k,
        # +1.3-5.7% at 2k), longer ones while those heads' K/V fit L2 (swizzle_fits_l2, session 25)
        # and, on the 128-row tile, exp_pin (+0.5-1.7% more; it spills with varlen). Not with two
        # CTAs an SM, where 8 heads gained nothing (S512: 1.131-1.132 vs 1.133-1.136).
        base = FwdConfigSm90(tile_m=128 if short_causal else 192, tile_n=128, kv_stages=2, tau=8.0,
                             pingpong="mma_exp", mask_bits=short_causal,
                             head_swizzle=(SWIZZLE_HEADS if (short_walk or swizzle_fits_l2(problem)) and not two_ctas
                                           else 1),
                             exp_pin=short_walk and short_causal and not problem.varlen)
        if two_ctas:
            base = dataclasses.replace(base, ctas_per_sm=2, tile_n=64, p_operand="smem")
    elif d == 96:
        base = FwdConfigSm90(tile_m=192, tile_n=96, kv_stages=2, tau=8.0)
    elif d == 192:
        # Causal at head_dim_v 128: 4 heads per scheduling group keep more K/V in L2 (+4%).
        swizzle = 4 if dv <= 128 and problem.causal else 1
        base = FwdConfigSm90(tile_n=128 if dv <= 128 else 112, kv_stages=2, tau=8.0, pingpong="off",
                             head_swizzle=swizzle)
    elif d == 256:
        base = FwdConfigSm90(tile_n=80, kv_stages=2, tau=8.0, pingpong="off")
    else:
        base = FwdConfigSm90(tile_n=128, kv_stages=2, tau=8.0,
                             head_swizzle=SWIZZLE_HEADS if swizzle_fits_l2(problem) else 1)
    if problem.dtype == "fp16" and base.tau + 1 > LOG2_DTYPE_MAX["fp16"]:
        base = FwdConfigSm90(**{**base.__dict__, "tau": 0.0})
    if violations(base, problem, arch):
        for tn in (176, 160, 144, 128, 112, 96, 80, 64):
            cand = FwdConfigSm90(tile_n=tn)
            if not violations(cand, problem, arch):
                return cand
    return base
