"""The knobs of our Hopper backward kernel: one declaration, one feasibility function.

Layout of the main kernel (fa4.sm90.bwd): one CTA per (key tile, head, batch), a producer
warpgroup and two consumer warpgroups; each consumer owns 64 key rows of the tile and loops
over the query tiles. S^T and dP^T are computed with the keys on the WGMMA M axis, so P^T
and dS^T come out of the accumulators already in the register layout the dV and dK WGMMAs
take as their A operand (no shared-memory round trip for those two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fa4.arch import SM90, Arch
from fa4.knobs import knob
from fa4.problem import Problem

HEAD_DIMS = (64, 128)
ROWS_PER_WG = 64
THREADS_PER_WG = 128
CONSUMER_WGS = 2
# ptxas allocates against the launch bound whatever setmaxnreg says: 65536 / 384 threads -> 168.
# The fragment budget below is the live WGMMA state (fp32-register units) that still compiled
# without C7512 serialization or spills in the compile-only tests; see consumer_registers().
FRAGMENT_REG_BUDGET = 168
REG_SPLIT = (240, 24)  # setmaxnreg (consumer, producer)
SMEM_RESERVED = 2048


@dataclass(frozen=True)
class BwdConfigSm90:
    tile_m: int = knob(
        (64, 128), 64,
        "Query rows per step of the mainloop (N of S^T = K Q^T, K of dV += P^T dO, M of dQ = dS K).",
    )
    tile_n: int = knob(
        (128,), 128,
        "Key rows per CTA: 64 per consumer warpgroup (the WGMMA M of S^T, dV and dK); two consumers.",
    )
    stages: int = knob(
        (1, 2), 2,
        "Depth of the Q and dO shared-memory rings (one pipeline state for both: TMA runs this many "
        "query tiles ahead of the consumers).",
    )
    sdp_swap_ab: bool = knob(
        (True,), True,
        "Compute S^T and dP^T (keys on the M axis) so P^T/dS^T feed the dV/dK WGMMAs from registers. "
        "The untransposed form is not built.",
    )
    dq_accum: str = knob(
        ("bulk", "red_v2", "red"), "bulk",
        "How dQ tiles reach the fp32 accumulator in global memory: 'bulk' stages the tile in shared "
        "memory and one warp of the producer warpgroup adds it with cp.reduce.async.bulk (it also owns "
        "the deterministic lock wait); 'red_v2' / 'red': each consumer thread issues red.global.add "
        "(.v2.f32 on pairs of adjacent columns, or .f32 per element) and the consumers take the lock.",
    )
    deterministic: bool = knob(
        (False, True), False,
        "Add the dQ (and, under GQA, dK/dV) contributions in a fixed order: a per-tile int32 semaphore, "
        "acquire spin by one thread, release increment after the adds.",
    )
    spt_order: bool = knob(
        (True, False), True,
        "Causal: launch the shortest key tiles (highest n_block) first and give them the first dQ turns "
        "(shortest processing time first), so deterministic lock waits stay short. No effect non-causal.",
    )
    head_swizzle: int = knob(
        (1, 2, 4, 8), 1,
        "Heads per scheduling group: consecutive CTAs walk the key tiles of this many heads together so "
        "their Q/dO stay resident in L2.",
    )
    cluster_exchange: bool = knob(
        (False,), False,
        "2-CTA cluster exchanging dS halves through distributed shared memory. Declared, not built.",
    )

    RUNTIME_KNOBS = ("spt_order", "head_swizzle")


def smem_bytes(config: BwdConfigSm90, problem: Problem) -> int:
    elt = 2
    d = problem.head_dim
    q = config.stages * config.tile_m * d * elt
    do = config.stages * config.tile_m * problem.head_dim_v * elt
    stats = 2 * config.stages * config.tile_m * 4  # LSE and D rows beside Q and dO
    kv = config.tile_n * (d + problem.head_dim_v) * elt
    ds = config.tile_m * config.tile_n * elt
    dq = config.tile_m * d * 4 if config.dq_accum == "bulk" else 0
    return q + do + kv + ds + dq + stats + SMEM_RESERVED


def consumer_registers(config: BwdConfigSm90, problem: Problem) -> int:
    """fp32-register units live per consumer thread at the peak of a mainloop step.

    dK and dV accumulators (64 key rows x head_dim each), S^T (P^T in fp32) and dP^T
    (64 x tile_m each), P^T packed to 16 bits for the dV WGMMA, and the dQ accumulator
    (tile_m x head_dim/2: the two consumers split dQ's columns).
    """
    per_thread = ROWS_PER_WG / THREADS_PER_WG
    dkv = 2 * per_thread * problem.head_dim
    sdp = 2 * per_thread * config.tile_m
    p16 = per_thread * config.tile_m / 2
    dq = config.tile_m * (problem.head_dim // CONSUMER_WGS) / THREADS_PER_WG
    return int(math.ceil(dkv + sdp + p16 + dq))


def violations(config: BwdConfigSm90, problem: Problem, arch: Arch = SM90) -> list[str]:
    """Why this config cannot run this problem on this arch (empty list = feasible)."""
    out: list[str] = []
    if arch.name != "sm90":
        out.append(f"BwdConfigSm90 targets sm90, not {arch.name}")
    if problem.pass_ != "bwd":
        out.append("BwdConfigSm90 tunes the backward pass only")
    if problem.head_dim not in HEAD_DIMS:
        out.append(f"head_dim {problem.head_dim} not supported (supported: {HEAD_DIMS})")
    if problem.head_dim_v != problem.head_dim:
        out.append(f"head_dim_v {problem.head_dim_v} must equal head_dim {problem.head_dim}")
    if config.deterministic != problem.deterministic:
        out.append(
            f"config.deterministic={config.deterministic} but the problem asks for "
            f"deterministic={problem.deterministic}"
        )
    if config.tile_m % ROWS_PER_WG:
        out.append(f"tile_m {config.tile_m} must be a multiple of 64 (the WGMMA M of dQ = dS K)")
    if config.tile_n != CONSUMER_WGS * ROWS_PER_WG:
        out.append(f"tile_n {config.tile_n} must be {CONSUMER_WGS} consumer warpgroups x 64 rows")
    if not config.sdp_swap_ab:
        out.append("sdp_swap_ab=False is not built")
    if config.cluster_exchange:
        out.append("cluster_exchange is not built")
    need = smem_bytes(config, problem)
    if need > arch.smem_per_cta:
        out.append(
            f"shared memory {need} B (Q, dO {config.stages}x {config.tile_m}x"
            f"{problem.head_dim}, K/V {config.tile_n}x{problem.head_dim}, dS) exceeds {arch.smem_per_cta} B"
        )
    regs = consumer_registers(config, problem)
    if regs > FRAGMENT_REG_BUDGET:
        out.append(
            f"consumer fragments need {regs} registers per thread > {FRAGMENT_REG_BUDGET} "
            "(ptxas allocation at 384 threads): the WGMMAs would be serialized or spill"
        )
    return out


def default_config(problem: Problem, arch: Arch = SM90) -> BwdConfigSm90:
    """Smallest query tile that is feasible, deterministic as the problem asks.

    Unmeasured: the next session has to time tile_m and the stage counts on the H200.
    """
    for tm in (64, 128):
        for st in (2, 1):
            cand = BwdConfigSm90(tile_m=tm, stages=st, deterministic=problem.deterministic)
            if not violations(cand, problem, arch):
                return cand
    return BwdConfigSm90(deterministic=problem.deterministic)
